"""A scripted model whose reply depends only on how far the conversation is: one object serves many runs and forks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsm_agent import Message, ModelResponse
from fsm_agent.tools import JSONSchema


class ByTurn:
    """The n-th reply of ``script`` to a conversation holding n assistant messages; ``calls`` counts every call."""

    def __init__(self, script: Sequence[ModelResponse]) -> None:
        self.script = script
        self.calls = 0

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema], output: Any = None) -> ModelResponse:
        self.calls += 1
        return self.script[sum(1 for m in messages if m.role == "assistant")]
