"""What a reader of ``stream``/``astream`` (or a ``text`` hook) gets: each piece and edge once, in order, no call again.

A scripted model streams each reply word by word; each tool counts its
executions.  Readers that read to the end, stop early, raise, or cancel
must see every piece of text before the edge taking its reply in, and no
tool may run twice or after the reader left.  A broken stream, a strict
text hook that raises, and a run paused for approval are read the same way
``run()`` would end them.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import (
    Agent,
    AgentLoopError,
    CancelToken,
    RunResult,
    SqliteStore,
    TextDelta,
    ToolRegistry,
    TransitionEvent,
)
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class Typist(FakeModel):
    """Streams each reply's text word by word, then returns the whole reply."""

    def complete_stream(self, messages: Any, tools: Any, on_text: Callable[[str], object], **keywords: Any) -> Any:
        response = self.complete(messages, tools, **keywords)
        for word in re.findall(r"\S+\s*", response.message.content):
            on_text(word)
        return response

    async def acomplete_stream(self, messages: Any, tools: Any, on_text: Any, **keywords: Any) -> Any:
        response = self.complete(messages, tools, **keywords)
        for word in re.findall(r"\S+\s*", response.message.content):
            on_text(word)
            await asyncio.sleep(0)  # the reader may run between two pieces
        return response


class Stalls(FakeModel):
    """Streams one piece of its reply, then waits for ever (until cancelled)."""

    def complete_stream(self, messages: Any, tools: Any, on_text: Any, **keywords: Any) -> Any:
        raise NotImplementedError  # the async reader's test only

    async def acomplete_stream(self, messages: Any, tools: Any, on_text: Any, **keywords: Any) -> Any:
        self.complete(messages, tools, **keywords)
        on_text("first ")
        await asyncio.Event().wait()
        raise AssertionError  # never reached


class Breaks(FakeModel):
    """Streams two pieces, then the connection breaks."""

    def complete_stream(self, messages: Any, tools: Any, on_text: Any, **keywords: Any) -> Any:
        self.complete(messages, tools, **keywords)  # counted as a call
        on_text("half of ")
        on_text("it")
        raise ConnectionError("stream reset")

    async def acomplete_stream(self, messages: Any, tools: Any, on_text: Any, **keywords: Any) -> Any:
        return self.complete_stream(messages, tools, on_text, **keywords)


class Counted:
    """A registry whose one tool, ``bump``, counts how often it ran for each key."""

    def __init__(self) -> None:
        self.ran: dict[str, int] = {}
        self.registry = ToolRegistry()

        @self.registry.register
        def bump(key: str) -> str:
            """Count one execution of ``key``."""
            self.ran[key] = self.ran.get(key, 0) + 1
            return f"bumped {key}"


def two_tool_script() -> list[Any]:
    return [
        tool_turn(tool_call("bump", id="a", key="a"), tool_call("bump", id="b", key="b"), content="Two calls now."),
        tool_turn(tool_call("bump", id="c", key="c"), content="One more call."),
        reply("All done here, thanks."),
    ]


def read(agent: Agent, driver: str, question: str = "q", **keywords: Any) -> list[TransitionEvent | TextDelta]:
    """Every event of ``stream`` (sync) or ``astream`` (async), read to the end."""
    if driver == "sync":
        return list(agent.stream(question, **keywords))

    async def collect() -> list[TransitionEvent | TextDelta]:
        return [event async for event in agent.astream(question, **keywords)]

    return asyncio.run(collect())


def run_to_the_end(agent: Agent, way: str, **keywords: Any) -> object:
    """``run`` (way "run" or "sync"), ``arun``, or ``stream``/``astream`` read to the end."""
    if way in ("run", "sync"):
        return agent.run("q", **keywords)
    if way == "arun":
        return asyncio.run(agent.arun("q", **keywords))
    return read(agent, "sync" if way == "stream" else "async", **keywords)


def stream_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("fsm_agent stream")]


@pytest.mark.parametrize("driver", DRIVERS)
def test_each_piece_and_edge_reaches_the_reader_once_and_in_order(driver: str) -> None:
    tools = Counted()
    agent = Agent(Typist(*two_tool_script()), tools.registry)
    events = read(agent, driver)
    last = events[-1]
    assert isinstance(last, TransitionEvent)
    result = last.result
    assert result is not None
    assert result.ok
    assert tools.ran == {"a": 1, "b": 1, "c": 1}
    # Edges: each once, numbered 0, 1, 2, ... in order, equal to the result's trace.
    edges = [event for event in events if isinstance(event, TransitionEvent)]
    assert [event.seq for event in edges] == list(range(len(result.trace)))
    assert [(e.source, e.dest) for e in edges] == [(str(t.source), str(t.dest)) for t in result.trace]
    # Text: joined per turn, each assistant message exactly; the last joined turn is the answer.
    joined: dict[int, str] = {}
    for event in events:
        if isinstance(event, TextDelta):
            joined[event.turn] = joined.get(event.turn, "") + event.text
    assistants = [m.content for m in result.messages if m.role == "assistant"]
    assert [joined[turn] for turn in sorted(joined)] == assistants
    assert joined[max(joined)] == result.final
    # Every piece of a turn comes before the edge that takes its reply in.
    replied_at = [i for i, e in enumerate(events) if isinstance(e, TransitionEvent) and e.source == "AwaitModel"]
    for turn, edge_index in enumerate(replied_at, start=1):
        pieces = [i for i, e in enumerate(events) if isinstance(e, TextDelta) and e.turn == turn]
        assert pieces
        assert max(pieces) < edge_index


def test_a_sync_reader_that_breaks_mid_reply_stops_the_run_cancelled_after_that_call() -> None:
    """The reply in progress is taken in; the run stops cancelled before the tools it asks for, which never run."""
    tools = Counted()
    model = Typist(*two_tool_script())
    agent = Agent(model, tools.registry)
    seen: list[tuple[str, str]] = []
    agent.on("transition", lambda event: seen.append((event.source, event.dest)))
    before = set(stream_threads())
    stream = agent.stream("q")
    for event in stream:
        if isinstance(event, TextDelta) and event.turn == 2:
            break
    stream.close()  # type: ignore[attr-defined]
    ours = set(stream_threads()) - before
    for thread in ours:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in ours)
    assert tools.ran == {"a": 1, "b": 1}
    assert len(model.seen) == 2
    # The transition in progress, then those needing no call, and the stop before the tool calls.
    assert seen[-4:] == [
        ("AwaitModel", "CheckTruncation"),
        ("CheckTruncation", "Dispatch"),
        ("Dispatch", "ExecuteTool"),
        ("ExecuteTool", "Failed"),
    ]


def test_a_sync_reader_that_raises_after_dispatch_runs_no_tool() -> None:
    tools = Counted()
    model = Typist(*two_tool_script())
    agent = Agent(model, tools.registry)
    before = set(stream_threads())

    def reader() -> None:
        for event in agent.stream("q"):
            if isinstance(event, TransitionEvent) and event.dest == "ExecuteTool":
                raise KeyError("the reader broke")

    with pytest.raises(KeyError):
        reader()
    ours = set(stream_threads()) - before
    for thread in ours:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in ours)
    assert tools.ran == {}
    assert len(model.seen) == 1


@pytest.mark.parametrize("how", ["break", "raise"])
def test_an_async_reader_that_leaves_mid_reply_records_the_call_cancelled(how: str) -> None:
    """Docs: one that stops reading astream() cancels the model call in flight, which the run records as cancelled."""
    agent = Agent(Stalls(reply("first answer")), Counted().registry)
    failed: list[TransitionEvent] = []
    agent.on("failed", failed.append)

    async def leave() -> None:
        events = agent.astream("q")
        async for event in events:
            assert isinstance(event, TextDelta)
            if how == "raise":
                raise KeyError("the reader broke")
            break
        await events.aclose()

    if how == "raise":
        with pytest.raises(KeyError):
            asyncio.run(leave())
    else:
        asyncio.run(leave())
    assert len(failed) == 1
    (stop,) = failed
    assert (stop.source, stop.dest, stop.reason) == ("AwaitModel", "Failed", "cancelled")
    assert stop.evidence is not None
    assert stop.evidence["unfinished"] == "model call of turn 1"
    assert stop.evidence["streamed"] == "first "  # what the reader was shown of the reply cut off
    assert stop.result is not None
    assert stop.result.reason == "cancelled"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_reader_that_cancels_on_the_first_piece_stops_before_any_tool_runs(driver: str) -> None:
    tools = Counted()
    model = Typist(*two_tool_script())
    agent = Agent(model, tools.registry)
    token = CancelToken()
    seen: list[TransitionEvent | TextDelta] = []

    async def acollect() -> None:
        async for event in agent.astream("q", cancel=token):
            seen.append(event)
            if isinstance(event, TextDelta):
                token.cancel("the user left")

    def collect() -> None:
        if driver == "async":
            asyncio.run(acollect())
            return
        for event in agent.stream("q", cancel=token):
            seen.append(event)
            if isinstance(event, TextDelta):
                token.cancel("the user left")

    with pytest.raises(AgentLoopError) as stop:
        collect()
    assert stop.value.reason == "cancelled"
    assert stop.value.evidence["why"] == "the user left"
    assert tools.ran == {}
    assert len(model.seen) == 1
    # The whole first reply is kept: what was streamed, and the calls it asked for, pending.
    text = "".join(event.text for event in seen if isinstance(event, TextDelta))
    assert text == "Two calls now."
    assert [m.content for m in stop.value.result.messages if m.role == "assistant"] == ["Two calls now."]
    assert [call.id for call in stop.value.result.pending] == ["a", "b"]
    last = seen[-1]
    assert isinstance(last, TransitionEvent)
    assert (last.dest, last.reason) == ("Failed", "cancelled")


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stored_run_read_by_a_text_hook_resumes_after_a_broken_stream_without_repeating_a_tool(
    driver: str, tmp_path: Path
) -> None:
    """Text hook + SqliteStore: a stream breaks on turn 2, a retried resume from the store streams turn 3 once."""
    tools = Counted()

    class BreaksOnTurnTwo(Typist):
        def complete_stream(self, messages: Any, tools: Any, on_text: Any, **keywords: Any) -> Any:
            if len(self.seen) == 1:
                self.complete(messages, tools, **keywords)
                on_text("half ")
                raise ConnectionError("stream reset")
            return super().complete_stream(messages, tools, on_text, **keywords)

        async def acomplete_stream(self, messages: Any, tools: Any, on_text: Any, **keywords: Any) -> Any:
            return self.complete_stream(messages, tools, on_text, **keywords)

    script = [tool_turn(tool_call("bump", id="a", key="a"), content="Calling."), reply("lost"), reply("Done.")]
    agent = Agent(BreaksOnTurnTwo(*script), tools.registry)
    pieces: list[TextDelta] = []
    agent.on("text", pieces.append)
    store = SqliteStore(tmp_path / "runs.db")
    with pytest.raises(AgentLoopError) as stop:
        run_to_the_end(agent, "sync" if driver == "sync" else "arun", store=store, run_id="r1")
    assert stop.value.reason == "model_error"
    stored = store.load("r1")
    assert (stored["state"], stored["reason"]) == ("Failed", "model_error")
    run = agent.resume(stored, retry=True, store=store)
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert result.final == "Done."
    assert tools.ran == {"a": 1}
    assert store.load("r1")["state"] == "Done"
    by_turn: dict[int, str] = {}
    for piece in pieces:
        by_turn[piece.turn] = by_turn.get(piece.turn, "") + piece.text
    assert by_turn == {1: "Calling.", 2: "half ", 3: "Done."}


@pytest.mark.parametrize("way", ["run", "arun", "stream", "astream"])
def test_a_strict_text_hook_that_raises_stops_the_run_before_the_replys_tools_and_keeps_the_reply(way: str) -> None:
    tools = Counted()
    agent = Agent(Typist(*two_tool_script()), tools.registry, strict_hooks=True)

    def display(delta: TextDelta) -> None:
        if delta.text.startswith("calls"):
            raise ValueError("the display broke")

    agent.on("text", display)
    with pytest.raises(AgentLoopError) as stop:
        run_to_the_end(agent, way)
    assert stop.value.reason == "hook_error"
    assert isinstance(stop.value.__cause__, ValueError)
    assert tools.ran == {}
    assert [m.content for m in stop.value.result.messages if m.role == "assistant"] == ["Two calls now."]
    assert [call.id for call in stop.value.result.pending] == ["a", "b"]


@pytest.mark.parametrize("model", [FakeModel, Typist])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stream_of_a_run_paused_for_approval_ends_like_run(driver: str, model: type[FakeModel]) -> None:
    """Docs (streaming.md): stream() ends like run(); its last event's paused is the paused result."""
    tools = Counted()

    def agent() -> Agent:
        return Agent(model(*two_tool_script()), tools.registry, approve=["bump"])

    paused = agent().run("q")
    assert paused.reason == "paused"
    events = read(agent(), driver)
    assert tools.ran == {}
    last = events[-1]
    assert isinstance(last, TransitionEvent)
    assert last.result is None  # the run did not end
    assert last.paused is not None
    assert (last.paused.reason, [call.id for call in last.paused.pending]) == ("paused", [c.id for c in paused.pending])
    assert last.paused.snapshot is not None
    decisions = {call.id: True for call in last.paused.pending}
    again = agent().resume(last.paused.snapshot, approvals=decisions).finish()
    assert again.reason == "paused"  # the next turn's call waits for its own decision
    assert tools.ran == {"a": 1, "b": 1}


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_broken_stream_keeps_the_text_it_showed_in_the_result(driver: str) -> None:
    """README: nothing the model produced is dropped; the reader saw "half of it", the result should hold it."""
    agent = Agent(Breaks(reply("unused")), Counted().registry)
    shown: list[str] = []
    agent.on("text", lambda delta: shown.append(delta.text))
    with pytest.raises(AgentLoopError) as stop:
        agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    assert stop.value.reason == "model_error"
    assert "".join(shown) == "half of it"
    result: RunResult = stop.value.result
    assert result.evidence["streamed"] == "half of it"


@pytest.mark.parametrize("model_class", [FakeModel, Typist], ids=["plain", "streams"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_reader_that_leaves_at_the_finalize_edge_gets_no_finalize_call_and_a_resume_makes_it_once(
    driver: str, model_class: type[FakeModel]
) -> None:
    """The finalize call is a call like any: a reader gone before it leaves the stop standing, the call for a resume.

    Docs (streaming.md, "Stopping early"): the run stops before its next
    call; a run on its way to a finalize call keeps its stop, with
    ``evidence["finalize"]["outcome"] == "cancelled"``, and a resume makes
    the call (``resumes_finalize``).
    """
    tools = Counted()
    model = model_class(tool_turn(tool_call("bump", id="a", key="a")), reply("A is bumped, the rest is missing."))
    agent = Agent(model, tools.registry, max_steps=1, on_stop={"max_steps": "finalize"})
    failed: list[TransitionEvent] = []
    agent.on("failed", failed.append)
    if driver == "sync":
        before = set(stream_threads())
        stream = agent.stream("q")
        for event in stream:
            if isinstance(event, TransitionEvent) and event.trigger == "finalize":
                break
        stream.close()  # type: ignore[attr-defined]
        for thread in set(stream_threads()) - before:
            thread.join(timeout=30)
    else:

        async def leave() -> None:
            events = agent.astream("q")
            async for event in events:
                if isinstance(event, TransitionEvent) and event.trigger == "finalize":
                    break
            await events.aclose()

        asyncio.run(leave())
    assert len(model.seen) == 1  # the finalize call was not made for a reader who had left
    (stop,) = failed
    assert (stop.source, stop.reason) == ("AwaitModel", "cancelled")  # the edge; the run keeps its stop
    assert stop.result is not None
    assert stop.result.reason == "max_steps"
    assert stop.result.evidence["finalize"]["outcome"] == "cancelled"
    resumed = agent.resume(stop.result)
    result = resumed.finish() if driver == "sync" else asyncio.run(resumed.afinish())
    assert (result.reason, result.final) == ("max_steps", "A is bumped, the rest is missing.")
    assert result.evidence["finalize"] == {"outcome": "answered"}
    assert len(model.seen) == 2
    assert tools.ran == {"a": 1}


def test_a_ctrl_c_in_a_tool_under_astream_leaves_asyncio_run_to_close_its_async_generators() -> None:
    """The interrupt reaches the caller once; asyncio.run's shutdown still runs (a store closes connections there).

    The reading task, cancelled by that shutdown, must not raise the
    interrupt its step already raised out of the loop: asyncio.run would
    then skip closing the loop's async generators and its thread pool.
    """
    closed: list[str] = []
    registry = ToolRegistry()

    @registry.register
    def interrupts(key: str) -> str:
        """Raise a Ctrl-C, as one arriving while the tool runs would."""
        raise KeyboardInterrupt

    async def held_open() -> Any:  # an async generator the loop must close at its shutdown
        try:
            yield 1
            await asyncio.sleep(3600)
        finally:
            closed.append("closed")

    async def main() -> None:
        held = held_open()
        await held.__anext__()
        agent = Agent(Typist(tool_turn(tool_call("interrupts", key="a"), content="Calling it.")), registry)
        async for _ in agent.astream("q"):
            pass

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    assert closed == ["closed"]
