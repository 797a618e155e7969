"""What a stepper asks its driver to do: the effects, one record per kind of I/O a transition may need.

The stepper's ``effect()`` returns one of these (or None) and the driver
carries it out and hands the outcome back (``Stepper.accept_*``): the
requests of the sans-I/O core, as h11's events are its protocol's, kept
apart so a driver reads what it may be asked without the stepper's code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from fsm_agent.core.output import OutputSpec
from fsm_agent.records import Message, ToolCall
from fsm_agent.tools import JSONSchema


@attrs.frozen
class ModelCall:
    """Call the model with ``messages`` (a live read-only view) and ``tools`` (empty for a finalize call)."""

    messages: Sequence[Message]
    tools: list[JSONSchema]
    turn: int


@attrs.frozen
class ToolBatch:
    """Run these calls of the current turn; each is already cleared by the before-tool guards."""

    calls: tuple[ToolCall, ...]


@attrs.frozen
class CheckOutput:
    """Check the final answer ``text`` with ``output``: its type, then the validators, which are user code."""

    text: str
    output: OutputSpec


@attrs.frozen
class CompactHistory:
    """Shorten the history the model is sent with ``compact(messages)``, user code, after a context overflow."""

    messages: tuple[Message, ...]
    compact: Callable[[list[Message]], Any]


Effect = ModelCall | ToolBatch | CheckOutput | CompactHistory
