"""``Proof.reachable`` and ``dead_rows``: endings the stop-path scripts leave out, reached for real."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from fsm_agent import Agent, AgentLoopError, CancelToken, ToolRegistry
from fsm_agent.proof import check
from fsm_agent.records import Message, ModelResponse, RunResult
from fsm_agent.testing import CounterModel, FakeModel, demo_registry, edge_id, reply, tool_call, tool_turn


def _ended(run: object) -> RunResult:
    try:
        return run()  # type: ignore[operator]
    except AgentLoopError as stop:
        return stop.result


def _held_to(proof: object, result: RunResult) -> None:
    last = result.trace[-1]
    assert (last.reason or "done") in proof.reachable  # type: ignore[attr-defined]
    assert not {row.entry for row in proof.dead_rows} & set(result.trace)  # type: ignore[attr-defined]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_child_stopped_is_reachable_and_reached(driver: str) -> None:
    """A sub-agent that passes its stop on: the proof says child_stopped is reachable, and a real run ends so."""
    child = Agent(CounterModel(), demo_registry(), max_steps=1)
    registry = demo_registry()
    registry.register(child.as_tool("helper", "asks a helper", on_child_stop="raise"))
    script = (tool_turn(tool_call("helper", input="go")), reply("never"))
    agent = Agent(FakeModel(*script), registry)
    proof = check(agent)
    assert "child_stopped" in proof.reachable
    result = _ended(lambda: agent.run("q")) if driver == "sync" else _ended(lambda: asyncio.run(agent.arun("q")))
    assert edge_id(result.trace[-1]) == "ExecuteTool->Failed[child_stopped]"
    _held_to(proof, result)


def test_a_task_cancelled_while_the_model_call_is_in_flight_ends_on_a_reachable_row() -> None:
    """The async task is cancelled during the model call: AwaitModel->Failed[cancelled] on interrupted."""
    started = threading.Event()
    release = threading.Event()

    class Slow:
        def complete(self, messages: object, tools: object) -> ModelResponse:
            started.set()
            release.wait(5)
            return reply("late")

    agent = Agent(Slow(), demo_registry())
    proof = check(agent)

    async def go() -> RunResult:
        arun = await agent.astart("q")
        task = asyncio.ensure_future(arun.afinish())
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        release.set()
        return arun.result

    result = asyncio.run(go())
    last = result.trace[-1]
    assert (last.source, last.trigger, last.reason) == ("AwaitModel", "interrupted", "cancelled")
    _held_to(proof, result)


def test_a_token_cancelled_by_a_tool_stops_before_the_next_call() -> None:
    """A tool cancels the run's token in the middle of a turn: Dispatch->Failed[cancelled], reachable."""
    token = CancelToken()
    registry = ToolRegistry()

    def stop_all(why: str) -> str:
        """Cancels the run."""
        token.cancel(why)
        return "ok"

    registry.register(stop_all)
    turn = tool_turn(tool_call("stop_all", why="enough"), tool_call("stop_all", why="again"))
    agent = Agent(FakeModel(turn, reply("never")), registry)
    proof = check(agent, calls_per_reply=2)
    result = _ended(lambda: agent.run("q", cancel=token))
    assert edge_id(result.trace[-1]) == "Dispatch->Failed[cancelled]"
    _held_to(proof, result)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_finalized_run_ends_on_a_reachable_edge_and_keeps_its_stop_as_reason(driver: str) -> None:
    """``reachable`` names the edges runs end on: a finalized run ends on ``done``, its reason the stop that asked."""

    class Counter(CounterModel):
        def complete(self, messages: list[Message], tools: object) -> ModelResponse:  # type: ignore[override]
            return reply("counted") if not tools else super().complete(messages, tools)  # type: ignore[arg-type]

    agent = Agent(Counter(), demo_registry(), max_steps=2, on_stop={"max_steps": "finalize"})
    proof = check(agent)
    result = agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    assert result.final == "counted"
    assert result.reason == "max_steps"
    assert (result.trace[-1].reason or "done") in proof.reachable
    assert "max_steps" in proof.unreachable  # no run ends on the max_steps edge: the policy finalizes instead
