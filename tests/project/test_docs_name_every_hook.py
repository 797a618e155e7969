"""The hooks catalogue drives the docs: every hook name of ``HOOK_NAMES`` has its row in the watching-runs table.

A hook added to the catalogue (``paused``, say) and not to the table is a
capability nobody reading the docs can find.
"""

from __future__ import annotations

import re
from pathlib import Path

from fsm_agent.observe.events import HOOK_NAMES

WATCHING = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "watching-runs.md"


def _table_names() -> set[str]:
    names: set[str] = set()
    for line in WATCHING.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names.update(re.findall(r"`([^`]+)`", first))
    return names


def test_the_watching_runs_table_names_every_hook_of_the_catalogue() -> None:
    table = _table_names()
    states = {name for name in HOOK_NAMES if ":" in name}
    assert {name for name in HOOK_NAMES if ":" not in name} <= table
    assert {"enter:<State>", "leave:<State>"} <= table  # the state hooks, one row for all of them
    assert states  # and the catalogue has them
    assert not {name for name in table if ":" not in name} - set(HOOK_NAMES)  # no row for a name that is not one
