"""What a stepper asks its driver to do: the effects, one record per kind of I/O a transition may need.

The stepper's ``effect()`` returns one of these (or None) and the driver
carries it out and hands the outcome back (``Stepper.accept_*``): the
requests of the sans-I/O core, as h11's events are its protocol's, kept
apart so a driver reads what it may be asked without the stepper's code.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from fsm_agent.core.output import OutputSpec
from fsm_agent.records import Message, ToolCall
from fsm_agent.tools import JSONSchema
from fsm_agent.tools.calling import awaited_within, in_daemon_worker, settle, within_deadline


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
    """Shorten the history the model is sent with ``compact(messages)``, user code, after a context overflow.

    ``run`` and ``arun`` make it as a typed answer's check is made: within
    the run's time left (``timeout``), on a daemon worker given up with
    ``DeadlineError`` when it passes (a compaction may be a paid model call
    of its own, which can hang as any call can); on the event loop, an
    async ``compact`` is awaited there and a sync one runs on a thread, so
    the loop is never held up.  What ``compact`` raised is returned: a
    failed compaction leaves the overflow standing (``accept_compaction``).
    """

    messages: tuple[Message, ...]
    compact: Callable[[list[Message]], Any]

    def run(self, timeout: float | None) -> Any:
        """The compacted history, or what compacting raised; ``DeadlineError`` once ``timeout`` seconds pass."""
        if timeout is None:
            return self._compacted()
        return within_deadline(self._compacted, timeout, "compaction")

    async def arun(self, timeout: float | None) -> Any:
        """``run`` for the event loop: an async ``compact`` awaited on it, a sync one on a thread."""
        import asyncio  # here, not at the top: import fsm_agent loads no asyncio

        if inspect.iscoroutinefunction(self.compact):
            work: Awaitable[Any] = self._acompacted()
        else:
            work = (asyncio.to_thread if timeout is None else in_daemon_worker)(self._compacted)
        return await (work if timeout is None else awaited_within(work, timeout, "compaction"))

    def _compacted(self) -> Any:
        try:
            return settle(self.compact(list(self.messages)))
        except Exception as exc:  # noqa: BLE001 - a failed compaction leaves the overflow standing
            return exc

    async def _acompacted(self) -> Any:
        try:
            return await self.compact(list(self.messages))
        except Exception as exc:  # noqa: BLE001 - as in _compacted
            return exc


Effect = ModelCall | ToolBatch | CheckOutput | CompactHistory
