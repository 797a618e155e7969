"""The one mutable object of a run: its state name and the counters the guards read.

It is deliberately a plain (non-slotted) class compared by identity: it is the
model of the shared ``transitions`` machine, and one exists per run, so
nothing about a run lives on the agent or the machine.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, overload

from fsm_agent.limits import Limits
from fsm_agent.records import Message, ModelResponse, Step, ToolCall, Transition
from fsm_agent.states import State

Signature = tuple[str, str]


def signature(call: ToolCall) -> Signature:
    """Identify a tool call by name and canonical arguments, so key order does not matter."""
    if call.raw_arguments is not None:
        return call.name, "raw:" + call.raw_arguments
    try:
        arguments = json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        # Arguments a model could not have sent as JSON still need a stable identity.
        arguments = repr(call.arguments)
    return call.name, arguments


class MessagesView(Sequence[Message]):
    """A read-only, live view of a run's messages, handed to models without copying them."""

    __slots__ = ("_items",)

    def __init__(self, items: list[Message]) -> None:
        self._items = items

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return tuple(self._items[index])
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Message]:
        return iter(self._items)

    def __repr__(self) -> str:
        return f"MessagesView({self._items!r})"


class Run:
    """Position and counters of one run; the guards are predicates over it."""

    def __init__(self, limits: Limits, messages: list[Message]) -> None:
        self.state: State = State.AwaitModel
        self.limits = limits
        self.messages = messages
        self.steps: list[Step] = []
        self.trace: list[Transition] = []
        # Model calls made so far; the current turn's index is turns - 1.
        self.turns = 0
        self.failures = 0
        self.last_signature: Signature | None = None
        self.last_error: str | None = None
        self.last_response: ModelResponse | None = None
        # Tool calls of the current turn not executed yet; in ExecuteTool, pending[0] is the call about to run.
        self.pending: deque[ToolCall] = deque()
        self.model_exception: BaseException | None = None
        self.final = ""
        self.reason: str | None = None
        self.evidence: dict[str, Any] = {}
        self.input_tokens = 0
        self.output_tokens = 0
