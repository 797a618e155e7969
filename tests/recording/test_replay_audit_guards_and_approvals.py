"""Replaying recordings of runs that guardrails stopped or people decided: the same ending, or a named departure.

test-from-recordings.md: "an unchanged agent replays without calling its
model or a single tool; a changed prompt, tool, limit or answer type fails
the test at the exact transition where the run departs".  Guardrails and
approval rules are part of the agent under test too: an answer check taken
away, or a call no longer held for a person, is a change a regression test
must not pass in silence.  Every tool counts its executions.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.by_turn import ByTurn

from fsm_agent import Agent, AgentLoopError, RunView, SqliteStore, StopCondition, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.testing.replay import ReplayDivergence, areplay, replay

DRIVERS = ["sync", "async"]


def counted(made: Counter[str]) -> ToolRegistry:
    tools = ToolRegistry()

    def charge(amount: int) -> str:
        """Charge the customer's card: an effect in the world."""
        made[f"charge {amount}"] += 1
        return f"charged {amount}"

    tools.register(charge)
    return tools


def replayed(agent: Agent, recording: dict[str, Any], driver: str) -> Any:
    return replay(agent, recording) if driver == "sync" else asyncio.run(areplay(agent, recording))


def _asks_for_a_password(view: RunView) -> bool:
    return "password" in view.messages[-1].content


def _leaks_a_key(view: RunView) -> bool:
    return view.last_response is not None and "sk-" in view.last_response.message.content


GUARDS = [
    StopCondition("unsafe_input", "input", _asks_for_a_password, "the input asks for a password", policy="return"),
    StopCondition("leaked_key", "answer", _leaks_a_key, "the answer holds an API key", policy="return"),
]
CHARGE_THEN_LEAK = [tool_turn(tool_call("charge", id="c1", amount=5)), reply("charged; your key is sk-123")]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("question", "stop", "departs_at"),
    [("the admin password?", "unsafe_input", 0), ("charge me", "leaked_key", 6)],
    ids=["input", "answer"],
)
def test_a_guardrail_stop_replays_as_recorded_and_without_the_guardrail_departs_at_its_edge(
    tmp_path: Path, driver: str, question: str, stop: str, departs_at: int
) -> None:
    """The guarded agent replays to the recorded stop with no call; the agent without guards departs at its edge."""
    made: Counter[str] = Counter()
    with SqliteStore(tmp_path / "runs.db") as store:
        original = Agent(ByTurn(CHARGE_THEN_LEAK), counted(made), stop_conditions=GUARDS).run(
            question, store=store, run_id="r"
        )
        recording = store.export("r")
    assert original.reason == stop
    made.clear()
    unused = FakeModel()
    result = replayed(Agent(unused, counted(made), stop_conditions=GUARDS), recording, driver)
    assert (result.reason, result.trace, result.final, result.usage) == (
        original.reason,
        original.trace,
        original.final,
        original.usage,
    )
    assert (dict(made), unused.seen) == ({}, [])
    with pytest.raises(ReplayDivergence) as departed:
        replayed(Agent(unused, counted(made)), recording, driver)
    assert departed.value.index == departs_at
    assert departed.value.expected == original.trace[departs_at]
    assert departed.value.expected.reason == stop
    assert f"Failed[{stop}]" in str(departed.value)
    assert (dict(made), unused.seen) == ({}, [])


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("change", ["no-longer-held", "newly-held"])
def test_an_agent_whose_approval_rule_changed_departs_from_its_recording(
    tmp_path: Path, driver: str, change: str
) -> None:
    """The recorded run held ``charge`` for a person (or did not); the replayed agent does the opposite."""
    recorded_careful = change == "no-longer-held"
    script = [tool_turn(tool_call("charge", id="c1", amount=5)), reply("charged")]
    made: Counter[str] = Counter()
    with SqliteStore(tmp_path / "runs.db") as store:
        agent = Agent(ByTurn(script), counted(made), approve={"charge"} if recorded_careful else None)
        first = agent.run("charge me", store=store, run_id="r")
        if recorded_careful:
            assert first.reason == "paused"
            first = agent.resume(store.load("r"), store=store, approvals={"c1": True}).finish()
        assert (first.final, dict(made)) == ("charged", {"charge 5": 1})
        recording = store.export("r")
    made.clear()
    changed = Agent(FakeModel(), counted(made), approve=None if recorded_careful else {"charge"})
    try:
        replayed(changed, recording, driver)
    except AgentLoopError as stop:  # not what a replay should raise either
        pytest.fail(f"the replay stopped instead of departing: {stop}")
    except ReplayDivergence:
        pass
    else:
        pytest.fail("the replay passed although the agent's approval rule changed")
    assert dict(made) == {}
