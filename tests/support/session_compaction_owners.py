"""Two owners of a Session whose turns compact: a model with a small window, a counted summary, tools counted.

Every side effect is a line appended to one ledger file, so threads, event
loops and child processes count into the same place: ``model <question>
<messages sent>`` per model call, ``summary <question>`` per call of
``compact`` (the paid summary call), ``tool <call id>`` per tool call that
completed.  The model answers each question by the conversation it is sent
(``a-<q>``, then ``b-<q>``, then ``noted <q>``), so any owner, in any
process, can go on with a turn another one started.

With no system prompt, turn 1 ("one") fits the window; turn 2 ("two") runs
``a-two``, overflows, compacts, then runs ``b-two``; turn 3 ("three")
overflows on its first call and compacts before any tool.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsm_agent import Agent, ContextOverflowError, Message, ModelResponse, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

WINDOW = 8
"""The model refuses (``ContextOverflowError``) a call sent more messages than this."""

WAIT = 60.0
"""How long a held compaction or a test waits for the other side; the work waited for takes milliseconds."""

_WRITE = threading.Lock()


def note(ledger: str, line: str) -> None:
    """Append ``line`` to the ledger (one short ``O_APPEND`` write: whole across processes)."""
    with _WRITE, Path(ledger).open("a", encoding="utf-8") as file:
        file.write(line + "\n")


def counted(ledger: str) -> collections.Counter[str]:
    """Every line of the ledger, counted."""
    path = Path(ledger)
    return collections.Counter(path.read_text(encoding="utf-8").splitlines() if path.exists() else [])


def of_kind(ledger: str, kind: str) -> collections.Counter[str]:
    """The ledger's ``kind`` lines (``model``, ``summary``, ``tool``), counted without the kind."""
    return collections.Counter(
        {line.split(" ", 1)[1]: n for line, n in counted(ledger).items() if line.startswith(kind + " ")}
    )


def _question(messages: Sequence[Message]) -> str:
    """The question a conversation is on: its last user message that is no summary."""
    return next(m.content for m in reversed(messages) if m.role == "user" and not m.content.startswith("summary"))


class Window:
    """Refuses more than ``WINDOW`` messages; else asks ``a-<q>``, then ``b-<q>``, then answers ``noted <q>``."""

    def __init__(self, ledger: str, kill_on_summary: str | None = None) -> None:
        self.ledger = ledger
        self.kill_on_summary = kill_on_summary

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = _question(messages)
        note(self.ledger, f"model {question} {len(messages)}")
        if len(messages) > WINDOW:
            raise ContextOverflowError("prompt is too long", tokens=len(messages), limit=WINDOW)
        if self.kill_on_summary == question and messages[0].content.startswith("summary"):
            os._exit(9)  # the process dies in the call the stored summary shortened: no cleanup, no lease given up
        text = " ".join(m.content for m in messages)
        for step in ("a", "b"):
            if f"{step}-{question} done" not in text:
                return tool_turn(tool_call("work", id=f"{step}-{question}", label=f"{step}-{question}"))
        return reply(f"noted {question}")


class Hold:
    """Holds ``compact`` for question ``at``: ``entered`` is set (or the file ``<flag>.entered`` made) when it
    starts; it returns once ``release`` is set (or ``<flag>.go`` exists).  ``kill``: it ends the process there
    instead (``os._exit``)."""

    def __init__(self, at: str, flag: str | None = None, *, kill: bool = False) -> None:
        self.at = at
        self.flag = flag
        self.kill = kill
        self.entered = threading.Event()
        self.release = threading.Event()

    def arrive(self) -> None:
        self.entered.set()
        if self.flag is not None:
            Path(self.flag + ".entered").touch()
        if self.kill:
            os._exit(9)

    def released(self) -> bool:
        return self.release.is_set() or (self.flag is not None and Path(self.flag + ".go").exists())


def _summary(messages: list[Message]) -> list[Message]:
    question = _question(messages)
    return [Message("user", "summary: " + " | ".join(m.content for m in messages)), Message("user", question)]


def compaction_agent(
    ledger: str,
    hold: Hold | None = None,
    *,
    awaited: bool = False,
    kill_on_summary: str | None = None,
    **options: Any,
) -> Agent:
    """An agent that compacts on overflow, every call counted in ``ledger``; ``compact`` held by ``hold``.

    ``awaited``: ``compact`` is a coroutine function (the async driver awaits it on its loop); ``options`` go to
    the ``Agent`` (a ``timeout`` puts the sync driver's calls and ``compact`` on workers).
    """
    tools = ToolRegistry()

    @tools.register
    def work(label: str) -> str:
        """Do one step, counted once it is done."""
        note(ledger, f"tool {label}")
        return f"{label} done"

    def start(messages: list[Message]) -> str:
        question = _question(messages)
        note(ledger, f"summary {question}")
        if hold is not None and hold.at == question:
            hold.arrive()
        return question

    def compact(messages: list[Message]) -> list[Message]:
        question = start(messages)
        if hold is not None and hold.at == question:
            deadline = time.monotonic() + WAIT
            while not hold.released():
                assert time.monotonic() < deadline, "the held compaction was never released"
                hold.release.wait(0.01)
        return _summary(messages)

    async def acompact(messages: list[Message]) -> list[Message]:
        question = start(messages)
        if hold is not None and hold.at == question:
            deadline = time.monotonic() + WAIT
            while not hold.released():
                assert time.monotonic() < deadline, "the held compaction was never released"
                await asyncio.sleep(0.01)
        return _summary(messages)

    return Agent(
        Window(ledger, kill_on_summary),
        tools,
        on_stop={"context_overflow": "compact"},
        compact=acompact if awaited else compact,
        **options,
    )


TURN_MODEL_CALLS: dict[str, collections.Counter[str]] = {
    "one": collections.Counter({"one 1": 1, "one 3": 1, "one 5": 1}),
    "two": collections.Counter({"two 7": 1, "two 9": 1, "two 2": 1, "two 4": 1}),
    "three": collections.Counter({"three 13": 1, "three 2": 1, "three 4": 1, "three 6": 1}),
}
"""The model calls each turn makes, taken once: what it was asked and how many messages it was sent."""


def calls_of(*questions: str) -> collections.Counter[str]:
    """The model calls of these turns, each taken once."""
    total: collections.Counter[str] = collections.Counter()
    for question in questions:
        total += TURN_MODEL_CALLS[question]
    return total


def tools_of(*questions: str) -> collections.Counter[str]:
    """The tool calls of these turns, each made once."""
    return collections.Counter({f"{step}-{q}": 1 for q in questions for step in ("a", "b")})


def whole(*questions: str) -> list[tuple[str, str]]:
    """The record of these turns as a session keeps it: every question, call, tool result and answer."""
    record: list[tuple[str, str]] = []
    for q in questions:
        record += [("user", q), ("assistant", ""), ("tool", f'"a-{q} done"'), ("assistant", "")]
        record += [("tool", f'"b-{q} done"'), ("assistant", f"noted {q}")]
    return record


def record_of(messages: Sequence[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in messages]


def stored_head(data: dict[str, Any]) -> list[str]:
    """The compacted history a stored turn goes on from: its compaction's head, as contents."""
    compaction = data.get("compaction")
    assert compaction is not None, "the turn holds no compaction"
    return [m["content"] for m in compaction["head"]]
