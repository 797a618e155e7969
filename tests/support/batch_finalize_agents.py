"""A batch's agent (module level, so a worker can import it): ``slow``'s finalize call hangs once, until cut.

``fast`` answers once ``slow`` is in that call, so a caller can leave the
batch with it in flight.  Every model and tool call is counted by input.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

MODEL: Counter[str] = Counter()
TOOLS: Counter[str] = Counter()
HANG = {"armed": True}
IN_FINAL = threading.Event()
LOCK = threading.Lock()


def reset() -> None:
    MODEL.clear()
    TOOLS.clear()
    HANG["armed"] = True
    IN_FINAL.clear()


class _Model:
    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        asked = next(m.content for m in messages if m.role == "user")
        with LOCK:
            MODEL[f"{asked}:{'tools' if tools else 'finalize'}"] += 1
        if asked == "fast":
            return reply("fast answer")
        if tools:
            return tool_turn(tool_call("work", label=asked))
        return reply("slow final")

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        asked = next(m.content for m in messages if m.role == "user")
        if asked == "fast":
            while not IN_FINAL.is_set():
                await asyncio.sleep(0.02)
        if asked == "slow" and not tools and HANG["armed"]:
            HANG["armed"] = False
            with LOCK:
                MODEL["slow:finalize"] += 1
            IN_FINAL.set()
            await asyncio.sleep(3600)  # cut here when the batch is left
        return self.complete(messages, tools)


def make_agent() -> Agent:
    tools = ToolRegistry()

    def work(label: str) -> str:
        """Do one piece of work."""
        with LOCK:
            TOOLS[label] += 1
        return f"{label} ok"

    tools.register(work)
    return Agent(_Model(), tools, max_steps=1, on_stop={"max_steps": "finalize"})


def counted() -> dict[str, Any]:
    """The model and tool calls so far, by input."""
    return {"model": dict(MODEL), "tools": dict(TOOLS)}
