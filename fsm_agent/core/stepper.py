"""The sans-I/O stepper: one run's position, what I/O it needs next, and the transitions each outcome implies.

It never calls a model or a tool, reads a clock, waits or saves: a driver
asks ``effect()`` what is needed (a ``ModelCall``, a ``ToolBatch`` whose calls
the before-tool guards already cleared, or ``None`` when the next transition
needs no I/O), carries it out however it likes (call, await, run on a
cluster), hands each outcome back with ``accept_*`` and fires the next
transition with ``step()``.  Outcomes of tool calls are kept by call id until
the machine replays them, and they are part of the snapshot, so a call that
completed is never made again: not after a resume, a switch of driver, or a
retry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fsm_agent.core import hand_down, ledger, reply_checks
from fsm_agent.core.approval import ApprovalGate, check_approvals, rule_name
from fsm_agent.core.batch import plan_batch
from fsm_agent.core.effects import CheckOutput, CompactHistory, Effect, ModelCall, ToolBatch
from fsm_agent.core.exchanges import ExchangeLog
from fsm_agent.core.firing import FINALIZE_INSTRUCTION as FINALIZE_INSTRUCTION
from fsm_agent.core.firing import fire
from fsm_agent.core.history import compaction_problem
from fsm_agent.core.late_decisions import not_pending, on_ended_run
from fsm_agent.core.output_kinds import Invalid
from fsm_agent.core.outside import CutWithRun, OutsideEvents
from fsm_agent.core.result import conclude, evidence_for
from fsm_agent.core.settings import AgentSettings
from fsm_agent.definition.guards import HOLDS
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import TERMINAL, AwaitModel, CheckTruncation, Dispatch, ExecuteTool, State
from fsm_agent.definition.stops import ConditionError
from fsm_agent.definition.table import Row, first_row
from fsm_agent.definition.triggers import CHECK, DISPATCH, MODEL_FAILED, REPLIED, START, TOOL_DONE
from fsm_agent.definition.views import MessagesView
from fsm_agent.errors import DecisionError, RunStateError
from fsm_agent.records import ModelResponse, Step, ToolCall, Transition
from fsm_agent.tools import JSONSchema, ToolResult

_START = (AwaitModel, START)


_NOWHERE: frozenset[State] = frozenset()


class Stepper(ApprovalGate, OutsideEvents, ExchangeLog):
    """The pure core of one run; every driver carries out its effects."""

    __slots__ = (
        "_cut",
        "_messages",
        "_start",
        "_took",
        "approve",
        "compact",
        "finalize_from",
        "output",
        "price",
        "run",
        "schemas",
        "walker",
    )

    def __init__(
        self,
        run: Run,
        settings: AgentSettings,
        schemas: list[JSONSchema],
        rows: Mapping[tuple[State, str], Sequence[Row]],
    ) -> None:
        """The stepper of ``run`` under its agent's ``settings``: ``schemas`` are the tools the model is offered.

        ``rows`` are those the run walks: its table's without the rows that cannot fire for it (``Agent.rows_for``).
        """
        self.run = run
        run.rows = rows
        # The settings a step reads, held as the stepper's own attributes: they are read on every turn.
        self.walker, self.approve = settings.walker, settings.approve
        output = self.output = settings.output
        self.compact = settings.compact
        self.price = settings.pricing
        if output is not None:
            run.output_retry_limit = output.retries
        self.schemas = schemas
        # Finalize is tried only where a stop with that policy is checked, so other runs pay nothing for it.
        self.finalize_from = settings.walker.finalize_sources(run.policies) if run.policies else _NOWHERE
        # A live view, so one serves every model call of the run.
        self._messages = MessagesView(run.talk.messages)
        # The start row effect() found, which step() takes without asking its guards (a user's check) again.
        self._start: Row | None = None
        # The sub-agent calls cut with the run (CutWithRun), each with the trigger of its stop, until step() stops.
        self._cut: dict[str, str] = {}
        self._took = set()  # sub-agent calls whose child took what was handed down (handed_down), until answered
        ExchangeLog.__init__(self)

    # --- what is needed -------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once the run is in ``Done`` or ``Failed``."""
        return self.run.at.state in TERMINAL

    @property
    def paused(self) -> bool:
        """True while the next tool call waits for a person's decision (the hold ``HOLDS`` declares for the state)."""
        run = self.run
        hold = HOLDS.get(run.at.state) if run.calls.to_approve else None
        return hold is not None and hold(run)

    @property
    def gated(self) -> bool:
        """Whether this run can pause: its agent asks for approvals, or it holds calls that wait for one."""
        return self.approve is not None or bool(self.run.calls.to_approve)

    def decide(self, approvals: Mapping[str, bool | str], run_id: str) -> None:
        """``ApprovalGate.decide``; on a run that ended, or for a call it no longer holds, a ``DecisionError`` saying
        what became of each call, none kept.  Deciding nothing is nothing, on any run."""
        check_approvals(approvals)
        first = next(iter(approvals), None)
        if first is None:
            return
        if self.run.at.state in TERMINAL:
            raise DecisionError(run_id, first, on_ended_run(self.run, approvals, self.approve))
        if gone := not_pending(self.run, approvals, self.approve):
            raise DecisionError(run_id, *gone)
        super().decide(approvals, run_id)

    def effect(self, *, parallel: bool = False) -> Effect | None:
        """The I/O the next transition needs, or None (none needed, or the run is finished or paused).

        With ``parallel``, a ``ToolBatch`` holds every call of the turn that
        may run now; planning more than one freezes the run's clock and
        cancel flag until the batch is replayed, so the replay takes the
        edges the plan assumed.
        """
        run = self.run
        state = run.at.state
        if state is AwaitModel:
            if run.at.replied is not None:
                return None
            # Most runs have no start rows at all (no deadline, cancel token or input guardrail): none to look at.
            if run.counts.turns == 0 and run.rows.get(_START) and self._start_row() is not None:
                return None
            tools = [] if run.at.finalizing is not None else self.schemas
            if run.talk.context_head is None:
                return ModelCall(self._messages, tools, run.counts.turns + 1)
            return self._compacted_call(tools)
        if state is Dispatch:
            return None if self.output is None else self._answer_check()
        if state is not ExecuteTool or (run.calls.to_approve and self.paused):
            return None
        call = run.calls.pending[0]
        approvals = run.calls.approvals  # _rejected, inlined: only a run with decisions can hold a rejection
        if call.id in run.calls.ran or (approvals and approvals.get(call.id, True) is not True):
            return None
        if self._cut and call.id in self._cut:
            return None  # a sub-agent call cut with the run: the run stops here (step), it is not made again
        if run.calls.carried and self._carry(call):
            return None  # the source run's outcome of the same call is taken: nothing to do but replay it
        if not parallel:
            return ToolBatch((call,))
        batch = plan_batch(run, self._cleared)
        batch = [c for c in batch if c.id not in run.calls.ran and not (run.calls.carried and self._carry(c))]
        if len(batch) > 1:
            run.at.frozen, run.at.held = True, (None, None)
        return ToolBatch(tuple(batch))

    def _carry(self, call: ToolCall) -> bool:
        """On a fork: take the source run's outcome of a call with ``call``'s tool and arguments, if one is left.

        The call was made on the source's branch after the fork point, so it is
        not made again: its outcome is kept like one that just ran, marked with
        where it came from (``reused_from``), and each carried outcome serves once.
        """
        run = self.run
        outcome = hand_down.take_carried(run, call)
        if outcome is None:
            return False
        run.calls.ran[call.id] = outcome
        self._log_tool(call, outcome)
        return True

    def _compacted_call(self, tools: list[JSONSchema]) -> ModelCall | CompactHistory:
        """The model call of a run whose history was compacted (or the compaction, while it is due)."""
        run = self.run
        messages = tuple(run.talk.context_head or ()) + tuple(run.talk.messages[run.talk.context_start :])
        if run.talk.compacting:
            assert self.compact is not None  # only an agent with compact= takes the compaction edge
            return CompactHistory(messages, self.compact)
        self.will_send(messages)
        return ModelCall(messages, tools, run.counts.turns + 1)

    def accept_compaction(self, result: object) -> None:
        """The history was compacted to ``result`` (or compacting raised it): the call is made again, or stops."""
        run = self.run
        if run.at.state is not AwaitModel or not run.talk.compacting:
            msg = f"the run is in {run.at.state} and waits for no compaction"
            raise RunStateError(msg)
        run.talk.compacting = False
        problem = compaction_problem(result)
        if problem is not None:
            # The overflow stands and is not compacted again: the next step stops the run with context_overflow.
            run.talk.compact_error, run.counts.compacted_turn = problem, run.counts.turns - 1
            run.at.replied = MODEL_FAILED
            return
        assert isinstance(result, list)  # compaction_problem checked it
        run.talk.compact_error = ""  # an earlier attempt's failure no longer describes the run
        before = len(run.talk.context_head or ()) + len(run.talk.messages) - run.talk.context_start
        run.talk.context_head, run.talk.context_start, run.counts.compacted_turn = (
            list(result),
            len(run.talk.messages),
            run.counts.turns,
        )
        run.talk.steps.append(
            Step(run.counts.turns - 1, "compaction", f"{before} messages -> {len(result)}", run.counters())
        )

    def _answer_check(self) -> CheckOutput | None:
        """The check a typed agent's final answer needs, once per answer; None for a reply with tool calls."""
        run, output = self.run, self.output
        answer = run.talk.last_response
        if output is None or run.talk.output_checked or answer is None or answer.message.tool_calls:
            return None
        return CheckOutput(answer.message.content, output)

    def _start_row(self) -> Row | None:
        """The ``start`` row that holds before the first call: cancelled, out of time, or an input guardrail tripped.

        Kept until ``step()`` takes it, so an input check is asked once per
        run, not once for the look and again for the move.
        """
        row = self._start
        if row is None:
            run = self.run
            try:
                row = first_row(run, START)
            except ConditionError as exc:
                run.faults.condition_error, run.faults.condition_name = exc.error, exc.name
                row = first_row(run, START)
            self._start = row
        return row

    # --- outcomes -------------------------------------------------------------------------------------------

    def accept_reply(self, response: object) -> None:
        """The model replied: count the turn and keep the reply; ``step()`` then moves on (or stops)."""
        run = self.run
        if run.at.state is not AwaitModel or run.at.replied is not None:
            self._expect(AwaitModel)
        run.counts.turns += 1
        problem = reply_checks.malformed(response)
        if problem is not None:
            self._log_model(None, f"TypeError: {problem}")
            ledger.count_unmetered(run, self.price)
            run.faults.model_exception, run.at.replied = TypeError(problem), MODEL_FAILED
            return
        assert isinstance(response, ModelResponse)  # malformed() checked it; this tells the type checker
        self._log_model(response, None)
        problem = ledger.record_reply(run, response, self.price)
        if problem is not None:
            # The reply is kept (messages, pending calls), but it cannot be acted on; the log entry just written
            # for it keeps it as a snapshot can hold it.
            self._log_unusable(reply_checks.as_kept(response))
            run.faults.model_exception, run.at.replied = ValueError(problem), MODEL_FAILED
            return
        if self.approve is not None and run.calls.pending:
            try:
                self.gate()
            except Exception as exc:  # noqa: BLE001 - the user's predicate: a stop_condition_error (RULE_RAISED)
                run.faults.condition_error, run.faults.condition_name = exc, rule_name(self.approve)
        run.at.replied = REPLIED

    def accept_model_error(self, error: BaseException, streamed: str = "") -> None:
        """The model call (already made, so counted) raised: a ``model_error`` stop at the next ``step()``.

        ``streamed`` is the text a streaming model had shown of the reply
        before it broke: the stop's evidence keeps it, as the reader saw it.
        """
        self._expect(AwaitModel)
        self.run.faults.streamed = streamed
        self.run.counts.turns += 1
        ledger.count_unmetered(self.run, self.price)
        self._log_model(None, f"{type(error).__name__}: {error}")
        self.run.faults.model_exception = error
        self.run.at.replied = MODEL_FAILED

    def accept_output(self, value: object) -> None:
        """The answer was checked: its value, or an ``Invalid`` saying why not; ``step()`` then takes the edge."""
        run = self.run
        if run.at.state is not Dispatch or self.output is None or run.talk.output_checked:
            msg = f"the run is in {run.at.state} and waits for no output check"
            raise RunStateError(msg)
        run.talk.output_checked = True
        if isinstance(value, Invalid):
            run.talk.output_problem = (value.errors, value.retryable)
        else:
            run.talk.output, run.talk.output_plain = value, self.output.plain(value)

    def accept_tool(self, call: ToolCall, outcome: ToolResult) -> None:
        """A tool call finished: keep its outcome by call id until the machine replays it."""
        pending = self.run.calls.pending
        if not (pending and pending[0].id == call.id) and not any(waiting.id == call.id for waiting in pending):
            msg = f"no pending tool call has id {call.id!r}"
            raise RunStateError(msg)
        if isinstance(outcome, CutWithRun):
            self._took.discard(call.id)
            if outcome.spent is not None and outcome.child is not None:  # child_runs builds it whole
                self.children_cut({call.id: (outcome.spent, outcome.child, outcome.done)})
            self._cut[call.id] = outcome.trigger
            return
        self.answered(call)
        self.run.calls.ran[call.id] = outcome
        self._log_tool(call, outcome)

    def _expect(self, state: State) -> None:
        if self.run.at.state is not state or self.run.at.replied is not None:
            msg = f"the run is in {self.run.at.state}; this outcome belongs to {state}"
            raise RunStateError(msg)

    # --- transitions ----------------------------------------------------------------------------------------

    def step(self) -> Transition:
        """Fire exactly one transition that needs no further I/O, and return the edge taken."""
        run = self.run
        state = run.at.state
        # The states in the order a turn meets them most: a terminal run is caught after the three cheap checks.
        if state is CheckTruncation:
            trigger = CHECK
        elif state is Dispatch:
            trigger = DISPATCH
        elif state is AwaitModel:
            replied = run.at.replied
            if replied is None:  # before the first model call: a start row
                return self._take_start()
            trigger, run.at.replied = replied, None
        elif state in TERMINAL:
            msg = f"the run already finished in {state} (reason {run.at.reason!r}); start a new run"
            raise RunStateError(msg)
        elif self._cut and run.calls.pending[0].id in self._cut:
            # The cancel or the deadline cut a sub-agent call: the run stops with it.
            cut = run.calls.pending[0].id
            trigger, self._cut = self._cut[cut], {}
            return self.interrupt(trigger, cut)
        else:
            self._replay_tool()
            trigger = TOOL_DONE
        return fire(self, trigger)

    def _take_start(self) -> Transition:
        """The ``start`` row ``effect()`` found before the first model call."""
        run = self.run
        row = self._start_row() if run.counts.turns == 0 else None
        if row is None:
            msg = "the run needs a model call first: carry out effect() and accept its outcome"
            raise RunStateError(msg)
        # No finalize answers a start row (nothing to finalize before the first call): the row is taken.
        self._start = None
        entry = self.walker.take(run, row)
        if row.dest in TERMINAL:
            conclude(run)
        return entry

    def _replay_tool(self) -> None:
        """Record the outcome of the call about to leave ``ExecuteTool``: its result, or its rejection."""
        run = self.run
        call = run.calls.pending[0]
        approvals = run.calls.approvals  # only a run with decisions can hold a rejection: the others skip asking
        decision = approvals.get(call.id, True) if approvals else True
        outcome = run.calls.ran.pop(call.id, None) if decision is True else self._rejection_result(call, decision)
        if decision is not True:
            self.answered(call)  # rejected: what was handed down for it no child takes
        if outcome is None:  # nothing was changed, so the decision given for the call is kept
            reason = "waits for a person's decision" if self.paused else "has not run yet"
            msg = f"tool call {call.name} ({call.id}) {reason}: carry out effect() and accept its outcome"
            raise RunStateError(msg)
        if approvals:
            approvals.pop(call.id, None)
        if run.calls.to_approve:
            run.calls.to_approve.discard(call.id)
        run.calls.pending.popleft()
        if run.at.frozen and not any(waiting.id in run.calls.ran for waiting in run.calls.pending):
            self.thaw()  # the batch's last outcome: its checks before the next model call see the time and a cancel
        ledger.record_tool(run, call, outcome)

    def interrupt(self, trigger: str, unfinished: str | None, streamed: str = "") -> Transition:
        """A call was given up (the task was cancelled, or the deadline passed): stop on ``trigger``.

        ``unfinished`` names the call that was in flight, or is None when the
        time was up before the call could start, so none was made.  A model
        call's ``streamed`` text (what a streaming model had shown of it) is
        kept for the stop's evidence.
        """
        run = self.run
        if run.at.frozen:
            self.thaw()  # the batch was cut: its stop sees the time and a cancel held since its plan
        in_flight = run.at.state is AwaitModel and run.at.replied is None and unfinished is not None
        if in_flight:
            run.counts.turns += 1  # the call was made, and may be billed
        run.faults.streamed = streamed if in_flight else ""
        run.at.replied = None
        run.at.unfinished = unfinished
        return fire(self, trigger)

    def evidence(self, reason: str) -> dict[str, Any]:
        """The evidence the stop ``reason`` would have now."""
        return evidence_for(self.run, reason)
