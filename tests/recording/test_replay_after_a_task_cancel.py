"""Replaying a stored run whose task was cancelled mid-call (a bare ``task.cancel()``, no token), then resumed.

The source runs on the async driver into a real store (SQLite, then
PostgreSQL): its task is cancelled while a tool call is in flight, resumed,
cancelled again while a model call is in flight, and resumed to its end (the
last resume on the sync or the async driver).  Its trace holds two
``cancelled`` stops on ``interrupted`` edges.  The replay (``replay`` and
``areplay``) must reach the same end on the same trace, cutting the same two
calls, with no model called and no tool run: the model counts every call it
is asked, the tool every run by call id.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import (
    Agent,
    CancelToken,
    Message,
    ModelResponse,
    RunContext,
    RunResult,
    ToolRegistry,
    Transition,
    Usage,
)
from fsm_agent.core.snapshot import message_of
from fsm_agent.persist import open_store
from fsm_agent.persist.recording import RecordingError
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.testing.replay import areplay, replay
from fsm_agent.tools import JSONSchema

# Generous: each wait is for work of milliseconds (measured under 5 ms idle and beside two CPU hogs), 30 s is 6000x.
WAIT = 30.0


class HeldModel:
    """A scripted model that counts the calls it is asked; the ``hold_at``-th one (async) waits until cancelled."""

    def __init__(self, script: Sequence[ModelResponse], hold_at: int | None = None) -> None:
        self.script = list(script)
        self.hold_at = hold_at
        self.asked = 0
        self.answered = 0
        self.entered = asyncio.Event()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.asked += 1
        return self._next()

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.asked += 1
        if self.asked == self.hold_at:
            self.entered.set()
            await asyncio.Event().wait()  # cut here by the test's task.cancel()
        return self._next()

    def _next(self) -> ModelResponse:
        if self.answered >= len(self.script):
            msg = f"the script holds {len(self.script)} replies; call {self.asked} asked for another"
            raise AssertionError(msg)
        self.answered += 1
        return self.script[self.answered - 1]


class HeldTool:
    """``lookup(x)``, counting its runs by call id; its first run of ``hold`` blocks (on a worker) until released."""

    def __init__(self, hold: str | None = None) -> None:
        self.ran: Counter[str] = Counter()
        self.hold = hold
        self.entered = threading.Event()
        self.gate = threading.Event()

    def registry(self) -> ToolRegistry:
        registry = ToolRegistry()

        @registry.register
        def lookup(x: int, ctx: RunContext[None]) -> str:
            """Look a number up."""
            call_id = str(ctx.call_id)
            self.ran[call_id] += 1
            if call_id == self.hold and self.ran[call_id] == 1:
                self.entered.set()
                self.gate.wait(WAIT)  # the run's task is cancelled meanwhile; this result reaches nobody
            return f"found {x}"

        return registry


U = Usage(10, 3)
SCRIPT = [
    tool_turn(tool_call("lookup", id="c1", x=1), usage=U),
    tool_turn(tool_call("lookup", id="c2", x=2), usage=U),
    reply("found 1 and 2", usage=U),
]
"""c1 (cut in flight, made again after the resume), a model call cut in flight (the second), c2, the answer."""


async def _cut(task: asyncio.Task[Any], entered: Any) -> None:
    """Cancel ``task`` once ``entered`` (an asyncio or a threading event) is set; the task ends on CancelledError."""
    if isinstance(entered, asyncio.Event):
        await asyncio.wait_for(entered.wait(), WAIT)
    else:
        assert await asyncio.to_thread(entered.wait, WAIT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def recorded(store_target: str, last: str) -> tuple[dict[str, Any], RunResult, HeldModel, HeldTool]:
    """The source: cut in tool call c1, resumed, cut in its second model call, resumed on ``last`` to the end."""
    model, tool = HeldModel(SCRIPT, hold_at=2), HeldTool(hold="c1")
    agent = Agent(model, tool.registry())
    with open_store(store_target) as store:

        async def cut_twice() -> None:
            await _cut(asyncio.create_task(agent.arun("find 1 and 2", store=store, run_id="src")), tool.entered)
            tool.gate.set()
            resumed = await agent.aresume(store.load("src"), store=store, cancel=CancelToken())
            await _cut(asyncio.create_task(resumed.afinish()), model.entered)

        asyncio.run(cut_twice())
        if last == "sync":
            result = agent.resume(store.load("src"), store=store, cancel=CancelToken()).finish()
        else:
            result = asyncio.run(_aresumed(agent, store))
        return store.export("src"), result, model, tool


async def _aresumed(agent: Agent, store: Any) -> RunResult:
    return await (await agent.aresume(store.load("src"), store=store, cancel=CancelToken())).afinish()


def cuts(trace: Sequence[Transition]) -> list[tuple[int, str]]:
    """Where a trace's ``interrupted`` edges are, and the state each left."""
    return [(i, t.source) for i, t in enumerate(trace) if t.trigger == "interrupted"]


def steps_of(result: RunResult) -> list[tuple[int, str, str, Any]]:
    """Each step's turn, kind, detail and turns counted (its seconds are the clock's, which a replay stops)."""
    return [(s.index, s.kind, s.detail, s.counters["steps"]) for s in result.steps]


@pytest.mark.parametrize("last", ["sync", "async"])
def test_a_run_cut_in_a_tool_call_and_in_a_model_call_replays_to_its_end_calling_nothing(
    store_target: str, last: str
) -> None:
    """Both cuts are replayed as cuts, both resumes as resumes: same trace, answer, steps and usage; zero calls."""
    recording, source, model, tool = recorded(store_target, last)
    assert (source.reason, source.final) == ("done", "found 1 and 2")
    assert cuts(source.trace) == [(3, "ExecuteTool"), (7, "AwaitModel")]
    assert tool.ran == Counter({"c1": 2, "c2": 1})  # c1 cut in flight, made again by the resume
    assert (model.asked, model.answered) == (4, 3)  # the second call cut in flight, asked again by the resume
    for run in (replay, lambda *a: asyncio.run(areplay(*a))):
        replay_model, replay_tool = HeldModel([]), HeldTool()
        result = run(Agent(replay_model, replay_tool.registry()), recording)
        assert (result.reason, result.final) == ("done", "found 1 and 2")
        assert result.trace == source.trace
        assert result.messages == source.messages
        assert steps_of(result) == steps_of(source)
        assert result.usage == source.usage
        assert (replay_model.asked, sum(replay_tool.ran.values())) == (0, 0)


def test_a_recording_that_ends_on_a_cut_model_call_replays_to_that_stop(store_target: str) -> None:
    """Cut in flight and never resumed: the replay stops ``cancelled`` on the same edge, the call counted as made."""
    model, tool = HeldModel(SCRIPT, hold_at=2), HeldTool()
    agent = Agent(model, tool.registry())
    with open_store(store_target) as store:
        asyncio.run(_cut_run(agent, store, model.entered))
        recording, stored = store.export("src"), store.load("src")
    assert (stored["state"], stored["reason"]) == ("Failed", "cancelled")
    trace = tuple(Transition(**t) for t in recording["trace"])
    assert cuts(trace) == [(len(trace) - 1, "AwaitModel")]
    for run in (replay, lambda *a: asyncio.run(areplay(*a))):
        replay_model, replay_tool = HeldModel([]), HeldTool()
        result = run(Agent(replay_model, replay_tool.registry()), recording)
        assert (result.reason, result.trace) == ("cancelled", trace)
        assert result.evidence["unfinished"] == stored["evidence"]["unfinished"] == "model call of turn 2"
        assert (replay_model.asked, sum(replay_tool.ran.values())) == (0, 0)
    assert (model.asked, tool.ran) == (2, Counter({"c1": 1}))


async def _cut_run(agent: Agent, store: Any, entered: Any, gate: threading.Event | None = None) -> None:
    """The source started and its task cancelled once ``entered`` is set; then ``gate`` let go (its result lost)."""
    await _cut(asyncio.create_task(agent.arun("find 1 and 2", store=store, run_id="src")), entered)
    if gate is not None:
        gate.set()


def test_a_batch_cut_after_one_of_its_calls_came_back_replays_to_its_end(store_target: str) -> None:
    """Two calls of one turn, one back and one in flight at the cut: the resume makes only the second; so the replay."""
    script = [
        tool_turn(tool_call("lookup", id="c1", x=1), tool_call("lookup", id="c2", x=2), usage=U),
        reply("found 1 and 2", usage=U),
    ]
    model, tool = HeldModel(script), HeldTool(hold="c2")
    agent = Agent(model, tool.registry())
    with open_store(store_target) as store:
        asyncio.run(_cut_run(agent, store, tool.entered, tool.gate))
        at_the_cut, cut = store.export("src"), store.load("src")
        source = asyncio.run(_aresumed(agent, store))
        recording = store.export("src")
    assert tool.ran == Counter({"c1": 1, "c2": 2})
    assert cuts(source.trace) == [(3, "ExecuteTool")]
    assert (cut["evidence"]["also_ran"], cut["evidence"]["unfinished"]) == (["c1"], "c2")
    for run in (replay, lambda *a: asyncio.run(areplay(*a))):  # the recording as it was at the cut: it ends there
        replay_model, replay_tool = HeldModel([]), HeldTool()
        stopped = run(Agent(replay_model, replay_tool.registry()), at_the_cut)
        assert (stopped.reason, stopped.trace) == ("cancelled", source.trace[:4])
        assert (stopped.evidence["also_ran"], stopped.evidence["unfinished"]) == (["c1"], "c2")
        assert stopped.messages == tuple(message_of(m) for m in cut["messages"])
        assert (replay_model.asked, sum(replay_tool.ran.values())) == (0, 0)
    for run in (replay, lambda *a: asyncio.run(areplay(*a))):
        replay_model, replay_tool = HeldModel([]), HeldTool()
        result = run(Agent(replay_model, replay_tool.registry()), recording)
        assert (result.reason, result.final, result.trace) == ("done", "found 1 and 2", source.trace)
        assert result.messages == source.messages
        assert (replay_model.asked, sum(replay_tool.ran.values())) == (0, 0)


def test_a_recording_whose_unfinished_is_no_text_is_refused_naming_the_field(tmp_path: Any) -> None:
    """``unfinished`` (what the last stop cut off) is text or null: anything else is a RecordingError, nothing run."""
    model, tool = HeldModel(SCRIPT, hold_at=2), HeldTool()
    with open_store(str(tmp_path / "runs.db")) as store:
        asyncio.run(_cut_run(Agent(model, tool.registry()), store, model.entered))
        recording = store.export("src")
    assert recording["unfinished"] == "model call of turn 2"
    replay_model, replay_tool = HeldModel([]), HeldTool()
    with pytest.raises(RecordingError, match="recording field unfinished must be a string or null, got int"):
        replay(Agent(replay_model, replay_tool.registry()), {**recording, "unfinished": 2})
    assert (replay_model.asked, sum(replay_tool.ran.values())) == (0, 0)


def test_a_replay_that_departed_before_a_recorded_cut_is_not_cut_there(store_target: str) -> None:
    """Re-recording (``strict=False``) past a changed prompt: the live run goes on whole, its calls made once each."""
    recording, _, _, _ = recorded(store_target, "async")
    live, replay_tool = HeldModel(SCRIPT), HeldTool()
    changed = Agent(HeldModel([]), replay_tool.registry(), system="You look numbers up.")
    fresh = replay(changed, recording, strict=False, model=live)
    trace = [Transition(**entry) for entry in fresh["trace"]]
    assert (fresh["reason"], fresh["final"], cuts(trace)) == ("done", "found 1 and 2", [])
    assert (live.asked, replay_tool.ran) == (3, Counter())  # each call's id and arguments are recorded: none ran
