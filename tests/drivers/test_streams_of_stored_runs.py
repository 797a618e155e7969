"""``stream(store=...)`` and ``astream(store=...)``: a streamed run is stored like ``run``'s, and a reader gone early
leaves it stopped and free, for a resume that makes each call once.

docs/how-to/streaming.md ("Stopping early": "A stored run is written so,
and let go").  The model answers by the conversation so far, so any owner
can go on from any point; each tool execution and model turn is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from fsm_agent import Agent, Message, ModelResponse, RunExistsError, TextDelta, ToolRegistry, TransitionEvent
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn


class ByHistory:
    """Turn 1 asks for ``a`` and ``b`` at once, turn 2 for ``c``, turn 3 answers; each turn counted."""

    def __init__(self, counts: Counter[str]) -> None:
        self.counts = counts

    def complete(self, messages: list[Message], tools: Any) -> ModelResponse:
        turn = 1 + sum(1 for m in messages if m.role == "assistant")
        self.counts[f"model:{turn}"] += 1
        if turn == 1:
            return tool_turn(
                tool_call("work", id="a", key="a"), tool_call("work", id="b", key="b"), content="Two calls now."
            )
        if turn == 2:
            return tool_turn(tool_call("work", id="c", key="c"))
        return reply("done: " + ", ".join(sorted(m.content for m in messages if m.role == "tool")))


class Streams(ByHistory):
    """``ByHistory`` that streams each reply's text: ``stream()`` then drives the run on a thread of its own."""

    def complete_stream(self, messages: list[Message], tools: Any, on_text: Any) -> ModelResponse:
        response = self.complete(messages, tools)
        for word in response.message.content.split():
            on_text(word)
        return response

    async def acomplete_stream(self, messages: list[Message], tools: Any, on_text: Any) -> ModelResponse:
        return self.complete_stream(messages, tools, on_text)


def make_agent(counts: Counter[str], *, streams: bool = False) -> Agent:
    registry = ToolRegistry()

    @registry.register
    def work(key: str) -> str:
        """Count one execution of ``key``."""
        counts[f"tool:{key}"] += 1
        return key.upper()

    return Agent((Streams if streams else ByHistory)(counts), registry)


EXPECTED = Counter({"model:1": 1, "model:2": 1, "model:3": 1, "tool:a": 1, "tool:b": 1, "tool:c": 1})
FINAL = 'done: "A", "B", "C"'  # each result as its JSON text


def _stream(agent: Agent, driver: str, store: Any, *, leave_after: int | None = None, **keywords: Any) -> list[Any]:
    """The events of ``stream``/``astream`` of run "r" in ``store``; the reader leaves after ``leave_after`` edges."""
    return _read_events(
        lambda: agent.stream("q", store=store, run_id="r", **keywords),
        lambda: agent.astream("q", store=store, run_id="r", **keywords),
        driver,
        leave_after,
    )


def _read_events(
    sync: Callable[[], Iterator[Any]], aio: Callable[[], AsyncIterator[Any]], driver: str, leave_after: int | None
) -> list[Any]:
    """Every event of ``sync()`` or ``aio()``, the reader leaving after ``leave_after`` edges (None: to the end).

    The sync reader just breaks out of its loop, closing nothing: the generator is closed as it is let go of;
    the async one reads in ``contextlib.aclosing``, as streaming.md says to.
    """

    def leaves(seen: list[Any]) -> bool:
        return leave_after is not None and sum(isinstance(e, TransitionEvent) for e in seen) == leave_after

    if driver == "sync":
        seen: list[Any] = []
        for event in sync():
            seen.append(event)
            if leaves(seen):
                break
        return seen

    async def go() -> list[Any]:
        seen: list[Any] = []
        async with contextlib.aclosing(aio()) as events:  # type: ignore[type-var]  # an AsyncGenerator in fact
            async for event in events:
                seen.append(event)
                if leaves(seen):
                    break
        return seen

    return asyncio.run(go())


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stream_read_to_the_end_stores_the_run_done(store_target: str, driver: str) -> None:
    counts: Counter[str] = Counter()
    with open_store(store_target) as store:
        events = _stream(make_agent(counts), driver, store)
        stored = store.load("r")
    edges = [event for event in events if isinstance(event, TransitionEvent)]
    assert (edges[-1].dest, stored["state"], stored["final"]) == ("Done", "Done", FINAL)
    assert counts == EXPECTED


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stream_under_a_stored_id_is_refused_before_anything_is_called(store_target: str, driver: str) -> None:
    counts: Counter[str] = Counter()
    with open_store(store_target) as store:
        _stream(make_agent(counts), driver, store)
        with pytest.raises(RunExistsError):
            _stream(make_agent(counts), driver, store)
        events = _stream(make_agent(counts), driver, store, overwrite=True)
    assert events[-1].dest == "Done"
    assert counts == EXPECTED + EXPECTED  # the refused stream called nothing; the overwrite is a new run


@pytest.mark.parametrize("streams", [False, True], ids=["whole replies", "streamed replies"])
@pytest.mark.parametrize("leave_after", [1, 3, 4, 6])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_reader_gone_early_leaves_the_run_stored_stopped_and_free_and_a_resume_makes_each_call_once(
    store_target: str, driver: str, leave_after: int, streams: bool
) -> None:
    """Stopped and written by the time the reader's next line runs, a streaming model's run (driven on a thread by
    ``stream()``) too."""
    counts: Counter[str] = Counter()
    with open_store(store_target) as store:
        _stream(make_agent(counts, streams=streams), driver, store, leave_after=leave_after)
        stored = store.load("r")
        assert (stored["state"], stored["reason"]) == ("Failed", "cancelled")
        # Let go: another owner takes it at once, no lease to wait out.
        result = make_agent(counts).resume(stored, store=store).finish()
    assert result.final == FINAL
    assert counts == EXPECTED


def _read(run: Any, driver: str, leave_after: int | None = None) -> list[Any]:
    """The events of ``run.stream()`` or ``run.astream()``; the reader leaves after ``leave_after`` edges."""
    return _read_events(run.stream, run.astream, driver, leave_after)


@pytest.mark.parametrize("streams", [False, True], ids=["whole replies", "streamed replies"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stored_run_resumed_with_a_decision_streams_on_and_a_reader_gone_early_leaves_it_for_the_next(
    store_target: str, driver: str, streams: bool
) -> None:
    """``Agent.resume(..., approvals=, store=)`` then ``run.stream()``: the events from the transition after the
    resume edge; a reader leaving after one edge stops the run, let go, and the next resume finishes it."""
    counts: Counter[str] = Counter()

    def careful() -> Agent:
        agent = make_agent(counts, streams=streams)
        return Agent(agent.model, agent.registry, approve={"work"})

    with open_store(store_target) as store:
        events = _stream(careful(), driver, store)
        paused = events[-1].paused
        assert paused is not None
        assert [call.id for call in paused.pending] == ["a", "b"]
        approvals = {"a": True, "b": True}
        run = careful().resume(store.load("r"), approvals=approvals, store=store)
        seen = _read(run, driver, leave_after=1)
        # The first edge after the resume edge: the approved call made, taken in.
        assert [(e.source, e.trigger) for e in seen if isinstance(e, TransitionEvent)] == [("ExecuteTool", "tool_done")]
        stopped = store.load("r")
        assert (stopped["state"], stopped["reason"]) == ("Failed", "cancelled")
        resumed = careful().resume(stopped, store=store)
        rest = _read(resumed, driver)
        assert rest[-1].paused is not None  # the next turn's call waits for a person too
        last = careful().resume(store.load("r"), approvals={"c": True}, store=store)
        final = _read(last, driver)
    assert final[-1].dest == "Done"
    assert store_final(store_target) == FINAL
    assert counts == EXPECTED


def store_final(target: str) -> str:
    with open_store(target) as store:
        return str(store.load("r")["final"])


def test_a_stream_closed_from_a_hook_of_its_own_run_stops_it_without_an_error(store_target: str) -> None:
    """A streaming model's run is driven on a thread of its own, where its hooks run: closing the stream there
    cannot wait for that thread; the run stops all the same, before its tools, stored and let go."""
    counts: Counter[str] = Counter()
    agent = make_agent(counts, streams=True)
    raised: list[BaseException] = []
    paused = threading.Event()  # the reader is out of the generator: closing it is allowed (Python's rule)
    with open_store(store_target) as store:
        events = agent.stream("q", store=store, run_id="r")

        def close(event: TransitionEvent) -> None:
            if event.source == "AwaitModel":  # the reply taken in, on the stream's thread
                assert paused.wait(30)
                try:
                    events.close()  # type: ignore[attr-defined]
                except BaseException as exc:  # noqa: BLE001 - kept for the assertion
                    raised.append(exc)

        agent.on("transition", close)
        for event in events:
            if isinstance(event, TextDelta):
                break  # paused (not closed) while the stream's thread takes the reply in: its hook closes it
        paused.set()
        for thread in [t for t in threading.enumerate() if t.name.startswith("fsm_agent stream")]:
            thread.join(timeout=30)
        stored = store.load("r")
    assert raised == []
    assert (stored["state"], stored["reason"]) == ("Failed", "cancelled")
    assert counts == Counter({"model:1": 1})


def test_a_run_streamed_again_on_another_loop_and_thread_feeds_only_its_latest_stream() -> None:
    """``run.astream()`` to a pause in one ``asyncio.run``, a decision, then ``run.stream()``: the first stream's
    observers went with it.  Left on the run, its text observer set an event of a closed loop on every piece the
    sync stream's thread handed it, and a strict run stopped ``hook_error``."""
    counts: Counter[str] = Counter()
    base = make_agent(counts, streams=True)
    agent = Agent(base.model, base.registry, approve={"work"}, strict_hooks=True)
    run = agent.start("q")

    async def first() -> list[Any]:
        async with contextlib.aclosing(run.astream()) as events:
            return [event async for event in events]

    paused = asyncio.run(first())[-1].paused
    assert paused is not None
    run.decide({"a": True, "b": True})
    second = list(run.stream())
    assert second[-1].paused is not None  # turn 2 asks for c
    run.decide({"c": True})
    third = list(run.stream())
    assert third[-1].dest == "Done"
    assert run.result.final == FINAL
    texts = [event.text for event in third if isinstance(event, TextDelta)]
    assert texts == FINAL.split()  # each piece (a word) of the last reply once, in this stream only
    assert counts == EXPECTED


def test_a_second_stream_of_a_run_being_streamed_is_refused_and_nothing_is_made_twice() -> None:
    """Each stream drives the run: two read at once made a batch's calls twice.  The second is refused."""
    counts: Counter[str] = Counter()
    agent = make_agent(counts, streams=True)

    async def read(events: Any) -> list[Any]:
        async with contextlib.aclosing(events) as reading:
            return [event async for event in reading]

    async def both() -> list[Any]:
        run = await agent.astart("q")
        return await asyncio.gather(read(run.astream()), read(run.astream()), return_exceptions=True)

    first, second = asyncio.run(both())
    refused = [outcome for outcome in (first, second) if isinstance(outcome, BaseException)]
    assert [type(error).__name__ for error in refused] == ["RunStateError"]
    assert "being streamed already" in str(refused[0])
    assert counts == EXPECTED
