"""Read-only views of a run: ``RunView`` for a user's stop condition, ``MessagesView`` for a model's messages.

A user's ``StopCondition`` and a model are handed a run to read, never to
change: only the core writes a run (``definition.run``).  A view reads the
run's records live, so it costs nothing to hand out on every transition,
and copies only what it returns as a tuple.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

from fsm_agent.definition.run import Counters, Run
from fsm_agent.definition.states import State
from fsm_agent.records import Message, ModelResponse, Step, ToolCall


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


class RunView:
    """A read-only window on a run, handed to user-defined stop conditions."""

    __slots__ = ("_run",)

    def __init__(self, run: Run) -> None:
        self._run = run

    @property
    def state(self) -> State:
        """The state the run is leaving."""
        return self._run.at.state

    @property
    def messages(self) -> Sequence[Message]:
        """The conversation so far (a live, read-only view)."""
        return MessagesView(self._run.talk.messages)

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps taken so far."""
        return tuple(self._run.talk.steps)

    @property
    def last_response(self) -> ModelResponse | None:
        """The model's latest response."""
        return self._run.talk.last_response

    @property
    def pending(self) -> tuple[ToolCall, ...]:
        """Tool calls of the current turn not executed yet (the next one first)."""
        return tuple(self._run.calls.pending)

    @property
    def output(self) -> Any:
        """A typed agent's validated answer (at an ``"answer"`` guardrail); ``None`` before or without one."""
        return self._run.talk.output

    @property
    def counters(self) -> Counters:
        """Counters against limits, as in ``Step.counters``."""
        return self._run.counters()
