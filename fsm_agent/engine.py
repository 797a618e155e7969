"""The driver: it does the I/O (model calls, tool calls) between triggers and lets the machine decide.

Each ``advance()`` performs at most one model or tool call and fires exactly
one trigger, so a run can be walked transition by transition.  ``finish()``
advances until ``Done`` or ``Failed`` and applies the stop's policy
(``AgentLoopError`` by default); ``Agent.run`` and the module-level ``run``
are that.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from fsm_agent.cancellation import CancelToken
from fsm_agent.errors import AgentLoopError, RunStateError
from fsm_agent.guards import evidence_for
from fsm_agent.limits import Limits
from fsm_agent.machine import TableMachine, machine_for
from fsm_agent.records import STOP_REASONS, Message, ModelResponse, RunResult, Step, Transition, Usage
from fsm_agent.run import Clock, MessagesView, Run, signature
from fsm_agent.states import TERMINAL, State
from fsm_agent.stops import StopCondition, check_policies, check_stop_conditions
from fsm_agent.table import CHECK, DISPATCH, FINALIZE, LEAVE, MODEL_FAILED, REPLIED, TABLE, TOOL_DONE, Row, Table
from fsm_agent.tools import JSONSchema, ToolRegistry

FINALIZE_INSTRUCTION = (
    "The run has to stop now ({reason}). Do not call any tool. "
    "Give your best final answer from what you already have, and say what is missing."
)


@runtime_checkable
class Model(Protocol):
    """Anything with ``complete(messages, tools) -> ModelResponse``.

    ``messages`` is a read-only live view of the conversation so far and
    ``tools`` is ``ToolRegistry.schemas()`` (empty for a finalize call).
    Raising any ``Exception`` ends the run with reason ``model_error`` and the
    exception as ``__cause__``.
    """

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """Return the model's next message."""
        ...


class AgentRun(Run):
    """One run of an agent, driven by ``advance()`` (one transition) or ``finish()`` (to the end)."""

    def __init__(self, agent: Agent, messages: list[Message], cancel: CancelToken | None) -> None:
        super().__init__(
            agent.limits,
            messages,
            clock=agent.clock,
            cancel=cancel,
            policies=agent.on_stop,
            rows=agent.table.index,
        )
        self._machine: TableMachine = agent.machine
        self._model = agent.model
        self._registry = agent.registry
        self._stop_evidence = agent.stop_evidence
        self._finalize_from = agent.finalize_from
        self._result: RunResult | None = None
        # Evidence of the stop a finalize call answers for, taken when the stop fired.
        self._finalize_evidence: dict[str, Any] = {}

    @property
    def done(self) -> bool:
        """True once the run is in ``Done`` or ``Failed``."""
        return self.state in TERMINAL

    @property
    def result(self) -> RunResult:
        """The run's result; only available once the run is in ``Done`` or ``Failed``."""
        if self._result is None:
            msg = f"the run is in {self.state}, not finished; advance() it to Done or Failed first"
            raise RunStateError(msg)
        return self._result

    def advance(self) -> Transition:
        """Do this state's I/O, if any, fire exactly one transition and return the edge taken."""
        handler = _HANDLERS.get(self.state)
        if handler is None:
            msg = f"the run already finished in {self.state} (reason {self.reason!r}); start a new run"
            raise RunStateError(msg)
        handler(self)
        if self.state in TERMINAL:
            self._conclude()
        return self.trace[-1]

    def finish(self) -> RunResult:
        """Advance to the end; return the result, or apply the stop's policy (raise ``AgentLoopError`` by default)."""
        while self._result is None:
            self.advance()
        result = self._result
        if self.state is State.Failed and self.policies.get(result.reason, "raise") != "return":
            raise AgentLoopError(result.reason, result) from self.model_exception
        return result

    def _leave(self, trigger: str) -> None:
        """Fire ``trigger``, unless the stop it would take is to be answered by a finalize call."""
        if self.state in self._finalize_from and self.finalizing is None:
            row = self.first_row(trigger)
            reason = row.reason if row is not None else None
            if reason is not None and self.policies.get(reason) == "finalize":
                self._finalize_evidence = evidence_for(self, reason)
                if self._machine.try_fire(self, FINALIZE):
                    self._begin_finalize(reason)
                    return
        self._machine.fire(self, trigger)

    def _begin_finalize(self, reason: str) -> None:
        self.finalizing = reason
        # Provider APIs reject a conversation with unanswered tool calls, so each gets its answer.
        while self.pending:
            call = self.pending.popleft()
            note = {"error": f"not executed: the run stopped ({reason}) before this call"}
            self.messages.append(Message("tool", json.dumps(note), tool_call_id=call.id))
        self.messages.append(Message("user", FINALIZE_INSTRUCTION.format(reason=reason)))

    def _await_model(self) -> None:
        tools = [] if self.finalizing is not None else self._registry.schemas()
        try:
            response = self._model.complete(MessagesView(self.messages), tools)
            if not isinstance(response, ModelResponse):
                msg = f"model returned {type(response).__name__}, expected ModelResponse"
                raise TypeError(msg)  # noqa: TRY301 - handled below like any other model failure
        except Exception as exc:  # noqa: BLE001 - any model failure is a model_error stop
            self.turns += 1
            self.model_exception = exc
            self._machine.fire(self, MODEL_FAILED)
            return
        self.turns += 1
        self.messages.append(response.message)
        if response.stop_reason not in STOP_REASONS:
            # The reply is kept in the messages, but an unknown signal is not guessed at.
            msg = f"model returned unknown stop_reason {response.stop_reason!r}; expected one of {STOP_REASONS}"
            self.model_exception = ValueError(msg)
            self._machine.fire(self, MODEL_FAILED)
            return
        self.last_response = response
        self.pending.extend(response.message.tool_calls)
        if response.usage is not None:
            self.input_tokens += response.usage.input_tokens
            self.output_tokens += response.usage.output_tokens
        self._machine.fire(self, REPLIED)

    def _check(self) -> None:
        self._machine.fire(self, CHECK)

    def _dispatch(self) -> None:
        self._leave(DISPATCH)

    def _execute_tool(self) -> None:
        call = self.pending[0]
        outcome = self._registry.execute(call)
        self.pending.popleft()
        self.messages.append(Message("tool", outcome.content, tool_call_id=call.id))
        self.tool_calls += 1
        self.calls_by_tool[call.name] = self.calls_by_tool.get(call.name, 0) + 1
        if outcome.error is None:
            self.failures = 0
        else:
            self.failures += 1
            self.last_error = outcome.error
        self.last_signature = sig = signature(call)
        if self.limits.cycle_window:
            self.recent.append((sig, outcome.content))
        arguments = json.dumps(call.arguments, ensure_ascii=False, default=repr)
        detail = f"{call.name}({arguments}) -> {outcome.content}"
        self.steps.append(Step(self.turns - 1, "tool_call", detail, self.counters()))
        self._leave(TOOL_DONE)

    def _conclude(self) -> None:
        last = self.trace[-1]
        if self.state is State.Done:
            self.final = self.last_response.message.content if self.last_response is not None else ""
            self.steps.append(Step(self.turns - 1, "final", self.final, self.counters()))
            if self.finalizing is None:
                self.reason = "done"
            else:
                self.reason = self.finalizing
                self.evidence = {**self._finalize_evidence, "finalize": {"outcome": "answered"}}
        else:
            edge_reason = last.reason or "unknown"
            evidence = self._evidence(edge_reason)
            if self.last_response is not None and (
                edge_reason in ("max_tokens", "refusal") or self.finalizing is not None
            ):
                # The cut-off, refusing or last-call text is kept so the caller sees what the model said.
                self.final = self.last_response.message.content
            if self.finalizing is None:
                self.reason, self.evidence = edge_reason, evidence
            else:
                # The stop that forced the finalize stands; the evidence says why the finalize failed.
                evidence.pop("counters", None)
                outcome = {"outcome": edge_reason, **evidence}
                self.reason = self.finalizing
                self.evidence = {**self._finalize_evidence, "finalize": outcome}
        self._result = RunResult(
            messages=self.messages,
            steps=self.steps,
            final=self.final,
            reason=self.reason,
            trace=self.trace,
            evidence=self.evidence,
            usage=Usage(self.input_tokens, self.output_tokens),
            pending=self.pending,
        )

    def _evidence(self, reason: str) -> dict[str, Any]:
        custom = self._stop_evidence.get(reason)
        if custom is None:
            return evidence_for(self, reason)
        return {"step": max(self.turns - 1, 0), **custom(self), "counters": self.counters()}


_HANDLERS: dict[State, Callable[[AgentRun], None]] = {
    State.AwaitModel: AgentRun._await_model,  # noqa: SLF001 - dispatch table of the class's own steps
    State.CheckTruncation: AgentRun._check,  # noqa: SLF001
    State.Dispatch: AgentRun._dispatch,  # noqa: SLF001
    State.ExecuteTool: AgentRun._execute_tool,  # noqa: SLF001
}


class Agent:
    """A model, its tools and the limits that bound every run; serves any number of runs.

    An agent holds no per-run state, so one agent can run many conversations,
    also from several threads at once (the model and tools must then be
    thread-safe themselves).  Invalid limits, stop conditions or policies
    raise ``ValueError`` here, never in the middle of a run.
    """

    def __init__(
        self,
        model: Model,
        registry: ToolRegistry,
        system: str = "",
        max_steps: int = 8,
        max_consecutive_failures: int = 3,
        *,
        timeout: float | None = None,
        token_budget: int | None = None,
        max_tool_calls: int | Mapping[str, int] | None = None,
        cycle_window: int = 6,
        clock: Clock = time.monotonic,
        stop_conditions: Iterable[StopCondition] = (),
        on_stop: Mapping[str, str] | None = None,
    ) -> None:
        if not callable(getattr(model, "complete", None)):
            msg = f"model must have a complete(messages, tools) method, got {type(model).__name__}"
            raise TypeError(msg)
        if not isinstance(registry, ToolRegistry):
            msg = f"registry must be a ToolRegistry, got {type(registry).__name__}"
            raise TypeError(msg)
        if not isinstance(system, str):
            msg = f"system must be a str, got {type(system).__name__}"
            raise TypeError(msg)
        if not callable(clock):
            msg = f"clock must be a callable returning monotonic seconds, got {type(clock).__name__}"
            raise TypeError(msg)
        self.model = model
        self.registry = registry
        self.system = system
        self.clock = clock
        self.limits = Limits(
            max_steps=max_steps,
            max_consecutive_failures=max_consecutive_failures,
            timeout=timeout,
            token_budget=token_budget,
            max_tool_calls=max_tool_calls,
            cycle_window=cycle_window,
        )
        stops = tuple(stop_conditions)
        check_stop_conditions(stops, TABLE.reasons)
        self.stop_conditions = stops
        self.table: Table = TABLE.with_rows(
            (Row(s.at, LEAVE[s.at], State.Failed, s.guard, s.reason) for s in stops), (s.reason for s in stops)
        )
        self.stop_evidence: dict[str, Callable[[Run], dict[str, Any]]] = {s.reason: s.evidence for s in stops}
        self.on_stop = check_policies(on_stop, self.table.reasons)
        # Finalize is tried only where a stop with that policy is checked, so other runs pay nothing for it.
        finalizing = {reason for reason, policy in self.on_stop.items() if policy == "finalize"}
        self.finalize_from = frozenset(row.source for row in self.table.rows if row.reason in finalizing)
        self.machine = machine_for(self.table)

    def start(self, user_input: str, *, cancel: CancelToken | None = None) -> AgentRun:
        """Begin a run in ``AwaitModel`` without calling anything yet; drive it with ``advance()``."""
        if not isinstance(user_input, str):
            msg = f"user_input must be a str, got {type(user_input).__name__}"
            raise TypeError(msg)
        if cancel is not None and not isinstance(cancel, CancelToken):
            msg = f"cancel must be a CancelToken, got {type(cancel).__name__}"
            raise TypeError(msg)
        messages = [Message("system", self.system)] if self.system else []
        messages.append(Message("user", user_input))
        return AgentRun(self, messages, cancel)

    def run(self, user_input: str, *, cancel: CancelToken | None = None) -> RunResult:
        """Run to the end: the result on ``Done``; on a stop, what its ``on_stop`` policy says."""
        return self.start(user_input, cancel=cancel).finish()


def run(
    model: Model,
    registry: ToolRegistry,
    user_input: str,
    system: str = "",
    max_steps: int = 8,
    max_consecutive_failures: int = 3,
    *,
    timeout: float | None = None,
    token_budget: int | None = None,
    max_tool_calls: int | Mapping[str, int] | None = None,
    cycle_window: int = 6,
    clock: Clock = time.monotonic,
    stop_conditions: Iterable[StopCondition] = (),
    on_stop: Mapping[str, str] | None = None,
    cancel: CancelToken | None = None,
) -> RunResult:
    """Run one conversation to the end with a throwaway ``Agent`` built from the same keywords."""
    agent = Agent(
        model,
        registry,
        system,
        max_steps,
        max_consecutive_failures,
        timeout=timeout,
        token_budget=token_budget,
        max_tool_calls=max_tool_calls,
        cycle_window=cycle_window,
        clock=clock,
        stop_conditions=stop_conditions,
        on_stop=on_stop,
    )
    return agent.run(user_input, cancel=cancel)
