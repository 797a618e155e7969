"""A batch of three runs where the second one's second call hangs until a flag file is gone, every call on record.

Each tool call appends ``start ID`` and ``end ID`` to ``calls.log`` in the
ledger folder (one ``O_APPEND`` write each, so workers in other processes
never interleave); ``calls`` counts them.  Importable by Ray's workers.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

STARTED_WAIT = 120.0
"""Only a bound on a hang: a call starts within seconds of its worker being up."""

QUESTIONS = ["question 0", "stuck 1", "question 2"]


def log(ledger: Path, line: str) -> None:
    """One ``O_APPEND`` write: a child's lines and its test's never interleave."""
    fd = os.open(ledger / "calls.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def calls(ledger: Path) -> Counter[str]:
    path = ledger / "calls.log"
    return Counter(path.read_text().splitlines() if path.exists() else [])


class _Model:
    """Two calls of ``work``, then an answer; each call's id names its question and turn."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = next(m.content for m in messages if m.role == "user")
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn < 2:
            return tool_turn(tool_call("work", id=f"{question.split()[1]}-{turn}", topic=question, turn=turn))
        return reply(f"answer to {question}")


def stuck_agent(ledger: str) -> Agent:
    """``work`` for a ``stuck`` question's second call waits (asynchronously) until ``stuck.flag`` is gone."""
    where = Path(ledger)
    tools = ToolRegistry()

    @tools.register
    async def work(topic: str, turn: int, call_id: str) -> str:
        """Do some work."""
        log(where, f"start {call_id}")
        while topic.startswith("stuck") and call_id.endswith("-1") and (where / "stuck.flag").exists():
            await asyncio.sleep(0.05)
        log(where, f"end {call_id}")
        return f"did {call_id}"

    return Agent(_Model(), tools, max_steps=4, clock=ManualClock())


def wait_for_call(ledger: Path, line: str) -> None:
    """Until the calls log of ``ledger`` holds ``line``: that call has started on its worker."""
    deadline = time.monotonic() + STARTED_WAIT
    while not calls(ledger)[line]:
        assert time.monotonic() < deadline, f"{line!r} never started"
        time.sleep(0.05)
