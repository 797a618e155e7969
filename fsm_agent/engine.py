"""The drivers: they do the I/O (model calls, tool calls) between triggers and let the machine decide.

Each ``advance()`` (or ``await aadvance()``) performs at most one model or tool
call and fires exactly one trigger, so a run can be walked transition by
transition; the sync and async drivers share the machine, the table and every
bookkeeping step, and differ only in how they wait.  ``finish()`` advances
until ``Done`` or ``Failed`` and applies the stop's policy (``AgentLoopError``
by default); ``Agent.run``, ``Agent.arun``, ``Agent.stream`` and
``Agent.astream`` are built on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fsm_agent import snapshot
from fsm_agent.cancellation import CancelToken
from fsm_agent.errors import AgentLoopError, RunStateError
from fsm_agent.events import CallEvent, Hook, Hooks, JsonlLog, TransitionEvent, logger
from fsm_agent.guards import evidence_for
from fsm_agent.limits import Limits
from fsm_agent.machine import TableMachine, machine_for
from fsm_agent.records import STOP_REASONS, Message, ModelResponse, RunResult, Step, ToolCall, Transition, Usage, plain
from fsm_agent.run import Clock, MessagesView, Run, signature
from fsm_agent.states import TERMINAL, State
from fsm_agent.stops import StopCondition, check_policies, check_stop_conditions
from fsm_agent.store import Store
from fsm_agent.table import (
    CHECK,
    DISPATCH,
    FINALIZE,
    INTERRUPTED,
    LEAVE,
    MODEL_FAILED,
    REPLIED,
    RESUME,
    TABLE,
    TOOL_DONE,
    Row,
    Table,
)
from fsm_agent.tools import JSONSchema, ToolRegistry, ToolResult

FINALIZE_INSTRUCTION = (
    "The run has to stop now ({reason}). Do not call any tool. "
    "Give your best final answer from what you already have, and say what is missing."
)

Observer = Callable[[TransitionEvent], None]


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


class AgentRun(Run):
    """One run of an agent, driven by ``advance()``/``aadvance()`` (one transition) or ``finish()``/``afinish()``."""

    def __init__(
        self,
        agent: Agent,
        messages: list[Message],
        cancel: CancelToken | None,
        observers: Sequence[Observer] = (),
        *,
        limits: Limits | None = None,
        store: Store | None = None,
        run_id: str | None = None,
    ) -> None:
        super().__init__(
            limits or agent.limits,
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
        self._hooks = agent.hooks
        self._strict_hooks = agent.strict_hooks
        self._max_concurrency = agent.max_concurrency
        self._tool_timeout = agent.tool_timeout
        self._observers = tuple(observers)
        self._approve = agent.approve
        self._store = store
        self.run_id = run_id or uuid.uuid4().hex
        # Decisions on calls that need approval, by call id: True runs it, False or a reason rejects it.
        self.approvals: dict[str, bool | str] = {}
        self.paused = False
        # Building events costs time, so a run nobody watches builds none.
        self._observed = bool(self._hooks) or bool(self._observers)
        self._result: RunResult | None = None
        # Evidence of the stop a finalize call answers for, taken when the stop fired.
        self._finalize_evidence: dict[str, Any] = {}
        # Results of parallel tool calls that ran but whose transitions are not replayed yet, in asked order.
        self._ran: deque[tuple[ToolCall, ToolResult]] = deque()
        # What moved the current transition, for its event.
        self._response: ModelResponse | None = None
        self._error: str | None = None
        self._call: ToolCall | None = None
        self._outcome: ToolResult | None = None

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

    # --- sync driver ---------------------------------------------------------------------------------------

    def advance(self) -> Transition:
        """Do this state's I/O, if any, fire exactly one transition and return the edge taken."""
        handler = _HANDLERS.get(self.state)
        if handler is None:
            raise self._finished_error()
        self._check_not_paused()
        handler(self)
        return self._after()

    def finish(self) -> RunResult:
        """Advance to the end; return the result, or apply the stop's policy (raise ``AgentLoopError`` by default).

        A run paused for approval returns a result with ``reason == "paused"``.
        """
        while self._result is None:
            if self.paused:
                return self._paused_result()
            self.advance()
        return self._outcome_of_run()

    def _await_model(self) -> None:
        tools = self._offered_tools()
        try:
            response = self._model.complete(MessagesView(self.messages), tools)
        except Exception as exc:  # noqa: BLE001 - any model failure is a model_error stop
            self.turns += 1
            self._model_failed(exc)
            return
        self._model_replied(response)

    def _execute_tool(self) -> None:
        call = self.pending[0]
        self._before_tool(call)
        rejected = self._rejection(call)
        self._tool_done(call, rejected or self._invoke(call))

    def _invoke(self, call: ToolCall) -> ToolResult:
        # Without a timeout the registry is called as execute(call), so registries that wrap it keep working.
        if self._tool_timeout is None:
            return self._registry.execute(call)
        return self._registry.execute(call, timeout=self._tool_timeout)

    # --- async driver --------------------------------------------------------------------------------------

    async def aadvance(self) -> Transition:
        """Like ``advance()``, awaiting the model and tools; several calls of one turn run concurrently.

        If the task is cancelled while a model or tool call is in flight, the
        run is recorded as ``Failed``/``cancelled`` with everything so far and
        the ``CancelledError`` propagates.
        """
        state = self.state
        if state not in TERMINAL:
            self._check_not_paused()
        if state is State.AwaitModel:
            await self._a_await_model()
        elif state is State.ExecuteTool:
            await self._a_execute_tool()
        else:
            handler = _HANDLERS.get(state)
            if handler is None:
                raise self._finished_error()
            handler(self)
        return self._after()

    async def afinish(self) -> RunResult:
        """Await the run to the end; return the result or apply the stop's policy, like ``finish()``."""
        while self._result is None:
            if self.paused:
                return self._paused_result()
            await self.aadvance()
        return self._outcome_of_run()

    async def _a_await_model(self) -> None:
        tools = self._offered_tools()
        view = MessagesView(self.messages)
        try:
            acomplete = getattr(self._model, "acomplete", None)
            if acomplete is not None:
                response = await acomplete(view, tools)
            else:
                response = await asyncio.to_thread(self._model.complete, view, tools)
        except asyncio.CancelledError:
            self.turns += 1
            self._interrupt()
            raise
        except Exception as exc:  # noqa: BLE001 - any model failure is a model_error stop
            self.turns += 1
            self._model_failed(exc)
            return
        self._model_replied(response)

    async def _a_execute_tool(self) -> None:
        call = self.pending[0]
        if self._ran and self._ran[0][0] is call:
            self._tool_done(call, self._ran.popleft()[1])
            return
        rejected = self._rejection(call)
        if rejected is not None:
            self._before_tool(call)
            self._tool_done(call, rejected)
            return
        batch = self._plan_batch()
        try:
            outcomes = await self._run_batch(batch)
        except asyncio.CancelledError:
            self._interrupt()
            raise
        self._ran.extend(zip(batch[1:], outcomes[1:], strict=True))
        self._tool_done(call, outcomes[0])

    def _plan_batch(self) -> list[ToolCall]:
        """The calls of this turn, from the current one on, that Dispatch's guards let run, as if run in order.

        The clock and the cancel token are read once, here, and frozen until
        the batch is replayed, so replaying the batch through the machine
        takes the same edges the plan assumed.
        """
        calls = list(self.pending)
        if len(calls) == 1:
            return calls
        self.frozen_at = self.clock()
        self.frozen_cancel = self.cancel is not None and self.cancel.cancelled
        saved = (self.state, self.last_signature, self.tool_calls, dict(self.calls_by_tool), self.pending)
        planned = calls[:1]
        try:
            self.state = State.Dispatch
            for i in range(1, len(calls)):
                previous = calls[i - 1]
                self.last_signature = signature(previous)
                self.tool_calls += 1
                self.calls_by_tool[previous.name] = self.calls_by_tool.get(previous.name, 0) + 1
                self.pending = deque(calls[i:])
                row = self.first_row(DISPATCH)
                if row is None or row.dest is not State.ExecuteTool or self._needs_decision(calls[i]):
                    break
                planned.append(calls[i])
        finally:
            self.state, self.last_signature, self.tool_calls, self.calls_by_tool, self.pending = saved
        return planned

    async def _ainvoke(self, call: ToolCall) -> ToolResult:
        self._before_tool(call)
        if self._tool_timeout is None:
            return await self._registry.aexecute(call)
        return await self._registry.aexecute(call, timeout=self._tool_timeout)

    async def _run_batch(self, batch: list[ToolCall]) -> list[ToolResult]:
        if len(batch) == 1:
            # One call needs no tasks: awaiting it directly keeps the common case cheap.
            return [await self._ainvoke(batch[0])]
        limit = asyncio.Semaphore(self._max_concurrency or len(batch))

        async def one(call: ToolCall) -> ToolResult:
            async with limit:
                return await self._ainvoke(call)

        tasks = [asyncio.ensure_future(one(call)) for call in batch]
        try:
            return list(await asyncio.gather(*tasks))
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            # Calls that finished before the cancellation ran for real: their results are kept.
            for call, task in zip(batch, tasks, strict=True):
                if task.done() and not task.cancelled() and task.exception() is None:
                    self._ran.append((call, task.result()))
            raise

    # --- approval and snapshots ---------------------------------------------------------------------------

    def _needs_decision(self, call: ToolCall) -> bool:
        return self._approve is not None and self._approve(call) and call.id not in self.approvals

    def _check_not_paused(self) -> None:
        if self.paused:
            waiting = ", ".join(f"{c.name} ({c.id})" for c in self.awaiting())
            msg = f"the run is paused until a person decides on: {waiting}; use decide({{call_id: True|False|'why'}})"
            raise RunStateError(msg)

    def awaiting(self) -> list[ToolCall]:
        """The tool calls of this turn that need approval and have no decision yet."""
        return [call for call in self.pending if self._needs_decision(call)]

    def decide(self, approvals: Mapping[str, bool | str]) -> None:
        """Record decisions on calls awaiting approval: ``True`` runs it, ``False`` or a reason text rejects it."""
        for call_id, decision in approvals.items():
            if not isinstance(decision, bool | str):
                msg = f"approval for {call_id!r} must be True, False or a reason text, got {decision!r}"
                raise TypeError(msg)
            if not any(call.id == call_id for call in self.pending):
                known = ", ".join(call.id for call in self.pending) or "none"
                msg = f"no pending tool call has id {call_id!r} (pending: {known})"
                raise ValueError(msg)
        self.approvals.update(approvals)
        self.paused = self.state is State.ExecuteTool and bool(self.pending) and self._needs_decision(self.pending[0])

    def _rejection(self, call: ToolCall) -> ToolResult | None:
        """The tool result of a call a person rejected (it counts toward tool_failures), or None."""
        decision = self.approvals.pop(call.id, True)
        if decision is True:
            return None
        why = decision if isinstance(decision, str) and decision else "no reason given"
        message = f"a person rejected this call to {call.name!r}: {why}"
        return ToolResult(json.dumps({"error": message}, ensure_ascii=False), message)

    def snapshot(self) -> dict[str, Any]:
        """The run's whole position as a JSON-ready dict, for ``Agent.resume`` here or in another process."""
        data = snapshot.dump(self)
        data["run_id"] = self.run_id
        data["paused"] = self.paused
        data["approvals"] = dict(self.approvals)
        data["finalize_evidence"] = self._finalize_evidence
        data["ran"] = [[plain(call), outcome.content, outcome.error] for call, outcome in self._ran]
        return data

    def _restore(self, data: dict[str, Any], states: tuple[State, ...]) -> None:
        snapshot.load(self, data, states)
        try:
            self.approvals = dict(data["approvals"])
            self._finalize_evidence = dict(data["finalize_evidence"])
            ran = [(ToolCall(**call), ToolResult(content, error)) for call, content, error in data["ran"]]
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"snapshot is malformed: {type(exc).__name__}: {exc}"
            raise snapshot.SnapshotError(msg) from exc
        # Batch results pair with the pending calls they answer, by position after the current call.
        for (call, outcome), waiting in zip(ran, list(self.pending)[1:], strict=False):
            self._ran.append((waiting, outcome) if waiting == call else (call, outcome))
        if data.get("error") is not None:
            self.model_exception = RuntimeError(data["error"])

    def _paused_result(self) -> RunResult:
        waiting = self.awaiting()
        evidence = {"step": max(self.turns - 1, 0), "awaiting": [c.id for c in waiting], "counters": self.counters()}
        return self._make_result("paused", evidence, waiting)

    def _interrupt(self) -> None:
        """Record a cancellation of the task driving the run as ``Failed``/``cancelled``."""
        self._machine.fire(self, INTERRUPTED)
        self._after()

    # --- shared bookkeeping --------------------------------------------------------------------------------

    def _finished_error(self) -> RunStateError:
        msg = f"the run already finished in {self.state} (reason {self.reason!r}); start a new run"
        return RunStateError(msg)

    def _offered_tools(self) -> list[JSONSchema]:
        if self._observed:
            self._call_hooks(CallEvent("before_model", self.turns + 1, self.counters()))
        return [] if self.finalizing is not None else self._registry.schemas()

    def _model_failed(self, exc: Exception) -> None:
        """The model call of this turn (already counted) failed: a ``model_error`` stop."""
        self.model_exception = exc
        self._error = f"{type(exc).__name__}: {exc}"
        if self._observed:
            self._call_hooks(CallEvent("after_model", self.turns, self.counters(), error=self._error))
        self._machine.fire(self, MODEL_FAILED)

    def _model_replied(self, response: object) -> None:
        self.turns += 1
        problem = _malformed(response)
        if problem is not None:
            self._model_failed(TypeError(problem))
            return
        assert isinstance(response, ModelResponse)  # _malformed checked it; this tells the type checker
        self.messages.append(response.message)
        self._response = response
        self.pending.extend(response.message.tool_calls)
        if response.usage is not None:
            self.input_tokens += response.usage.input_tokens
            self.output_tokens += response.usage.output_tokens
        if response.stop_reason not in STOP_REASONS:
            # The reply, its calls (pending) and its tokens are kept, but an unknown signal is not guessed at.
            msg = f"model returned unknown stop_reason {response.stop_reason!r}; expected one of {STOP_REASONS}"
            self._model_failed(ValueError(msg))
            return
        self.last_response = response
        if self._observed:
            self._call_hooks(CallEvent("after_model", self.turns, self.counters(), response=response))
        self._machine.fire(self, REPLIED)

    def _check(self) -> None:
        self._machine.fire(self, CHECK)

    def _dispatch(self) -> None:
        self._leave(DISPATCH)

    def _before_tool(self, call: ToolCall) -> None:
        if self._observed:
            self._call_hooks(CallEvent("before_tool", self.turns, self.counters(), tool_call=call))

    def _record_tool(self, call: ToolCall, outcome: ToolResult) -> None:
        """Append a call's tool message and step and update the counters the guards read."""
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
        self.steps.append(Step(self.turns - 1, "tool_call", detail, self.counters(), outcome.truncated))

    def _tool_done(self, call: ToolCall, outcome: ToolResult) -> None:
        self.pending.popleft()
        self._record_tool(call, outcome)
        self._call, self._outcome = call, outcome
        if self._observed:
            event = CallEvent(
                "after_tool",
                self.turns,
                self.counters(),
                tool_call=call,
                tool_result=outcome.content,
                tool_error=outcome.error,
            )
            self._call_hooks(event)
        self._leave(TOOL_DONE)

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
        self._answer_unexecuted(f"the run stopped ({reason}) before this call")
        self.messages.append(Message("user", FINALIZE_INSTRUCTION.format(reason=reason)))

    def _answer_unexecuted(self, why: str) -> None:
        """Give every pending call a tool message saying it did not run: providers reject unanswered calls."""
        while self.pending:
            call = self.pending.popleft()
            note = {"error": f"not executed: {why}"}
            self.messages.append(Message("tool", json.dumps(note), tool_call_id=call.id))

    def _after(self) -> Transition:
        """Close the transition just taken: conclude a finished run, release a batch freeze, notify observers."""
        if self.frozen_at is not None and (self.state is State.AwaitModel or self.state in TERMINAL):
            self.frozen_at = self.frozen_cancel = None
        if self.state in TERMINAL:
            self._conclude()
        if self._observed:
            self._emit()
        self._response = self._call = self._outcome = None
        self._error = None
        if self._approve is not None:
            self.paused = self.state is State.ExecuteTool and self._needs_decision(self.pending[0])
        if self._store is not None and self._store.wants(self.state, self.paused):
            self._store.save(self.run_id, self.snapshot())
        return self.trace[-1]

    def _emit(self) -> None:
        last = self.trace[-1]
        call = self._call
        if call is None and last.dest == State.ExecuteTool and self.pending:
            call = self.pending[0]
        terminal = self.state in TERMINAL
        event = TransitionEvent(
            seq=len(self.trace) - 1,
            source=last.source,
            trigger=last.trigger,
            dest=last.dest,
            guard=last.guard,
            reason=last.reason,
            counters=self.counters(),
            response=self._response,
            error=self._error,
            tool_call=call,
            tool_result=None if self._outcome is None else self._outcome.content,
            tool_error=None if self._outcome is None else self._outcome.error,
            evidence=self.evidence if self.state is State.Failed else None,
            result=self._result if terminal else None,
        )
        hooks = self._hooks
        raised = hooks.call(f"leave:{last.source}", event) if hooks else None
        if hooks:
            raised = hooks.call(f"enter:{last.dest}", event) or raised
            raised = hooks.call("transition", event) or raised
            if self.state is State.Failed:
                raised = hooks.call("failed", event) or raised
        for observer in self._observers:
            observer(event)
        self._hook_failed(raised, terminal)

    def _call_hooks(self, event: CallEvent) -> None:
        self._hook_failed(self._hooks.call(event.kind, event), False)

    def _hook_failed(self, exc: BaseException | None, terminal: bool) -> None:
        if exc is None or not self._strict_hooks or self.hook_error is not None:
            return
        if terminal:
            logger.warning("fsm_agent: strict hook raised after the run finished; the result stands")
            return
        self.hook_error = exc

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
            also_ran = self._record_leftovers()
            if also_ran:
                evidence["also_ran"] = also_ran
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
                self.reason = self.finalizing
                self.evidence = {**self._finalize_evidence, "finalize": {"outcome": edge_reason, **evidence}}
        self._result = self._make_result(self.reason, self.evidence, self.pending)

    def _make_result(self, reason: str, evidence: dict[str, Any], pending: Iterable[ToolCall]) -> RunResult:
        # A stopped or paused run carries its snapshot, so what the caller holds is enough to continue it.
        snapshot = None if self.state is State.Done else self.snapshot()
        return RunResult(
            messages=self.messages,
            steps=self.steps,
            final=self.final,
            reason=reason,
            trace=self.trace,
            evidence=evidence,
            usage=Usage(self.input_tokens, self.output_tokens),
            pending=pending,
            snapshot=snapshot,
        )

    def _record_leftovers(self) -> list[str]:
        """Tool calls of a parallel batch that ran although the run stopped before their turn: keep them all."""
        ids = []
        while self._ran and self.pending and self._ran[0][0] is self.pending[0]:
            call, outcome = self._ran.popleft()
            self.pending.popleft()
            self._record_tool(call, outcome)
            ids.append(call.id)
        return ids

    def _evidence(self, reason: str) -> dict[str, Any]:
        custom = self._stop_evidence.get(reason)
        if custom is None:
            return evidence_for(self, reason)
        return {"step": max(self.turns - 1, 0), **custom(self), "counters": self.counters()}

    def _outcome_of_run(self) -> RunResult:
        result = self.result
        if self.state is State.Failed and self.policies.get(result.reason, "raise") != "return":
            raise AgentLoopError(result.reason, result) from (self.model_exception or self.hook_error)
        return result


def _malformed(response: object) -> str | None:
    """Why a model's return value is not a usable ``ModelResponse``, or None; checked before anything is recorded."""
    if not isinstance(response, ModelResponse):
        return f"model returned {type(response).__name__}, expected ModelResponse"
    message = response.message
    if not isinstance(message, Message):
        return f"ModelResponse.message is a {type(message).__name__}, expected Message"
    if not isinstance(message.content, str):
        return f"Message.content is a {type(message.content).__name__}, expected str"
    for call in message.tool_calls:
        if not isinstance(call, ToolCall):
            return f"a tool call is a {type(call).__name__}, expected ToolCall"
    if response.usage is not None and not isinstance(response.usage, Usage):
        return f"ModelResponse.usage is a {type(response.usage).__name__}, expected Usage or None"
    return None


_HANDLERS: dict[State, Callable[[AgentRun], None]] = {
    State.AwaitModel: AgentRun._await_model,  # noqa: SLF001 - dispatch table of the class's own steps
    State.CheckTruncation: AgentRun._check,  # noqa: SLF001
    State.Dispatch: AgentRun._dispatch,  # noqa: SLF001
    State.ExecuteTool: AgentRun._execute_tool,  # noqa: SLF001
}


class Agent:
    """A model, its tools and the limits that bound every run; serves any number of runs.

    An agent holds no per-run state, so one agent can run many conversations,
    also from several threads or tasks at once (the model and tools must then
    be thread-safe themselves).  Invalid limits, stop conditions or policies
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
        strict_hooks: bool = False,
        max_concurrency: int | None = None,
        approve: Collection[str] | Callable[[ToolCall], bool] | None = None,
        tool_timeout: float | None = None,
    ) -> None:
        if not callable(getattr(model, "complete", None)) and not callable(getattr(model, "acomplete", None)):
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
        if max_concurrency is not None and (
            isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1
        ):
            msg = f"max_concurrency must be None (all calls of a turn) or an integer >= 1, got {max_concurrency!r}"
            raise ValueError(msg)
        if tool_timeout is not None and (
            isinstance(tool_timeout, bool)
            or not isinstance(tool_timeout, int | float)
            or not 0 < tool_timeout < math.inf
        ):
            msg = f"tool_timeout must be None or a finite number of seconds > 0, got {tool_timeout!r}"
            raise ValueError(msg)
        self.tool_timeout = tool_timeout
        self.approve = _approval_rule(approve)
        self.model = model
        self.registry = registry
        self.system = system
        self.clock = clock
        self.strict_hooks = bool(strict_hooks)
        self.max_concurrency = max_concurrency
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
        self.hooks = Hooks()

    def on(self, name: str, hook: Hook | None = None) -> Any:
        """Register an observer: ``agent.on("transition", fn)`` or ``@agent.on("enter:ExecuteTool")``.

        Names: ``transition`` and ``failed`` (a ``TransitionEvent``), ``enter:<State>``
        and ``leave:<State>`` (the same event), ``before_model``, ``after_model``,
        ``before_tool`` and ``after_tool`` (a ``CallEvent``).  For one
        transition the order is leave, enter, transition, failed.
        """
        if hook is None:

            def register(fn: Hook) -> Hook:
                self.hooks.add(name, fn)
                return fn

            return register
        self.hooks.add(name, hook)
        return hook

    def start(
        self,
        user_input: str,
        *,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        store: Store | None = None,
        run_id: str | None = None,
    ) -> AgentRun:
        """Begin a run in ``AwaitModel`` without calling anything yet; drive it with ``advance()`` or ``aadvance()``.

        With a ``store``, the run's snapshot is saved under ``run_id`` (a fresh
        id by default) after every transition the store asks for.
        """
        if not isinstance(user_input, str):
            msg = f"user_input must be a str, got {type(user_input).__name__}"
            raise TypeError(msg)
        if cancel is not None and not isinstance(cancel, CancelToken):
            msg = f"cancel must be a CancelToken, got {type(cancel).__name__}"
            raise TypeError(msg)
        messages = [Message("system", self.system)] if self.system else []
        messages.append(Message("user", user_input))
        return AgentRun(self, messages, cancel, observers, store=store, run_id=run_id)

    def resume(
        self,
        source: RunResult | dict[str, Any] | str,
        *,
        approvals: Mapping[str, bool | str] | None = None,
        retry: bool = False,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        store: Store | None = None,
        max_steps: int | None = None,
        token_budget: int | None = None,
        timeout: float | None = None,
        max_tool_calls: int | Mapping[str, int] | None = None,
    ) -> AgentRun:
        """Continue a run from a snapshot (dict or JSON text) or from a stopped or paused ``RunResult``.

        The run comes back exactly where it was, with its own limits unless
        new ones are given; no callbacks are re-fired.  A run that stopped on
        ``max_steps``, ``token_budget``, ``timeout``, ``max_tool_calls`` or
        ``cancelled`` continues if the new limits (or a fresh token) lift the
        stop, and a ``model_error`` run with ``retry=True``; the trace shows
        that as a ``resume`` edge out of ``Failed``.  Anything else is a
        ``ValueError`` saying why.
        """
        if isinstance(source, RunResult):
            if source.snapshot is None:
                msg = f"a RunResult with reason {source.reason!r} has no snapshot: only stopped or paused runs resume"
                raise ValueError(msg)
            source = source.snapshot
        data = snapshot.parse(source)
        limits = snapshot.limits_of(
            data, max_steps=max_steps, token_budget=token_budget, timeout=timeout, max_tool_calls=max_tool_calls
        )
        run = AgentRun(self, [], cancel, observers, limits=limits, store=store, run_id=data.get("run_id"))
        run._restore(data, self.table.states)  # noqa: SLF001 - the agent builds its own runs
        if run.state is State.Done:
            msg = "the run finished in Done; there is nothing to resume"
            raise ValueError(msg)
        if run.state is State.Failed:
            run.retry_model = retry
            if not self.machine.try_fire(run, RESUME):
                msg = (
                    f"the run stopped with {run.reason!r}, which these limits do not lift "
                    f"(counters {run.counters()}); resumable stops: max_steps, token_budget, timeout, "
                    "max_tool_calls, cancelled, and model_error with retry=True, each only while no other "
                    "limit forbids the next call"
                )
                raise ValueError(msg)
            if run.trace[-1].dest == State.AwaitModel:
                # A retried reply's calls never ran; the next model call must see them answered.
                run._answer_unexecuted("the reply that asked for this call was not usable")  # noqa: SLF001
            run.reason, run.evidence, run.final, run.finalizing = None, {}, "", None
            run.model_exception = None
            run._after()  # noqa: SLF001 - observers and the store see the resume edge like any other
        if approvals:
            run.decide(approvals)
        elif self.approve is not None and run.state is State.ExecuteTool:
            run.paused = run._needs_decision(run.pending[0])  # noqa: SLF001
        return run

    def run(
        self,
        user_input: str,
        *,
        cancel: CancelToken | None = None,
        log: str | Path | None = None,
        store: Store | None = None,
        run_id: str | None = None,
    ) -> RunResult:
        """Run to the end: the result on ``Done``; on a stop, what its ``on_stop`` policy says.

        ``log`` appends every transition to a JSON Lines file (see ``JsonlLog``);
        ``store`` checkpoints the run (see ``SqliteStore``).  A run paused for
        approval returns a result with ``reason == "paused"`` and a snapshot.
        """
        with _log(log) as observers:
            run = self.start(user_input, cancel=cancel, observers=observers, store=store, run_id=run_id)
            return run.finish()

    async def arun(
        self,
        user_input: str,
        *,
        cancel: CancelToken | None = None,
        log: str | Path | None = None,
        store: Store | None = None,
        run_id: str | None = None,
    ) -> RunResult:
        """Await a run to the end, like ``run``; the tool calls of one turn run concurrently."""
        with _log(log) as observers:
            run = self.start(user_input, cancel=cancel, observers=observers, store=store, run_id=run_id)
            return await run.afinish()

    def stream(self, user_input: str, *, cancel: CancelToken | None = None) -> Iterator[TransitionEvent]:
        """Yield one ``TransitionEvent`` per transition; on a stop, raise like ``run`` after yielding it."""
        events: deque[TransitionEvent] = deque()
        run = self.start(user_input, cancel=cancel, observers=[events.append])
        while not run.done:
            run.advance()
            while events:
                yield events.popleft()
        run.finish()

    async def astream(self, user_input: str, *, cancel: CancelToken | None = None) -> AsyncIterator[TransitionEvent]:
        """The async twin of ``stream``."""
        events: deque[TransitionEvent] = deque()
        run = self.start(user_input, cancel=cancel, observers=[events.append])
        while not run.done:
            await run.aadvance()
            while events:
                yield events.popleft()
        await run.afinish()


def _approval_rule(approve: Collection[str] | Callable[[ToolCall], bool] | None) -> Callable[[ToolCall], bool] | None:
    """Normalise ``approve``: a set of tool names or a predicate on the call becomes a predicate."""
    if approve is None or callable(approve):
        return approve
    if isinstance(approve, str):
        approve = {approve}
    names = frozenset(approve)
    bad = [name for name in names if not isinstance(name, str)]
    if bad:
        msg = f"approve must be tool names or a predicate on the tool call, got {bad!r}"
        raise TypeError(msg)

    def needs_approval(call: ToolCall) -> bool:
        return call.name in names

    return needs_approval


@contextlib.contextmanager
def _log(path: str | Path | None) -> Iterator[list[Observer]]:
    if path is None:
        yield []
        return
    log = JsonlLog(path)
    try:
        yield [log]
    finally:
        log.close()


def run(
    model: Model,
    registry: ToolRegistry,
    user_input: str,
    system: str = "",
    max_steps: int = 8,
    max_consecutive_failures: int = 3,
    *,
    cancel: CancelToken | None = None,
    log: str | Path | None = None,
    **options: Any,
) -> RunResult:
    """Run one conversation to the end with a throwaway ``Agent``; ``options`` are ``Agent``'s keywords.

    Raises ``AgentLoopError`` on every stop unless ``on_stop`` says otherwise.
    """
    agent = Agent(model, registry, system, max_steps, max_consecutive_failures, **options)
    return agent.run(user_input, cancel=cancel, log=log)


async def arun(
    model: Model,
    registry: ToolRegistry,
    user_input: str,
    system: str = "",
    max_steps: int = 8,
    max_consecutive_failures: int = 3,
    *,
    cancel: CancelToken | None = None,
    log: str | Path | None = None,
    **options: Any,
) -> RunResult:
    """The async twin of ``run``: awaits an async model's ``acomplete`` and runs a turn's tool calls concurrently."""
    agent = Agent(model, registry, system, max_steps, max_consecutive_failures, **options)
    return await agent.arun(user_input, cancel=cancel, log=log)
