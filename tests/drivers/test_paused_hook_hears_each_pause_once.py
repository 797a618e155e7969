"""The ``paused`` hook: a run that stops to wait for a person's decision says so, once per pause, on both drivers.

A paused run may be resumed by another agent or process, or never: what an
observer opened for it (a trace's run span) must be closed at the pause,
so the pause is an event, heard right after the transition that made it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, CallEvent, RunResult, ToolRegistry
from fsm_agent.observe.events import HOOK_NAMES
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


def _registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    def send(to: str) -> str:
        """Send a report."""
        return f"sent to {to}"

    @registry.register
    def look(what: str) -> str:
        """Look something up."""
        return what

    return registry


def _agent(*answers: Any) -> Agent:
    return Agent(FakeModel(*answers), _registry(), approve={"send"})


def recorded(agent: Agent) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []
    for name in HOOK_NAMES:
        agent.on(name, lambda event, name=name: seen.append((name, event)))
    return seen


def drive(agent: Agent, driver: str, **keywords: Any) -> RunResult:
    try:
        return agent.run("q", **keywords) if driver == "sync" else asyncio.run(agent.arun("q", **keywords))
    except AgentLoopError as stop:
        return stop.result


def finish(run: Any, driver: str) -> RunResult:
    return run.finish() if driver == "sync" else asyncio.run(run.afinish())


def paused_events(seen: list[tuple[str, Any]]) -> list[CallEvent]:
    return [event for name, event in seen if name == "paused"]


def test_paused_is_a_hook_name() -> None:
    assert "paused" in HOOK_NAMES
    _agent().on("paused", lambda event: None)  # accepted, as every catalogue name is


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_run_that_pauses_says_so_once_after_the_edge_that_paused_it(driver: str) -> None:
    agent = _agent(tool_turn(tool_call("look", id="l1", what="x"), tool_call("send", id="s1", to="ops")))
    seen = recorded(agent)
    result = drive(agent, driver, run_id="r1")
    assert result.reason == "paused"
    (event,) = paused_events(seen)
    assert (event.kind, event.run_id, event.turn) == ("paused", "r1", 1)
    assert event.tool_call is not None
    assert event.tool_call.id == "s1"
    # the last thing hooks hear, after the transition that left the run waiting (the one into ExecuteTool for s1)
    assert seen[-1] == ("paused", event)
    transitions = [e for name, e in seen if name == "transition"]
    assert [(t.source, t.trigger, t.dest) for t in transitions] == [(t.source, t.trigger, t.dest) for t in result.trace]
    assert transitions[-1].dest == "ExecuteTool"
    assert [e.tool_call.id for name, e in seen if name == "after_tool"] == ["l1"]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_run_that_asks_no_decision_never_says_paused(driver: str) -> None:
    agent = _agent(tool_turn(tool_call("look", id="l1", what="x")), reply("done"))
    seen = recorded(agent)
    assert drive(agent, driver).final == "done"
    assert paused_events(seen) == []


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_each_pause_of_a_run_is_heard_once_and_a_resume_to_the_end_adds_none(driver: str) -> None:
    agent = _agent(
        tool_turn(tool_call("send", id="s1", to="ops")),
        tool_turn(tool_call("send", id="s2", to="dev")),
        reply("sent twice"),
    )
    seen = recorded(agent)
    first = drive(agent, driver, run_id="r2")
    assert first.reason == "paused"
    run = agent.resume(first.snapshot, approvals={"s1": True})
    again = finish(run, driver)
    assert again.reason == "paused"
    assert [e.tool_call.id for e in paused_events(seen)] == ["s1", "s2"]
    run.decide({"s2": True})
    assert finish(run, driver).final == "sent twice"
    assert [e.tool_call.id for e in paused_events(seen)] == ["s1", "s2"]
    assert {e.run_id for e in paused_events(seen)} == {"r2"}


def test_a_run_driven_step_by_step_says_paused_at_the_step_that_paused_it() -> None:
    agent = _agent(tool_turn(tool_call("send", id="s1", to="ops")), reply("sent"))
    seen = recorded(agent)
    run = agent.start("q")
    while not run.paused:
        assert paused_events(seen) == []
        run.advance()
    (event,) = paused_events(seen)
    assert event.tool_call is not None
    assert event.tool_call.id == "s1"
    run.decide({"s1": False})
    while not run.done:
        run.advance()
    assert len(paused_events(seen)) == 1
