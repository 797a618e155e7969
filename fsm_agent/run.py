"""The one mutable object of a run: its state name and the counters the guards read.

It is deliberately a plain (non-slotted) class compared by identity: it is the
model of the shared ``transitions`` machine, and one exists per run, so
nothing about a run lives on the agent or the machine.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, overload

from fsm_agent.cancellation import CancelToken
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


class Edge(Protocol):
    """What a guard that looks ahead needs of a table row (avoids importing the table here)."""

    @property
    def dest(self) -> State: ...

    @property
    def guard(self) -> Callable[[Run], bool] | None: ...

    @property
    def reason(self) -> str | None: ...


Clock = Callable[[], float]


class Run:
    """Position and counters of one run; the guards are predicates over it."""

    def __init__(
        self,
        limits: Limits,
        messages: list[Message],
        *,
        clock: Clock,
        cancel: CancelToken | None = None,
        policies: Mapping[str, str] | None = None,
        rows: Mapping[tuple[State, str], Sequence[Edge]] | None = None,
    ) -> None:
        self.state: State = State.AwaitModel
        self.limits = limits
        self.messages = messages
        self.steps: list[Step] = []
        self.trace: list[Transition] = []
        # Model calls made so far; the current turn's index is turns - 1.
        self.turns = 0
        self.failures = 0
        self.tool_calls = 0
        self.calls_by_tool: dict[str, int] = {}
        self.last_signature: Signature | None = None
        self.last_error: str | None = None
        self.last_response: ModelResponse | None = None
        # Tool calls of the current turn not executed yet; in ExecuteTool, pending[0] is the call about to run.
        self.pending: deque[ToolCall] = deque()
        # (signature, result) of the latest executed calls, for the cycle guard; bounded by cycle_window.
        self.recent: deque[tuple[Signature, str]] = deque(maxlen=limits.cycle_window or 1)
        self.model_exception: BaseException | None = None
        # An exception from a hook of a strict_hooks agent; it stops the run at the next transition.
        self.hook_error: BaseException | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.clock = clock
        self.started = clock()
        # While a batch of parallel tool calls is replayed, guards see the clock and cancel token as planned.
        self.frozen_at: float | None = None
        self.frozen_cancel: bool | None = None
        self.cancel = cancel
        self.policies: Mapping[str, str] = policies or {}
        self.rows: Mapping[tuple[State, str], Sequence[Edge]] = rows or {}
        # The stop that a finalize call is answering for, once one was taken.
        self.finalizing: str | None = None
        # Set by resume(retry=True): a model_error run may call the model again.
        self.retry_model = False
        self.final = ""
        self.reason: str | None = None
        self.evidence: dict[str, Any] = {}

    @property
    def tokens(self) -> int:
        """Input plus output tokens reported so far."""
        return self.input_tokens + self.output_tokens

    @property
    def elapsed(self) -> float:
        """Seconds since the run started, on the run's clock."""
        now = self.clock() if self.frozen_at is None else self.frozen_at
        return now - self.started

    def cancel_requested(self) -> bool:
        """Whether the run's token asks it to stop (as seen when the current batch was planned, during one)."""
        if self.frozen_cancel is not None:
            return self.frozen_cancel
        return self.cancel is not None and self.cancel.cancelled

    def counters(self) -> dict[str, list[int | float | None]]:
        """Every counter against its limit, ``[used, limit]`` with ``None`` for no limit."""
        limits = self.limits
        return {
            "steps": [self.turns, limits.max_steps],
            "failures": [self.failures, limits.max_consecutive_failures],
            "tool_calls": [self.tool_calls, limits.total_tool_calls],
            "tokens": [self.tokens, limits.token_budget],
            "seconds": [round(self.elapsed, 6), limits.timeout],
        }

    def first_row(self, trigger: str) -> Edge | None:
        """The row ``trigger`` would take from the current state, without taking it."""
        for row in self.rows.get((self.state, trigger), ()):
            if row.guard is None or row.guard(self):
                return row
        return None


class RunView:
    """A read-only window on a run, handed to user-defined stop conditions."""

    __slots__ = ("_run",)

    def __init__(self, run: Run) -> None:
        self._run = run

    @property
    def state(self) -> State:
        """The state the run is leaving."""
        return self._run.state

    @property
    def messages(self) -> Sequence[Message]:
        """The conversation so far (a live, read-only view)."""
        return MessagesView(self._run.messages)

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps taken so far."""
        return tuple(self._run.steps)

    @property
    def last_response(self) -> ModelResponse | None:
        """The model's latest response."""
        return self._run.last_response

    @property
    def pending(self) -> tuple[ToolCall, ...]:
        """Tool calls of the current turn not executed yet (the next one first)."""
        return tuple(self._run.pending)

    @property
    def counters(self) -> dict[str, list[int | float | None]]:
        """Counters against limits, as in ``Step.counters``."""
        return self._run.counters()
