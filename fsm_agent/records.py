"""Immutable records that cross the API: messages, tool calls, responses, steps, results.

Everything here is an ``attrs.frozen`` class so a result handed to the caller
cannot be changed behind the engine's back, and so records compare by value in
tests.  The one mutable object of a run lives in :mod:`fsm_agent.run`.
"""

from __future__ import annotations

from typing import Any

import attrs


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value)


def _dict(value: Any) -> dict[str, Any]:
    return dict(value)


@attrs.frozen
class ToolCall:
    """One tool call requested by the model; ``arguments`` is the decoded JSON object.

    ``raw_arguments`` is set only when the model's argument text could not be
    decoded (models do emit broken JSON): the call then fails with a message
    telling the model what was wrong, and the text itself is kept.
    """

    id: str
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)
    raw_arguments: str | None = None


@attrs.frozen
class Message:
    """One chat message: ``system``, ``user``, ``assistant`` or ``tool``."""

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tuple)
    tool_call_id: str | None = None


@attrs.frozen
class Usage:
    """Tokens one model call consumed; a response without usage counts as zero."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


STOP_REASONS = ("end_turn", "tool_use", "stop_sequence", "max_tokens", "refusal")
"""The ``stop_reason`` values the engine understands; anything else is a model error."""


@attrs.frozen
class ModelResponse:
    """What a model returns for one call.

    ``stop_reason`` follows the Anthropic vocabulary the engine understands:
    ``end_turn``, ``tool_use``, ``stop_sequence``, ``max_tokens`` (the output
    was cut off: the run stops with reason ``max_tokens``) and ``refusal`` (the
    provider refused or filtered the output: reason ``refusal``); adapters map
    their provider's signals onto it.  Any other value ends the run with
    ``model_error``: guessing whether an unknown signal means "complete"
    could hand a truncated answer to the caller as if it were whole.
    """

    message: Message
    stop_reason: str = "end_turn"
    usage: Usage | None = None


@attrs.frozen
class Step:
    """One unit of work the run did: a tool call (``kind="tool_call"``) or the final answer.

    ``index`` is the model turn the step belongs to, so the tool calls of one
    turn share an index.  ``counters`` maps each counter name to ``[used, limit]``
    (``limit`` is ``None`` where no limit is set) after the step, so an app can
    warn before a limit is hit.
    """

    index: int
    kind: str
    detail: str
    counters: dict[str, list[int | float | None]] = attrs.field(factory=dict, converter=_dict)


@attrs.frozen
class Transition:
    """One edge of the machine that a run took.

    ``guard`` is the name of the predicate that allowed it (``None`` for a
    fallback edge) and ``reason`` is set only on edges into ``Failed``; together
    with ``source``, ``trigger`` and ``dest`` they name exactly one table row.
    """

    source: str
    trigger: str
    dest: str
    guard: str | None = None
    reason: str | None = None


@attrs.frozen
class RunResult:
    """Everything a run produced, whether it ended in ``Done`` or ``Failed``.

    ``reason`` is ``"done"`` for a natural finish and the stop reason
    otherwise; ``ok`` is true only for a natural finish.  ``pending`` holds the
    tool calls the model asked for that were never executed (for example the
    repeated call that stopped the run), so nothing the model asked for is lost
    without a trace.  ``evidence`` is the stop's JSON-serialisable diagnosis.
    """

    messages: tuple[Message, ...] = attrs.field(converter=_tuple)
    steps: tuple[Step, ...] = attrs.field(converter=_tuple)
    final: str
    reason: str = "done"
    trace: tuple[Transition, ...] = attrs.field(default=(), converter=_tuple)
    evidence: dict[str, Any] = attrs.field(factory=dict, converter=_dict)
    usage: Usage = attrs.field(factory=Usage)
    pending: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tuple)

    @property
    def ok(self) -> bool:
        """True if and only if the run reached ``Done`` without any stop."""
        return self.reason == "done"
