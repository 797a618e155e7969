"""The README's exactly-once promise states its condition: a store written ``every="call"`` or ``"transition"``.

With ``every="turn"`` (a documented setting of both stores) a crash after the first of a turn's tool calls
and before the next model call runs that completed call again. The README and docs/concepts/exactly-once.md
say so; these tests hold both pages to what the checker proves of each setting.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fsm_agent
from fsm_agent.testing import FakeModel, demo_registry

ROOT = Path(__file__).resolve().parents[2]
CLAIM = "never repeats a completed tool call"


def _flat(path: Path) -> str:
    return " ".join(path.read_text(encoding="utf-8").split())


def test_the_readme_states_the_claim_with_its_condition_and_its_exception() -> None:
    readme = _flat(ROOT / "README.md")
    claim = readme.index(CLAIM)
    sentence = readme[readme.rindex(". ", 0, claim) : readme.index(". ", claim)]
    assert '(the default `every="call"`, or `every="transition"`)' in sentence
    assert 'with `every="turn"` a crash can run a completed call of its turn again' in sentence
    assert "(docs/concepts/exactly-once.md#checkpoints-every)" in sentence


def test_the_exactly_once_page_says_every_turn_gives_the_promise_up() -> None:
    page = _flat(ROOT / "docs" / "concepts" / "exactly-once.md")
    assert 'with the store\'s default `every="call"` or with `every="transition"`' in page
    assert "runs the completed call again on resume" in page
    assert "Whichever is chosen" not in page


@pytest.mark.parametrize("every", ["transition", "call"])
def test_the_claim_holds_for_the_default_and_per_transition_writes(every: str) -> None:
    agent = fsm_agent.Agent(FakeModel(), demo_registry())
    assert fsm_agent.check(agent, every=every).crash_safe


def test_the_claim_does_not_hold_with_every_turn_as_the_readme_says() -> None:
    agent = fsm_agent.Agent(FakeModel(), demo_registry())
    proof = fsm_agent.check(agent, every="turn")
    assert not proof.crash_safe
    assert proof.crash_counterexample[-1].source == "ExecuteTool"
