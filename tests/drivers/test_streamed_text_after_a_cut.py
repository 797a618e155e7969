"""A model call cut by the deadline or a cancel hands no more text on: what was shown is what the stop keeps.

A model's thread cannot be stopped, so a cut call may go on streaming after
the run stopped.  The docs promise that the text a cut call showed is kept
in ``evidence["streamed"]`` and that a call's ``TextDelta``s come before the
transition that ends it: the ``text`` hooks and the text observers are
handed exactly ``evidence["streamed"]``, never the pieces the call sends
after the stop, nor a piece the stop left out as it was taken.

No test sleeps for its timing: each cut call streams the rest of its reply
only once the test sets ``go_on``, after the stop.  The deadline (0.3 s)
only has to outlast the first two pieces, handed on within a millisecond of
the call's start.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import pytest

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, ToolRegistry
from fsm_agent.observe.events import TextDelta
from fsm_agent.testing import reply
from fsm_agent.tools import JSONSchema

DEADLINE = 0.3


class _StreamsOnAfterTheCut:
    """Streams two words, then waits (past the run's deadline) until ``go_on`` is set, then streams the rest.

    The async call streams from a thread of its own, as an SDK's reader
    thread does, and waits for a reply that only comes after the cut: the
    cut cancels the coroutine, and the thread goes on.
    """

    def __init__(self) -> None:
        self.go_on = threading.Event()
        self.two_sent = threading.Event()
        self.ended = threading.Event()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return reply("one two three four")

    def complete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], on_text: Callable[[str], object]
    ) -> ModelResponse:
        self._stream(on_text)
        return reply("one two three four")

    async def acomplete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], on_text: Callable[[str], object]
    ) -> ModelResponse:
        threading.Thread(target=self._stream, args=(on_text,), daemon=True).start()
        while not self.two_sent.is_set():
            await asyncio.sleep(0.001)
        await asyncio.Event().wait()  # the whole reply: the deadline or the cancel comes first
        raise AssertionError("never reached")

    def _stream(self, on_text: Callable[[str], object]) -> None:
        try:
            on_text("one ")
            on_text("two ")
            self.two_sent.set()
            self.go_on.wait(30)
            on_text("three ")
            on_text("four")
        finally:
            self.ended.set()


class _Heard:
    """What a run's ``text`` hooks and its text observers were handed."""

    def __init__(self) -> None:
        self.hooked: list[str] = []
        self.observed: list[str] = []

    def hook(self, delta: TextDelta) -> None:
        self.hooked.append(delta.text)

    def observer(self, delta: TextDelta) -> None:
        self.observed.append(delta.text)

    def assert_exactly(self, streamed: str) -> None:
        assert "".join(self.hooked) == streamed, "the text hooks heard text the stop does not hold"
        assert "".join(self.observed) == streamed, "the text observers heard text the stop does not hold"


def _agent(model: _StreamsOnAfterTheCut | _StreamsThroughTheCut, heard: _Heard, timeout: float | None = None) -> Agent:
    agent = Agent(model, ToolRegistry(), timeout=timeout)
    agent.on("text", heard.hook)
    return agent


def test_text_a_deadline_cut_call_streams_after_the_stop_reaches_no_text_hook_or_observer() -> None:
    """Sync driver: the call abandoned at the deadline streams on in its worker; the hooks hear none of it."""
    model = _StreamsOnAfterTheCut()
    heard = _Heard()
    run = _agent(model, heard, timeout=DEADLINE).start("Count to four.")
    run.on_text(heard.observer)
    with pytest.raises(AgentLoopError) as stop:
        run.finish()
    assert stop.value.reason == "timeout"
    streamed = stop.value.evidence["streamed"]
    assert streamed == "one two "
    model.go_on.set()  # the abandoned call goes on in its thread, as a real SDK's stream would
    assert model.ended.wait(30)
    heard.assert_exactly(streamed)


def test_text_an_async_deadline_cut_call_streams_from_its_thread_after_the_stop_reaches_no_text_hook() -> None:
    """Async driver: the deadline cancels the call's coroutine; its SDK thread streams on, heard by nobody."""
    model = _StreamsOnAfterTheCut()
    heard = _Heard()

    async def cut() -> AgentLoopError:
        run = await _agent(model, heard, timeout=DEADLINE).astart("Count to four.")
        run.on_text(heard.observer)
        with pytest.raises(AgentLoopError) as stop:
            await run.afinish()
        return stop.value

    stop = asyncio.run(cut())
    assert stop.reason == "timeout"
    assert stop.evidence["streamed"] == "one two "
    model.go_on.set()
    assert model.ended.wait(30)
    heard.assert_exactly(stop.evidence["streamed"])


def test_text_a_cancelled_call_streams_from_its_thread_after_the_stop_reaches_no_text_hook() -> None:
    """Async driver: the task driving the run is cancelled mid-call; the call's thread streams on, heard by nobody."""
    model = _StreamsOnAfterTheCut()
    heard = _Heard()

    async def cut() -> dict[str, object]:
        run = await _agent(model, heard).astart("Count to four.")
        run.on_text(heard.observer)
        task = asyncio.ensure_future(run.afinish())
        while not model.two_sent.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert run.result is not None
        assert run.result.reason == "cancelled"
        return run.result.evidence

    evidence = asyncio.run(cut())
    assert evidence["streamed"] == "one two "
    model.go_on.set()
    assert model.ended.wait(30)
    heard.assert_exactly("one two ")


class _StreamsThroughTheCut:
    """Streams one piece after another, without a pause, until ``go_on`` is set after the stop, then 100 more.

    Pieces arrive while the stop takes the text shown: each must be both
    kept and heard, or neither.
    """

    def __init__(self) -> None:
        self.go_on = threading.Event()
        self.ended = threading.Event()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return reply("x")

    def complete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], on_text: Callable[[str], object]
    ) -> ModelResponse:
        self._stream(on_text)
        return reply("x")

    async def acomplete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], on_text: Callable[[str], object]
    ) -> ModelResponse:
        threading.Thread(target=self._stream, args=(on_text,), daemon=True).start()
        await asyncio.Event().wait()
        raise AssertionError("never reached")

    def _stream(self, on_text: Callable[[str], object]) -> None:
        try:
            while not self.go_on.is_set():
                on_text("x")
            for _ in range(100):
                on_text("y")
        finally:
            self.ended.set()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_text_streaming_as_the_deadline_passes_is_heard_exactly_as_the_stop_keeps_it(driver: str) -> None:
    """A piece arriving while the stop is taken is in the evidence and heard, or neither; none after the stop."""
    model = _StreamsThroughTheCut()
    heard = _Heard()
    agent = _agent(model, heard, timeout=DEADLINE)

    run: Callable[[str], object] = agent.run if driver == "sync" else lambda ask: asyncio.run(agent.arun(ask))
    with pytest.raises(AgentLoopError) as stop:
        run("Stream.")
    assert stop.value.reason == "timeout"
    streamed = stop.value.evidence["streamed"]
    assert streamed
    assert set(streamed) == {"x"}
    model.go_on.set()
    assert model.ended.wait(30)
    assert "".join(heard.hooked) == streamed


class _StreamsFromAThread:
    """Streams "one " from a thread of its own, then waits until the reader has it, then "two " and the reply."""

    def __init__(self) -> None:
        self.read = threading.Event()
        self.waited: bool | None = None  # whether the reader had "one " before the wait ran out

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return reply("one two")

    async def acomplete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], on_text: Callable[[str], object]
    ) -> ModelResponse:
        def stream() -> None:
            on_text("one ")
            self.waited = self.read.wait(WAIT)
            on_text("two ")

        await asyncio.to_thread(stream)
        return reply("one two")


WAIT = 10.0
"""Seconds the model's thread waits for the reader to have its first piece: a woken reader has it in about 1 ms."""


def test_astream_hands_on_a_piece_a_model_streams_from_a_thread_as_it_comes() -> None:
    """The reader is woken from the model's thread: it gets "one " while the call still runs, not at its end."""
    model = _StreamsFromAThread()
    agent = Agent(model, ToolRegistry())

    async def read() -> list[str]:
        pieces = []
        async for event in agent.astream("go"):
            if isinstance(event, TextDelta):
                pieces.append(event.text)
                model.read.set()
        return pieces

    assert asyncio.run(read()) == ["one ", "two "]
    assert model.waited is True
