"""The README's proof block is what ``check`` proves of a default ``Agent(model, tools)``, row by row.

``make diagram`` runs ``check fsm_agent:TABLE``, which assumes every part an agent could have (hooks, a typed
answer, sub-agents) and so reaches more stops; the block says what it is of and the command that prints each
row (``check yourmodule:make_agent --calls-per-reply N``), and does not name ``make diagram`` as its proof.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fsm_agent
from fsm_agent.testing import FakeModel, demo_registry

ROOT = Path(__file__).resolve().parents[2]


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _readme_lists() -> tuple[list[str], list[str]]:
    readme = _readme()
    reachable = re.search(r"Reachable stops: (.*?)\. Not reachable", readme, re.S)
    unreachable = re.search(r"Not reachable without the part or limit that makes them: (.*?)\.\n", readme, re.S)
    assert reachable, "README.md no longer states the reachable stops"
    assert unreachable, "README.md no longer states the unreachable stops"
    return re.findall(r"`(\w+)`", reachable[1]), re.findall(r"`(\w+)`", unreachable[1])


def _default_agent() -> fsm_agent.Agent:
    return fsm_agent.Agent(FakeModel(), demo_registry())


def test_the_readme_stops_are_what_check_proves_of_a_default_agent() -> None:
    """The README's lists are those of an agent with default settings."""
    proof = fsm_agent.check(_default_agent())
    assert (list(proof.reachable), list(proof.unreachable)) == _readme_lists()


def test_the_block_says_what_it_is_and_how_to_reproduce_it() -> None:
    """It names the default agent and the command, and no longer credits `make diagram`'s check of the table."""
    block = re.search(r"<!-- proof:start -->\n(.*?)<!-- proof:end -->", _readme(), re.S)
    assert block
    assert "What the checker proves of a default `Agent(model, tools)`" in block[1]
    assert "`python -m fsm_agent check yourmodule:make_agent --calls-per-reply N`" in block[1]
    assert "make diagram" not in block[1]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_each_row_is_what_check_proves_with_that_many_calls_per_reply(n: int) -> None:
    """`check yourmodule:make_agent --calls-per-reply N` of a default agent proves the row's bound."""
    rows = dict(re.findall(r"^\| (\d+) \| (\d+) \|$", _readme(), re.M))
    proof = fsm_agent.check(_default_agent(), calls_per_reply=n)
    assert proof.bound == int(rows[str(n)])
    assert proof.model_calls == int(re.search(r"after at most \*\*(\d+) model calls\*\*", _readme())[1])


def test_a_bare_table_is_checked_with_every_part_so_it_reaches_more_stops() -> None:
    """Why the block is not `check fsm_agent:TABLE` (what `make diagram` runs): that reaches stops the block lists
    as not reachable without their part."""
    proof = fsm_agent.check(fsm_agent.TABLE)
    _, unreachable = _readme_lists()
    assert {"hook_error", "output_invalid", "child_stopped"} <= set(proof.reachable) & set(unreachable)
