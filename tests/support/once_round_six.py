"""Counted runs for the sixth exactly-once audit: typed answers, compaction, guardrails and finalize calls, cut.

Every model here answers by the conversation it is sent (so any owner
continues a run another one started) and every side effect is written to a
ledger: in memory (``Tally``) for runs cut inside the test's process, or a
file (``Ledger``) for a run whose process dies.  ``Cuts`` arms one point of
a run to raise ``KeyboardInterrupt`` (a Ctrl-C there), once.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsm_agent import (
    Agent,
    ContextOverflowError,
    Message,
    ModelResponse,
    Retry,
    RunResult,
    RunView,
    StopCondition,
    ToolRegistry,
    Usage,
)
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

BATCH_USAGE = Usage(1, 1)
REJECTED_USAGE = Usage(10, 10)
ANSWER_USAGE = Usage(100, 100)
REJECTED = '{"x": -1}'
ACCEPTED = '{"x": 5}'


@dataclass
class Point:
    x: int


class Tally:
    """What a run did, counted across threads: model calls (by the turn they answer), tool runs by call id,
    validator calls by the value checked, compactions (by the length of the history compacted), guardrail checks."""

    def __init__(self) -> None:
        self.model: list[int] = []
        self.tools: Counter[str] = Counter()
        self.validated: Counter[int] = Counter()
        self.compacted: list[int] = []
        self.guarded: list[str] = []
        self.lock = threading.Lock()


class Cuts:
    """The points of a run armed to raise ``KeyboardInterrupt`` once: ``model`` (the model call of that turn),
    ``validator`` (its check of that value), ``compact``, ``guardrail``."""

    def __init__(self, **points: Any) -> None:
        self.points = dict(points)

    def fire(self, point: str, value: Any = True) -> None:
        if self.points.get(point) == value:
            del self.points[point]
            raise KeyboardInterrupt


def batch_registry(tally: Tally) -> ToolRegistry:
    """``work(label)``, counting each execution by call id."""
    tools = ToolRegistry()

    @tools.register
    def work(label: str, call_id: str) -> str:
        """Do one piece of work."""
        with tally.lock:
            tally.tools[call_id] += 1
        return f"{label} ok"

    return tools


def _turn(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages if m.role == "assistant")


def _asked(tally: Tally, cuts: Cuts, messages: Sequence[Message]) -> int:
    """The turn a model is asked for (by the conversation it is sent), counted, and cut there if a cut is set."""
    turn = _turn(messages)
    with tally.lock:
        tally.model.append(turn)
    cuts.fire("model", turn)
    return turn


def _batch() -> ModelResponse:
    """The parallel batch both models open with: ``work`` a and b."""
    return tool_turn(tool_call("work", id="a", label="a"), tool_call("work", id="b", label="b"), usage=BATCH_USAGE)


class TypedModel:
    """A parallel batch (a, b), then a rejected answer, then an accepted one, by the conversation it is sent."""

    def __init__(self, tally: Tally, cuts: Cuts) -> None:
        self.tally, self.cuts = tally, cuts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema], output: Any = None) -> ModelResponse:
        turn = _asked(self.tally, self.cuts, messages)
        if turn == 0:
            return _batch()
        if turn == 1:
            return reply(REJECTED, usage=REJECTED_USAGE)
        return reply(ACCEPTED, usage=ANSWER_USAGE)


def typed_agent(tally: Tally, cuts: Cuts, **options: Any) -> Agent:
    """``TypedModel`` with a validator that sends back a value that is not positive, counting each call."""

    def positive(point: Point) -> Point:
        with tally.lock:
            tally.validated[point.x] += 1
        cuts.fire("validator", point.x)
        if point.x <= 0:
            raise Retry("x must be positive")
        return point

    return Agent(
        TypedModel(tally, cuts),
        batch_registry(tally),
        output_type=Point,
        output_validators=[positive],
        max_concurrency=2,
        **options,
    )


def leaks(tally: Tally, cuts: Cuts) -> StopCondition:
    """An answer guardrail that trips on an answer holding ``5``, counting each check."""

    def holds_five(view: RunView) -> bool:
        text = view.last_response.message.content if view.last_response is not None else ""
        with tally.lock:
            tally.guarded.append(text)
        cuts.fire("guardrail", text)
        return "5" in text

    return StopCondition("leaked", "answer", holds_five, "the answer holds a five", policy="return")


class FinalizeModel:
    """A parallel batch (a, b) under ``max_steps=1``, then the finalize answer (asked with no tools)."""

    def __init__(self, tally: Tally, cuts: Cuts, hold: asyncio.Event | None = None) -> None:
        self.tally, self.cuts = tally, cuts
        self.started: asyncio.Event | None = None
        self.hold = hold

    def _answer(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        turn = _asked(self.tally, self.cuts, messages)
        if turn == 0:
            return _batch()
        return reply("final from a and b", usage=ANSWER_USAGE)

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return self._answer(messages, tools)

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if _turn(messages) == 1 and self.started is not None and self.hold is not None:
            self.started.set()
            await self.hold.wait()
        return self._answer(messages, tools)


def finalize_agent(tally: Tally, cuts: Cuts, model: Any = None, **options: Any) -> Agent:
    options.setdefault("max_steps", 1)
    return Agent(
        model if model is not None else FinalizeModel(tally, cuts),
        batch_registry(tally),
        max_concurrency=2,
        on_stop={"max_steps": "finalize"},
        **options,
    )


WINDOW = 3
"""The compacting model overflows when sent more than this many messages."""


class WindowModel:
    """Asks for step1, then answers; overflows past ``WINDOW`` messages.  Each call is counted, by what it was sent."""

    def __init__(self, tally: Tally, cuts: Cuts) -> None:
        self.tally, self.cuts = tally, cuts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.tally.lock:
            self.tally.model.append(len(messages))
        if len(messages) > WINDOW:
            raise ContextOverflowError("prompt is too long", tokens=len(messages), limit=WINDOW)
        if messages[0].content.startswith("summary"):
            self.cuts.fire("model", "compacted")
        if "step1 ok" not in " ".join(m.content for m in messages):
            return tool_turn(tool_call("work", id="step1", label="step1"), usage=BATCH_USAGE)
        return reply("end", usage=ANSWER_USAGE)


def summary(messages: list[Message]) -> list[Message]:
    return [Message("user", "summary: " + " ".join(m.content for m in messages if m.role == "tool"))]


def compacting_agent(tally: Tally, cuts: Cuts, compact: Any = None, **options: Any) -> Agent:
    """``WindowModel`` with ``compact`` (default: a counted summary of the tool results)."""

    def counted(messages: list[Message]) -> list[Message]:
        with tally.lock:
            tally.compacted.append(len(messages))
        cuts.fire("compact")
        return summary(messages)

    return Agent(
        WindowModel(tally, cuts),
        batch_registry(tally),
        "SYS",
        on_stop={"context_overflow": "compact"},
        compact=compact if compact is not None else counted,
        **options,
    )


# --- a run whose process dies, its effects in a file ------------------------------------------------------------


class Ledger:
    """Each side effect as one line of ``effects.log`` in ``folder`` (one ``O_APPEND`` write: processes never mix)."""

    def __init__(self, folder: str) -> None:
        self.path = Path(folder) / "effects.log"

    def add(self, line: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []


class _DyingWindow:
    """``WindowModel`` written to a ``Ledger``; with ``die``, the process ends (``os._exit(9)``) in the first call
    sent the compacted history, before its reply."""

    def __init__(self, ledger: Ledger, die: bool) -> None:
        self.ledger, self.die = ledger, die

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.ledger.add(f"model {len(messages)}")
        if len(messages) > WINDOW:
            raise ContextOverflowError("prompt is too long", tokens=len(messages), limit=WINDOW)
        if self.die and messages[0].content.startswith("summary"):
            os._exit(9)
        if "step1 ok" not in " ".join(m.content for m in messages):
            return tool_turn(tool_call("work", id="step1", label="step1"), usage=BATCH_USAGE)
        return reply("end", usage=ANSWER_USAGE)


def ledger_compacting_agent(folder: str, *, die: bool) -> Agent:
    """The compacting run of ``compacting_agent``, every effect in ``folder``'s ledger (the compaction a summary
    another model would write: a paid call)."""
    ledger = Ledger(folder)
    tools = ToolRegistry()

    @tools.register
    def work(label: str, call_id: str) -> str:
        """Do one piece of work."""
        ledger.add(f"tool {call_id}")
        return f"{label} ok"

    def compact(messages: list[Message]) -> list[Message]:
        ledger.add(f"compact {len(messages)}")
        return summary(messages)

    return Agent(_DyingWindow(ledger, die), tools, "SYS", on_stop={"context_overflow": "compact"}, compact=compact)


def die_in_the_call_after_compacting(target: str, folder: str, driver: str, every: str, lease: float) -> None:
    """In a child process: run the compacting agent on a store that writes ``every``; the process dies in the
    model call made with the compacted history."""
    store = open_store(target, lease=lease, every=every)
    agent = ledger_compacting_agent(folder, die=True)
    if driver == "sync":
        agent.run("go", store=store, run_id="long")
    else:
        asyncio.run(agent.arun("go", store=store, run_id="long"))


def usage_of(*replies: Usage) -> tuple[int, int]:
    """The input and output tokens the scripted ``replies`` report, summed: what a run that kept them counts."""
    return sum(u.input_tokens for u in replies), sum(u.output_tokens for u in replies)


def tokens_of(result: RunResult) -> tuple[int, int]:
    """The input and output tokens ``result`` counted."""
    return result.usage.input_tokens, result.usage.output_tokens


def texts_of(result: RunResult, role: str) -> list[str]:
    """The contents of ``result``'s messages of ``role``, in order: what was kept."""
    return [m.content for m in result.messages if m.role == role]
