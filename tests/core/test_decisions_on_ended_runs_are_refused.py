"""A decision that reaches a run after it ended (finished in Done, or stopped) is refused, and changes nothing.

A live run handle took a decision on a stopped run's held-back pending call
and kept it in the stopped run (a store refused the same decision on the
same run as "not paused"), and on a finished run it said the call was "not
pending", as if the id were wrong.  Now both refuse it with a ``ValueError``
saying the run ended, how, and what became of each call (the words of
``core.late_decisions``), the run left as it was; a stopped run's pending
calls are decided by giving the decisions to the resume that lifts its stop.
A store says the run ended too.  Real runs on both drivers; every tool
execution is counted by call id.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, AgentRun, DecisionError, SqliteStore, ToolRegistry
from fsm_agent.core import snapshot
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


def _registry(ran: Counter[str]) -> ToolRegistry:
    """``send`` (held back by the agents here) and ``note``, each counting its executions by call id."""
    tools = ToolRegistry()

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a note to someone."""
        ran[call_id] += 1
        return f"sent to {to}"

    @tools.register
    def note(text: str, call_id: str) -> str:
        """Write a note."""
        ran[call_id] += 1
        return "noted"

    return tools


def _finish(run: AgentRun, driver: str) -> None:
    try:
        run.finish() if driver == "sync" else asyncio.run(run.afinish())
    except Exception:  # noqa: BLE001 - a stop: the run handle holds it
        assert run.done


def _stopped(ran: Counter[str], driver: str, **run_options: Any) -> tuple[Agent, AgentRun]:
    """A run stopped ``max_tool_calls`` after ``n1``, with ``s1`` (held back for a decision) left pending."""
    calls = (tool_call("note", id="n1", text="x"), tool_call("send", id="s1", to="ops"))
    agent = Agent(FakeModel(tool_turn(*calls), reply("done")), _registry(ran), approve={"send"}, max_tool_calls=1)
    run = agent.start("q", **run_options)
    _finish(run, driver)
    assert run.reason == "max_tool_calls"
    assert [call.id for call in run.pending] == ["s1"]
    return agent, run


def _finished(ran: Counter[str], driver: str) -> AgentRun:
    """A run that paused on ``s1``, was approved, made it and finished in Done."""
    model = FakeModel(tool_turn(tool_call("send", id="s1", to="ops")), reply("done"))
    agent = Agent(model, _registry(ran), approve={"send"})
    run = agent.start("q")
    _finish(run, driver)
    run.decide({"s1": True})
    _finish(run, driver)
    assert run.reason == "done"
    return run


def _as_stored(run: AgentRun) -> str:
    """The run's whole position as its snapshot holds it (read without the clock ``snapshot()`` reads)."""
    return json.dumps(snapshot.dump(run.position), sort_keys=True, default=str)


# --- a live run handle ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decision", [True, False, "not now"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_decision_on_a_stopped_run_is_refused_and_the_run_keeps_none(driver: str, decision: bool | str) -> None:
    ran: Counter[str] = Counter()
    _, run = _stopped(ran, driver)
    before = _as_stored(run)
    with pytest.raises(ValueError, match=r"the run already stopped \('max_tool_calls'\)") as info:
        run.decide({"s1": decision})
    assert "tool call 's1' was never made" in str(info.value)
    assert "agent.resume" in str(info.value)  # where the decision goes instead
    assert run.position.calls.approvals == {}
    assert _as_stored(run) == before
    assert ran == Counter({"n1": 1})


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_decision_on_a_finished_run_is_refused_saying_what_became_of_the_call(driver: str) -> None:
    ran: Counter[str] = Counter()
    run = _finished(ran, driver)
    before = _as_stored(run)
    with pytest.raises(ValueError, match="the run already finished in Done") as info:
        run.decide({"s1": False})
    assert "tool call 's1' was already approved and made" in str(info.value)
    assert _as_stored(run) == before
    assert ran == Counter({"s1": 1})


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stopped_runs_pending_call_is_decided_by_the_resume_that_lifts_the_stop(driver: str) -> None:
    """The way the refusal points to: the rejection given to ``resume`` holds, and the call never runs."""
    ran: Counter[str] = Counter()
    agent, run = _stopped(ran, driver)
    resumed = agent.resume(run.result, approvals={"s1": "not now"}, max_tool_calls=5)
    _finish(resumed, driver)
    assert resumed.reason == "done"
    assert ran == Counter({"n1": 1})


def test_a_wrong_value_on_an_ended_run_is_still_a_type_error_first() -> None:
    """A wrong value is the caller's mistake whatever the run's state: a ``TypeError``, as on a live run."""
    _, run = _stopped(Counter(), "sync")
    with pytest.raises(TypeError, match="must be True, False or a reason text"):
        run.decide({"s1": 1})  # type: ignore[dict-item]


# --- a stored run -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_store_refuses_a_decision_on_a_stopped_run_saying_it_ended_and_writes_nothing(
    tmp_path: Path, driver: str
) -> None:
    with SqliteStore(tmp_path / "runs.db") as store:
        _stopped(Counter(), driver, store=store, run_id="r1")
        before = store.load("r1")
        with pytest.raises(DecisionError, match=r"it already ended \(Failed, reason 'max_tool_calls'\)"):
            store.decide("r1", "s1", True)
        assert store.load("r1") == before
