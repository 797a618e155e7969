"""What a replay checks of a recording made before it kept whether each call waited for a person (``held``).

test-from-recordings.md: ``held`` is an optional field of recording version 1,
so an older recording still loads and replays; it is checked on its rejected
calls only (their answers say a person rejected them).  A malformed ``held``
is a ``RecordingError`` naming the field.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.by_turn import ByTurn

from fsm_agent import Agent, SqliteStore, ToolRegistry
from fsm_agent.persist.recording import RecordingError
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.testing.replay import ReplayDivergence, replay


def counted(made: Counter[str]) -> ToolRegistry:
    tools = ToolRegistry()

    def charge(amount: int) -> str:
        """Charge the customer's card: an effect in the world."""
        made[f"charge {amount}"] += 1
        return f"charged {amount}"

    tools.register(charge)
    return tools


SCRIPT = [tool_turn(tool_call("charge", id="c1", amount=5)), reply("done")]


def _recorded(tmp_path: Path, decision: bool | str) -> dict[str, Any]:
    """A run whose charge waited for a person, who gave ``decision``, exported."""
    with SqliteStore(tmp_path / "runs.db") as store:
        agent = Agent(ByTurn(SCRIPT), counted(Counter()), approve={"charge"})
        agent.run("charge me", store=store, run_id="r")
        agent.resume(store.load("r"), store=store, approvals={"c1": decision}).finish()
        return store.export("r")


def _older(recording: dict[str, Any]) -> dict[str, Any]:
    """The recording as a release before ``held`` exported it."""
    older = copy.deepcopy(recording)
    for call in older["tool_calls"]:
        call.pop("held", None)
    return older


def test_an_approved_call_of_an_older_recording_replays_whatever_the_agent_s_approve(tmp_path: Path) -> None:
    """Without ``held`` nothing says the call waited: an agent without approve= replays it green, as before."""
    recording = _recorded(tmp_path, True)
    assert [call["held"] for call in recording["tool_calls"]] == [True]
    made: Counter[str] = Counter()
    with pytest.raises(ReplayDivergence):
        replay(Agent(FakeModel(), counted(made)), recording)
    assert replay(Agent(FakeModel(), counted(made)), _older(recording)).final == "done"
    assert dict(made) == {}


def test_a_rejected_call_departs_by_its_answer_in_an_older_recording_too(tmp_path: Path) -> None:
    """The rejection is in the answer the model read: an agent that no longer holds the call departs, naming it."""
    recording = _older(_recorded(tmp_path, "too much"))
    made: Counter[str] = Counter()
    assert replay(Agent(FakeModel(), counted(made), approve={"charge"}), recording).final == "done"
    with pytest.raises(ReplayDivergence) as departed:
        replay(Agent(FakeModel(), counted(made)), recording)
    assert "rejected (too much)" in departed.value.diff
    assert "'c1' (charge)" in departed.value.diff
    assert dict(made) == {}


def test_a_held_that_is_no_boolean_is_a_recording_error(tmp_path: Path) -> None:
    """``held`` is true, false or null: anything else is refused before anything runs, the field named."""
    recording = _recorded(tmp_path, True)
    recording["tool_calls"][0]["held"] = "yes"
    with pytest.raises(RecordingError, match=r"tool_calls\[0\]\.held"):
        replay(Agent(FakeModel(), counted(Counter()), approve={"charge"}), recording)
