"""A session's owners as the tests and their child processes build them: tools that count each completed call."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Counting:
    """Per question: ``tick`` once, ``nap`` once if the question starts with "nap", then an answer.

    Each reply depends only on the conversation, so any process can resume a turn anywhere.
    """

    def __init__(self) -> None:
        self.seen: list[list[Message]] = []
        self._lock = threading.Lock()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self._lock:
            self.seen.append(list(messages))
        last = max(i for i, m in enumerate(messages) if m.role == "user")
        question = messages[last].content
        answered = sum(1 for m in messages[last:] if m.role == "tool")
        if answered == 0:
            return tool_turn(tool_call("tick", id=f"tick {question}", text=question))
        if answered == 1 and question.startswith("nap"):
            return tool_turn(tool_call("nap", id=f"nap {question}"))
        return reply(f"done {question}")


def counting_agent(
    counter: str, nap_for: float = 0.0, interrupt: str | None = None, **options: Any
) -> tuple[Agent, Counting]:
    """An agent whose tools append each completed call's id to ``counter``.

    ``nap`` sleeps ``nap_for`` seconds (after touching ``<counter>.napping``);
    with ``interrupt``, its first call raises KeyboardInterrupt (and creates that file), as a Ctrl-C would.
    """
    registry = ToolRegistry()

    def done(call_id: str) -> None:
        with Path(counter).open("a", encoding="utf-8") as file:
            file.write(call_id + "\n")

    @registry.register
    def tick(text: str, call_id: str) -> str:
        """Count one call."""
        time.sleep(0.005)  # long enough for two unlocked turns to overlap
        done(call_id)
        return text

    @registry.register
    def nap(call_id: str) -> str:
        """Sleep, or stop the process the first time."""
        Path(counter + ".napping").touch()
        if interrupt is not None and not Path(interrupt).exists():
            Path(interrupt).touch()
            raise KeyboardInterrupt
        time.sleep(nap_for)
        done(call_id)
        return "rested"

    model = Counting()
    return Agent(model, registry, **options), model
