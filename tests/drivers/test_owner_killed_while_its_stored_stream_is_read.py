"""A process reading a stored run's stream, SIGKILLed between two events or in a call, leaves a run a resume finishes.

Why it must hold: docs/how-to/streaming.md ("Stream a stored run"): the run
is "checkpointed as it goes, so a reader that leaves, or a process that
dies, leaves a run that `resume` finishes", and "The run `resume` returns
streams the same way: `run.stream()` (or `run.astream()`)".
docs/concepts/exactly-once.md: "No completed model or tool call is made
again"; "the call in flight when a process dies may be made again"; "a
process killed mid-batch makes only the calls still in flight again".

The owner is a real child process (``support.killed_owners``) reading
``Agent.stream``/``astream`` with ``store=`` and ``run_id=``.  Its model
streams each reply word by word.  The reader (or the call under test)
writes a marker file at the point under test and holds there; the test
SIGKILLs the process then, takes the run over on the other driver and
reads the resumed run's ``AgentRun.stream()``/``astream()`` to its end.
Every model and tool call, in either process, is a line in one file
(``Tally``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.exactly_once import LEASE, ataken_over, durable_in, taken_over
from support.exactly_once_audit import Tally
from support.killed_owners import (
    DRIVERS,
    EACH_TOOL_ONCE,
    FINAL,
    RUN,
    ahold,
    hold,
    kill_when,
    other_driver,
    phase,
    tool_counts,
)
from support.store_cases import child_process

from fsm_agent import Agent, AgentRun, Message, ModelResponse, RunResult, TextDelta, ToolRegistry, TransitionEvent
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

pytestmark = pytest.mark.subprocess

ASKED = "Working on a and b."
"""The text the model streams with its batch."""


class Typist:
    """Streams each reply word by word: the batch, then the answer.  ``hold_answer``: after the answer's first piece
    the call holds (in flight until the test kills its process)."""

    def __init__(self, tally: Tally, *, hold_answer: bool = False) -> None:
        self.tally, self.hold_answer = tally, hold_answer

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        call = phase(messages)
        self.tally.add(f"model {call}")
        if call == "ask":
            return tool_turn(tool_call("work", id="a", label="a"), tool_call("work", id="b", label="b"), content=ASKED)
        return reply(FINAL)

    def _pieces(self, response: ModelResponse) -> list[str]:
        return re.findall(r"\S+\s*", response.message.content)

    def complete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], on_text: Callable[[str], object]
    ) -> ModelResponse:
        response = self.complete(messages, tools)
        for index, piece in enumerate(self._pieces(response)):
            on_text(piece)
            if index == 0 and self.hold_answer and phase(messages) == "answer":
                hold()
        return response

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return self.complete(messages, tools)

    async def acomplete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], on_text: Callable[[str], object]
    ) -> ModelResponse:
        response = self.complete(messages, tools)
        for index, piece in enumerate(self._pieces(response)):
            on_text(piece)
            if index == 0 and self.hold_answer and phase(messages) == "answer":
                await ahold()
        return response


def make_agent(tally: Tally, *, hold_answer: bool = False, held_tool: Path | None = None) -> Agent:
    """The streaming agent; ``held_tool``: ``work("b")`` writes that file before its side effect and holds."""
    tools = ToolRegistry()

    @tools.register
    def work(label: str) -> str:
        """One side effect, counted."""
        tally.add(f"try {label}")
        if held_tool is not None and label == "b":
            held_tool.write_text("b", encoding="utf-8")
            hold()
        tally.add(f"done {label}")
        return f"{label} ok"

    return Agent(Typist(tally, hold_answer=hold_answer), tools, max_concurrency=2)


def _edge(event: object) -> tuple[str, str] | None:
    return (event.source, event.dest) if isinstance(event, TransitionEvent) else None


POINTS: dict[str, Callable[[Any], bool]] = {
    "before the batch": lambda event: _edge(event) == ("Dispatch", "ExecuteTool"),
    "after the batch": lambda event: _edge(event) == ("ExecuteTool", "AwaitModel"),
    "after the answer came": lambda event: (
        _edge(event) == ("AwaitModel", "CheckTruncation")
        and event.response is not None
        and event.response.message.content == FINAL
    ),
    "mid-answer": lambda event: isinstance(event, TextDelta) and event.turn == 2,
    "inside a tool call": lambda event: False,
}
"""Where the reader stops reading and holds, by the event it holds at; inside a tool call, it never does (``work`` b
holds instead)."""


def _reader(target: str, point: str, driver: str, tally: str, marker: str) -> None:
    """The child process: read ``RUN``'s stream on ``driver`` until ``point``, where the test kills it."""
    held_tool = Path(marker) if point == "inside a tool call" else None
    agent = make_agent(Tally(tally), hold_answer=point == "mid-answer", held_tool=held_tool)
    holds = POINTS[point]
    store = open_store(target, lease=LEASE)
    if driver == "sync":
        for event in agent.stream("go", store=store, run_id=RUN):
            if holds(event):
                Path(marker).write_text(repr(event), encoding="utf-8")
                hold()
    else:

        async def read() -> None:
            async with contextlib.aclosing(agent.astream("go", store=store, run_id=RUN)) as events:
                async for event in events:
                    if holds(event):
                        Path(marker).write_text(repr(event), encoding="utf-8")
                        await ahold()

        asyncio.run(read())
    raise AssertionError(f"the stream ended although its reader was to be killed {point}")


def kill_reader_at(target: str, point: str, driver: str, folder: Path) -> None:
    """Run the reader in a child process and SIGKILL it once it holds at ``point``; inside a tool call, also once a's
    outcome is in the store (the batch's other call returned and was written)."""
    marker = folder / "inside"
    reader = child_process(_reader, target, point, driver, str(folder / "tally"), str(marker))
    a_written = durable_in(target, RUN, ["a"]) if point == "inside a tool call" else lambda: True
    kill_when(reader, lambda: marker.exists() and a_written(), point)


def stream_taken_over(target: str, driver: str, tally: Tally) -> tuple[RunResult, list[Any]]:
    """A new owner here takes the run over once the lease lapsed, reads its ``AgentRun`` stream to the end."""
    agent = make_agent(tally)
    store = open_store(target, lease=LEASE)
    try:
        if driver == "sync":
            run = taken_over(lambda: agent.resume(store.load(RUN), store=store))
            read = list(run.stream())
            return run.result, read

        async def go() -> tuple[RunResult, list[Any]]:
            async def claim() -> AgentRun:
                return await agent.aresume(await store.aload(RUN), store=store)

            run = await ataken_over(claim)
            async with contextlib.aclosing(run.astream()) as events:
                read = [event async for event in events]
            await store.aclose()
            return run.result, read

        return asyncio.run(go())
    finally:
        store.close()


def _assert_whole(result: RunResult, events: list[Any], *, answer_streamed: bool = True) -> None:
    """Every message kept; the resumed stream ends on the edge into Done with that result, after the whole answer's
    text when its call was made there (an answer the killed owner took in is not streamed again: its text is no
    event of the new stream, its reply is the result's)."""
    assert result.final == FINAL
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert result.messages[1].content == ASKED
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == ["a", "b"]
    assert [m.content for m in result.messages if m.role == "tool"] == ['"a ok"', '"b ok"']
    answer = [e.text for e in events if isinstance(e, TextDelta) and e.turn == 2]
    assert "".join(answer) == (FINAL if answer_streamed else "")
    assert _edge(events[-1]) == ("Dispatch", "Done")
    assert events[-1].result.final == FINAL


@pytest.mark.parametrize("point", ["before the batch", "after the batch", "after the answer came"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_reader_killed_between_two_events_leaves_a_run_the_resumed_stream_finishes_making_each_call_once(
    store_target: str, tmp_path: Path, driver: str, point: str
) -> None:
    """No call was in flight: the stream waits for its reader, and each call's outcome was written as it returned,
    so nothing is made again (the answer that came is taken as it was)."""
    tally = Tally(tmp_path / "tally")
    kill_reader_at(store_target, point, driver, tmp_path)
    result, events = stream_taken_over(store_target, other_driver(driver), tally)
    _assert_whole(result, events, answer_streamed=point != "after the answer came")
    assert tally.counts("model") == {"ask": 1, "answer": 1}
    assert tool_counts(tally) == EACH_TOOL_ONCE


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_reader_killed_mid_answer_leaves_only_the_answer_call_to_be_made_again(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """The answer's call was in flight (its first piece shown, the rest not come): it is made again, once; the
    batch's call and tools are not, and the resumed stream shows the whole answer."""
    tally = Tally(tmp_path / "tally")
    kill_reader_at(store_target, "mid-answer", driver, tmp_path)
    result, events = stream_taken_over(store_target, other_driver(driver), tally)
    _assert_whole(result, events)
    assert tally.counts("model") == {"ask": 1, "answer": 2}
    assert tool_counts(tally) == EACH_TOOL_ONCE


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_reader_killed_inside_a_batch_call_leaves_only_that_call_to_be_made_again(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """``work`` b was in flight, a returned and was written: a new owner makes b again, a not, each effect once."""
    tally = Tally(tmp_path / "tally")
    kill_reader_at(store_target, "inside a tool call", driver, tmp_path)
    result, events = stream_taken_over(store_target, other_driver(driver), tally)
    _assert_whole(result, events)
    assert tally.counts("model") == {"ask": 1, "answer": 1}
    assert tool_counts(tally) == {"try a": 1, "try b": 2, "done a": 1, "done b": 1}
