"""``make demo`` leaves a clean tree: the committed drawings in diagrams/runs/ say what a fresh demo's would.

A change of the table (a row, a guard's description) changes every run's
drawing; committed without them redrawn, ``make demo`` on a fresh clone
rewrites tracked files, and a newcomer's first command leaves git dirty.
The SVG's layout is Graphviz's and may differ between its versions, so
what is compared is what the drawing says: every label and tooltip of a
fresh render's DOT text is in the committed SVG.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from fsm_agent import TABLE
from fsm_agent.cli.demo import scenarios
from fsm_agent.render.dot import to_dot

RUNS = Path(__file__).resolve().parents[2] / "diagrams" / "runs"
_QUOTED = r'="((?:[^"\\]|\\.)*)"'


def _said(dot: str) -> list[str]:
    """Each label and tooltip of ``dot``, as an SVG shows it once unescaped."""
    found = re.findall(r"(?:label|tooltip)" + _QUOTED, dot)
    return [text.replace('\\"', '"').replace("\\n", "\n") for text in found]


@pytest.fixture(scope="module")
def fresh() -> dict[str, str]:
    """Each demo run's drawing as DOT text, by its name: the demo's scenarios run again (scripted, no store)."""
    return {name: to_dot(TABLE, result) for name, result in scenarios()}


@pytest.mark.parametrize("name", ["A_max_steps", "B_repeated_action", "C_max_tokens", "D_tool_failures", "E_done"])
def test_each_committed_run_drawing_says_what_a_fresh_demo_draws(fresh: dict[str, str], name: str) -> None:
    dot = fresh[name]
    drawn = html.unescape((RUNS / f"{name}.svg").read_text(encoding="utf-8"))
    missing = [text for text in _said(dot) if text not in drawn]
    assert missing == [], f"diagrams/runs/{name}.svg is stale: run `make demo` and commit diagrams/runs/"


def test_the_demo_draws_the_runs_committed_and_no_other(fresh: dict[str, str]) -> None:
    assert sorted(fresh) == sorted(path.stem for path in RUNS.glob("*.svg"))
