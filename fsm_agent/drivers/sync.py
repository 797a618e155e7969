"""The sync driver: it carries out each effect by calling, one call at a time, like the seed's loop."""

from __future__ import annotations

from typing import Any

from fsm_agent.core.stepper import ModelCall, ToolBatch
from fsm_agent.definition.table import EXPIRED
from fsm_agent.drivers.base import RunBase
from fsm_agent.records import RunResult, ToolCall, Transition
from fsm_agent.tools.calling import DeadlineError, within_deadline


def _within(seconds: float | None, function: Any, *args: Any) -> Any:
    """Call ``function(*args)``, waiting at most ``seconds``; past them the call is abandoned (``DeadlineError``)."""
    if seconds is None:
        return function(*args)
    return within_deadline(lambda: function(*args), seconds, "call")


class SyncDriver(RunBase):
    """``advance()`` (one transition) and ``finish()`` (to the end), calling the model and tools directly."""

    def advance(self) -> Transition:
        """Do this state's I/O, if any, fire exactly one transition and return the edge taken."""
        self._check_live()
        self._observe()
        effect = self.stepper.effect()
        try:
            if isinstance(effect, ModelCall):
                self._call_model(effect)
            elif isinstance(effect, ToolBatch):
                self._call_tool(effect.calls[0])
        except DeadlineError:
            return self._interrupt(EXPIRED, self._unfinished(effect))
        return self._step()

    def finish(self) -> RunResult:
        """Advance to the end; return the result, or apply the stop's policy (raise ``AgentLoopError`` by default).

        A run paused for approval returns a result with ``reason == "paused"``.
        """
        while self._result is None:
            if self.paused:
                return self._paused_result()
            self.advance()
        return self._outcome_of_run()

    def _call_model(self, effect: ModelCall) -> None:
        self._before_model()
        try:
            response = _within(self._remaining(), self._model.complete, effect.messages, effect.tools)
        except DeadlineError:
            raise
        except Exception as exc:  # noqa: BLE001 - any model failure is a model_error stop
            self._model_failed(exc)
            return
        self._model_replied(response)

    def _call_tool(self, call: ToolCall) -> None:
        self._before_tool(call)
        timeout, remaining = self._tool_timeout, self._remaining()
        if remaining is not None and (timeout is None or remaining < timeout):
            # The run's deadline comes first: the call is abandoned there, and the run stops on timeout.
            outcome = _within(remaining, self._registry.execute, call, timeout)
        elif timeout is None:
            # Called as execute(call), so registries that wrap it keep working.
            outcome = self._registry.execute(call)
        else:
            outcome = self._registry.execute(call, timeout=timeout)
        self.stepper.accept_tool(call, outcome)

    def _unfinished(self, effect: ModelCall | ToolBatch | None) -> str:
        if isinstance(effect, ToolBatch):
            return effect.calls[0].id
        return f"model call of turn {self.position.turns + 1}"
