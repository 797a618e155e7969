"""What every driver shares: the run handle, its clock and cancel token, checkpoints and results (events: ``watched``).

A driver differs from another only in how it carries out the stepper's
effects (call, await, ...); everything it does before and after an effect,
and around each transition, lives here once (the ``httpx.BaseClient``
shape), so the sync and async paths cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from fsm_agent.core import snapshot
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.output import past_deadline
from fsm_agent.core.outside import CutWithRun
from fsm_agent.core.result import make_result, pause_of
from fsm_agent.core.stepper import Stepper
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.run import Counters, Run
from fsm_agent.definition.states import TERMINAL, Done, ExecuteTool, Failed, State
from fsm_agent.definition.triggers import EXPIRED
from fsm_agent.drivers.checks import check_children_priced
from fsm_agent.drivers.cut_in_call import CutInCall
from fsm_agent.drivers.position import MadeWhenRead, ReadThrough
from fsm_agent.drivers.stored import journal_for
from fsm_agent.drivers.watched import Observer
from fsm_agent.errors import AgentLoopError, RunLeasedError, RunStateError
from fsm_agent.records import Message, RunResult, Step, ToolCall, Transition
from fsm_agent.tools import RunContext, ToolResult
from fsm_agent.tools.context import deps_types, refuse_deps

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.drivers.agent_run import AgentRun
    from fsm_agent.drivers.cut_spend import InFlight
    from fsm_agent.persist.store import Store
    from fsm_agent.records import ChildOutcome


class RunBase(CutInCall):
    """One run of an agent: the stepper plus everything around it that is not waiting."""

    # Most runs never change these, so they are read from the class until a run sets its own: every attribute
    # set in __init__ costs each run, and past 30 of them Python 3.11 gives each run a dict of its own.
    _deferred = False  # the async driver's: it awaits the checkpoint write
    _closing: Transition | None = None  # taken while deferred, closed once its checkpoint is awaited
    forked_from: tuple[str | None, int] | None = None
    """A fork's source run and the transition it was taken after (``Agent.fork``); None for any other run."""
    _start_id: str | None = None  # a resumed run's or a sub-agent's, given; else made when first read
    _deps: Any = None  # the application's objects for the run's code (deps=): on this object only, never stored
    # The sub-agent calls in flight, by call id: what their children's runs spent and completed (drivers.cut_spend).
    _flying: dict[str, InFlight] | None = None
    # The sub-agent calls whose child run raised owing a store write, by call id: driven on when the call is made
    # again, with what the parent counted of it (drivers.child_runs._keep_owing).
    _owing_children: dict[str, tuple[AgentRun, ChildOutcome | None]] | None = None

    def __init__(
        self,
        agent: Agent,
        position: Run,
        *,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        store: Store | None = None,
        run_id: str | None,
        start_id: str | None = None,
        session: str | None = None,
        parent: Mapping[str, str] | None = None,
        deps: Any = None,
        forked_from: tuple[str | None, int] | None = None,
        request: str | None = None,
    ) -> None:
        self.position = position
        if position.calls.ran:  # a run cut mid-batch: the owner that cut it heard these calls end (watched._heard)
            self._heard = set(position.calls.ran)
        if deps is not None:
            if parent is None:  # a sub-agent's run is handed them by its parent's, mid-call: its tools say so
                refuse_deps(agent.registry.cached("deps_types", deps_types), deps)
            self._deps = deps
        # Each run walks only the rows that can fire for it: a guard of a limit it does not have is left out.
        parts = agent.run_parts  # (tools version, sub-agents, dormant guards, schemas): read, not called, as most runs
        _, self._children, unused, schemas = parts if parts[0] == agent.registry.version else agent.refresh_parts()
        if self._children and position.limits.cost_budget is not None:
            # Each run under a budget (a sub-agent's share too): a sub-agent's own tools may have changed since.
            check_children_priced(self._children)
        rows = agent.rows_for(position, cancel is not None, unused)
        # agent.tool_schemas(), from the parts: a list of this run's own.
        settings = self._settings = agent.settings
        self.stepper = Stepper(position, settings, list(schemas), rows)
        self._run_id = run_id
        if start_id is not None:
            self._start_id = start_id
        self.agent = agent
        self._model = agent.model
        self._registry = agent.registry
        hooks = self._hooks = agent.hooks
        self._observers = tuple(observers)
        # Building events costs time, so a run nobody watches builds none.
        hooked = hooks.active  # bool(hooks), without its call
        self._observed = hooked or bool(self._observers)
        # A model streams only when someone reads its text as it comes; otherwise its plain call is made.
        self._wants_text = hooked and bool(hooks.get("text"))
        self._shown = []
        self._store = store
        # The run's ownership and journal in the store; the async driver sets _deferred and awaits the write.
        self._journal = (
            None
            if store is None
            else journal_for(store, self.run_id, self.start_id, session, parent, forked_from, request)
        )
        if forked_from is not None:  # most runs are no fork: the class's None serves them
            self.forked_from = forked_from
        # Whether the run is told the time (and its cancel flag) before every transition, or only after each
        # call.  A deadline, a cancel token, observers and a store need the former; otherwise only the
        # counters read the time, and between two calls it moves by the engine's own microseconds.
        self._clock_each_transition = (
            position.limits.timeout is not None or cancel is not None or self._observed or store is not None
        )
        self._cancel = cancel
        self._clock = settings.clock
        self._started = self._clock() - position.counts.elapsed
        self._result: RunResult | None = None

    # --- reading the run --------------------------------------------------------------------------------------

    run_id = MadeWhenRead()
    """The run's id in stores, snapshots and events; a fresh random one unless one was given."""
    start_id = MadeWhenRead()
    """This start of the run (``RunContext.start_id``): fresh at each start, kept by a resume and a take-over."""

    @property
    def state(self) -> State:
        """The state the run is in."""
        return self.position.at.state

    @property
    def done(self) -> bool:
        """True once the run is in ``Done`` or ``Failed``."""
        return self.position.at.state in TERMINAL

    @property
    def paused(self) -> bool:
        """True while the next tool call waits for a person's decision (see ``decide``)."""
        return self.stepper.paused

    @property
    def messages(self) -> list[Message]:
        """The conversation so far."""
        return self.position.talk.messages

    @property
    def steps(self) -> list[Step]:
        """The steps taken so far."""
        return self.position.talk.steps

    @property
    def trace(self) -> list[Transition]:
        """The edges taken so far."""
        return self.position.at.trace

    @property
    def pending(self) -> Sequence[ToolCall]:
        """Tool calls of the current turn not executed yet (the next one first)."""
        return tuple(self.position.calls.pending)

    @property
    def reason(self) -> str | None:
        """The stop reason (``"done"`` after a natural finish), once the run is over."""
        return self.position.at.reason

    # The run's counters read through the handle (``run.turns``).  Named one by one rather than by a
    # ``__getattr__``, which would slow down every attribute read of the driver's own hot loop.
    limits = ReadThrough[Limits]()
    turns = ReadThrough[int](record="counts")
    tool_calls = ReadThrough[int](record="counts")
    failures = ReadThrough[int](record="counts")
    tokens = ReadThrough[int](record="counts")
    input_tokens = ReadThrough[int](record="counts")
    output_tokens = ReadThrough[int](record="counts")
    elapsed = ReadThrough[float](record="counts")
    finalizing = ReadThrough["str | None"](record="at")
    recent = ReadThrough[Sequence[tuple[tuple[str, str], str]]](record="counts")

    def counters(self) -> Counters:
        """Every counter against its limit, ``[used, limit]``."""
        return self.position.counters()

    def run_context(self, call: ToolCall | None = None) -> RunContext[Any]:
        """What this run's code is told of it (``RunContext``): its deps, id, usage so far, and ``call`` if given."""
        counts = self.position.counts
        usage = counts.usage()
        call_id, name = (None, None) if call is None else (call.id, call.name)
        return RunContext(self._deps, self.run_id, call_id, usage, name, counts.turns, self.start_id)

    def has_deadline(self) -> bool:
        """Whether the run has a ``timeout``, at which a call in flight is abandoned (see ``tools.context``)."""
        return self.position.limits.timeout is not None

    @property
    def result(self) -> RunResult:
        """The run's result; only available once the run is in ``Done`` or ``Failed``."""
        if self._result is None:
            msg = f"the run is in {self.state}, not finished; advance() it to Done or Failed first"
            if self._closing is not None:
                msg = f"the run's move into {self.state} is not written to its store yet: finish() it again"
            raise RunStateError(msg)
        return self._result

    # --- approval and snapshots ---------------------------------------------------------------------------

    def awaiting(self) -> list[ToolCall]:
        """The tool calls of this turn that need approval and have no decision yet."""
        return self.stepper.awaiting()

    def decide(self, approvals: Mapping[str, bool | str]) -> None:
        """Record decisions on calls awaiting approval: ``True`` runs it, ``False`` or a reason text rejects it.

        A run that ended (``Done`` or stopped in ``Failed``) takes none: a
        ``DecisionError`` says what became of each call, and the run is left as
        it was; a stopped run's pending calls are decided by the resume that
        lifts its stop (``Agent.resume(result, approvals=...)``).
        """
        self.stepper.decide(approvals, self.run_id)

    def snapshot(self) -> dict[str, Any]:
        """The run's whole position as a JSON-ready dict, for ``Agent.resume`` here or in another process."""
        self._observe()
        # With a store, the version it matches (a resume there checks nobody wrote since) and its session.
        extra = {} if self._journal is None else self._journal.stamp()
        if self.forked_from is not None:
            extra["forked_from"] = list(self.forked_from)
        return snapshot.dump(self.position, run_id=self.run_id, start_id=self.start_id, paused=self.paused, **extra)

    # --- around each effect and transition ---------------------------------------------------------------

    def _check_live(self) -> None:
        if self.done:
            run = self.position
            msg = f"the run already finished in {run.at.state} (reason {run.at.reason!r}); start a new run"
            raise RunStateError(msg)
        if self.paused:
            waiting = ", ".join(f"{c.name} ({c.id})" for c in self.awaiting())
            msg = f"the run is paused until a person decides on: {waiting}; use decide({{call_id: True|False|'why'}})"
            raise RunStateError(msg)

    def _observe(self) -> None:
        """Tell the stepper the time and whether the run was cancelled (a planned batch keeps what it planned with)."""
        stepper = self.stepper
        stepper.tell_time(self._clock() - self._started)
        token = self._cancel
        if token is not None and token.cancelled:
            stepper.cancel(token.why)

    def _remaining(self) -> float | None:
        """Seconds left before the run's timeout; None without one, and for the finalize call.

        A finalize call answers a stop that already happened (often the
        timeout itself), so the deadline no longer bounds it.
        """
        run = self.position
        timeout = run.limits.timeout
        if timeout is None or run.at.finalizing is not None:
            return None
        return max(timeout - (self._clock() - self._started), 0.0)

    def _out_of_time(self) -> bool:
        """The deadline passed before the next call could start, so it must not be made.

        The before-call checkpoints catch this too, but time also passes
        between two ``advance()`` calls; deciding here, not by racing a call
        against a deadline of zero, keeps both drivers on the same edge.
        """
        run = self.position
        timeout = run.limits.timeout
        # _remaining() <= 0, read as the deadline guard reads it, without its call and max() before every call.
        return timeout is not None and run.at.finalizing is None and self._clock() - self._started >= timeout

    def _step(self) -> Transition:
        """Fire the next transition (the effect, if any, was carried out and the run told the time) and close it."""
        if self._observed and self.position.at.state is ExecuteTool:
            return self._after(self._tool_step())
        return self._after(self.stepper.step())

    def _checked(self, checked: Any, remaining: float | None) -> Transition | None:
        """Hand the stepper a typed answer's check; if the deadline cut the check (``remaining`` was set), the stop.

        The time and a cancel are read first, deadline or not: a validator can
        take long, and the retry row must see a cancel that came meanwhile.
        """
        self._observe()
        expired, in_flight = past_deadline(checked)
        if expired:
            return self._interrupt(EXPIRED, in_flight)
        self.stepper.accept_output(checked)
        return None

    def _accept_tool(self, call: ToolCall, outcome: ToolResult) -> None:
        """Hand the stepper a call's outcome; a sub-agent call cut with the run is then no longer in flight.

        Why here: on the sync driver with a deadline this runs with the run
        held (``SyncDriver._take_back``), so a cut of the run from the caller's
        thread either finds the call in flight (and counts its child) or finds
        it counted here, never neither.
        """
        flying = self._flying
        if flying and isinstance(outcome, CutWithRun):  # a later cut of the run must not count its child again
            self._flying = {call_id: child for call_id, child in flying.items() if call_id != call.id}
        self.stepper.accept_tool(call, outcome)

    def _still(self) -> AbstractContextManager[object]:
        """Hold the run between two consistent points while another thread reads it (a parent's cut).

        Here nothing to hold: only the sync driver runs a run on a thread of
        its own (a deadline's worker), and it holds the run there.
        """
        return nullcontext()

    def _interrupt(self, trigger: str, unfinished: str | None) -> Transition:
        """Record a call given up in flight (task cancelled, deadline passed) as the stop it is."""
        self._observe()
        flying = self._flying
        if flying:  # sub-agent calls given up with it: what their runs spent is the run's (drivers.cut_spend)
            self._flying = None  # first: a parent reading this run's spend never counts these twice
            cut = {}
            for call_id, child in flying.items():
                # What it completed before what it spent: a tool call it completes in between (its thread goes
                # on, on the sync driver) is then counted and made again, never handed down uncounted.
                done = child.done()
                cut[call_id] = (*child.spent(), done)
            self.stepper.children_cut(cut)
        if self._observed and self.position.at.state is ExecuteTool:
            self._batch_cut_events()
        return self._after(self.stepper.interrupt(trigger, unfinished, self._take_shown()))

    def _after(self, entry: Transition) -> Transition:
        """Close the transition just taken: checkpoint (awaited in ``_asave``), build a result, notify observers.

        Checkpoint first: a result's snapshot names its stored version, and observers hear of a transition the
        store writes only once it is kept.  One a store skips (``every="call"`` or ``"turn"``) is written by the
        next write, or by a Ctrl-C inside a call (``_keep_cut``); a run left by an interrupt anywhere else is
        resumed by its next owner from the write before, and those transitions are heard of again (an interrupt
        there may have cut a change to the run in the middle, which must not be stored).
        """
        journal = self._journal
        if journal is not None:
            self._closing = entry  # until its checkpoint is kept: a write that fails is made first when driven again
            if self._deferred:
                return entry
            journal.save(self.position, self.paused)
            self._closing = None
        self._close(entry)
        return entry

    @property
    def owes_a_write(self) -> bool:
        """Whether a store write of this run, or of a sub-agent's run it holds, failed and is owed.

        Driven on, such a run writes it before anything else; taken over from
        its store by another object, it would make the calls that write held
        again.  So whoever holds it keeps it (``kept_after``).
        """
        journal = self._journal
        return journal is not None and (journal.owed or bool(self._owing_children))

    def kept_after(self, exc: BaseException) -> bool:
        """Whether whoever holds this run keeps it after ``exc``: it owes a write, and ``exc`` is no refusal.

        A parent keeps its child (``child_runs._keep_owing``), a ``Session``
        its turn.  Not after ``RunLeasedError`` (``StaleRunError`` too) or a
        ``KeyError`` for a run gone from its store: it is another owner's now,
        or gone, and is taken over or started as usual.
        """
        return self.owes_a_write and not isinstance(exc, RunLeasedError | KeyError)

    def _close_owed(self) -> Transition:
        """The transition whose checkpoint failed (``_closing``): written now, then closed, before the run goes on.

        A store error out of a write (a dropped connection, a full disk)
        leaves the run a transition ahead of its store; driven again, the run
        writes it before anything else, so no call is made on a run whose
        store lacks what came before it, and a run that ended returns its
        result.  ``AsyncDriver._asave`` is the same, awaited.
        """
        entry, journal = self._closing, self._journal
        assert entry is not None  # the drivers call it only then
        assert journal is not None  # only a stored run defers a close
        journal.save(self.position, self.paused)
        self._closing = None
        self._close(entry)
        return entry

    def _close(self, entry: Transition) -> None:
        if self.position.at.state in TERMINAL:
            self._result = self._make_result()
        if self._observed:
            self._emit(entry)
            self._response = self._call = self._outcome = None
            self._error = None

    def _make_result(self) -> RunResult:
        run = self.position
        data = None if run.at.state is Done else self.snapshot()
        return make_result(run, run.at.reason or "unknown", run.at.evidence, tuple(run.calls.pending), data)

    def _paused_result(self) -> RunResult:
        evidence, waiting = pause_of(self.position)
        return make_result(self.position, "paused", evidence, waiting, self.snapshot())

    def _outcome_of_run(self) -> RunResult:
        result = self._result
        if result is None:
            result = self.result  # which says why there is none
        run = self.position
        if run.at.state is Failed and run.policies.get(result.reason, "raise") != "return":
            cause = run.faults.model_exception or run.faults.hook_error or run.faults.condition_error
            raise AgentLoopError(result.reason, result) from cause
        return result
