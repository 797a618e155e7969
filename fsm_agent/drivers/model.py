"""What an agent calls and reads: the ``Model`` protocol its model meets, and the clock it measures time with."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from fsm_agent.records import Message, ModelResponse
from fsm_agent.tools import JSONSchema

Clock = Callable[[], float]
"""Monotonic seconds; replaceable in tests (``fsm_agent.testing.ManualClock``)."""


@runtime_checkable
class Model(Protocol):
    """Anything with ``complete(messages, tools) -> ModelResponse``; ``async acomplete`` is used when present.

    ``messages`` is a read-only live view of the conversation so far and
    ``tools`` is ``ToolRegistry.schemas()`` (empty for a finalize call).
    Raising any ``Exception`` ends the run with reason ``model_error`` and the
    exception as ``__cause__``.
    """

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """Return the model's next message."""
        ...


def awaitable_reply(called: Any) -> Any:
    """What a model's ``acomplete`` returned, to await; a ``TypeError`` naming the fix if it is no awaitable.

    A plain-def ``acomplete`` ran on the event loop and returned its reply:
    Python's own error at the ``await`` would not say what to change.
    """
    if not inspect.isawaitable(called):
        msg = f"model.acomplete returned {type(called).__name__}, not an awaitable: make it an async def"
        raise TypeError(msg)
    return called
