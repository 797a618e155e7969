"""Firing a trigger: find the row it takes with the one row walker, then move the run along that row.

``fire`` is the whole interpreter: ``first_row`` looks up the rows of the
run's state and trigger and evaluates each guard in order; the first that
holds is taken.  A user's ``StopCondition`` that raises is recorded and the
walk is tried once more, where the ``stop_condition_error`` row now holds.
``take`` moves along the row: the state, the trace and, into ``AwaitModel``
or a terminal state, the frozen flag and the run's conclusion; a stop whose
policy is ``finalize`` is answered by the finalize edge instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsm_agent.core import ledger
from fsm_agent.core.coverage_watch import WATCHERS, notify
from fsm_agent.core.result import conclude
from fsm_agent.definition.derived import compacts_history
from fsm_agent.definition.states import TERMINAL, AwaitModel
from fsm_agent.definition.stops import ConditionError
from fsm_agent.definition.table import Row, first_row
from fsm_agent.definition.triggers import FINALIZE
from fsm_agent.records import Message, Transition

if TYPE_CHECKING:
    from fsm_agent.core.stepper import Stepper

FINALIZE_INSTRUCTION = (
    "The run has to stop now ({reason}). Do not call any tool. "
    "Give your best final answer from what you already have, and say what is missing."
)


def fire(stepper: Stepper, trigger: str) -> Transition:
    """Take the row ``trigger`` takes from the run's state (or the finalize edge its stop asks for)."""
    run = stepper.run
    try:
        row = first_row(run, trigger)
    except ConditionError as exc:
        run.faults.condition_error, run.faults.condition_name = exc.error, exc.name
        row = first_row(run, trigger)
    return take(stepper, row, trigger)


def take(stepper: Stepper, row: Row | None, trigger: str) -> Transition:
    """Move the run along ``row`` (found by the walk), or the finalize edge its stop's policy asks for."""
    run = stepper.run
    if row is None:
        # Unreachable for a validated table (every trigger ends in a fallback) except for guard-only
        # triggers, which are only fired after checking one of their rows applies.
        msg = f"no row fired for trigger {trigger!r} in state {run.at.state}"
        raise AssertionError(msg)
    reason = row.reason
    if (
        reason is not None
        and run.at.finalizing is None
        and run.at.state in stepper.finalize_from
        and run.policies.get(reason) == "finalize"
    ):
        finalize = _finalize(stepper, reason)
        if finalize is not None:
            run.at.frozen = False  # the finalize edge leads back to AwaitModel, where a planned batch ends
            return finalize
    entry = row.entry
    dest = run.at.state = row.dest
    run.at.trace.append(entry)
    if WATCHERS:
        notify(entry)
    if dest in TERMINAL:
        run.at.frozen = False
        conclude(run)
    elif dest is AwaitModel:
        run.at.frozen = False
        if row.asks_again:
            ledger.send_back(run, stepper.output)
        elif row.guard is compacts_history:
            run.talk.compacting = True
            if run.talk.context_head is None:
                run.talk.context_head, run.talk.context_start = [], 0
    return entry


def _finalize(stepper: Stepper, reason: str) -> Transition | None:
    """Answer the stop ``reason`` with one last model call without tools, if a finalize row allows it."""
    run = stepper.run
    evidence = stepper.evidence(reason)
    entry = stepper.walker.try_fire(run, FINALIZE)
    if entry is not None:
        also_ran = ledger.answer_unexecuted(run, f"the run stopped ({reason}) before this call")
        if also_ran:  # a parallel batch's calls that came back are kept, not denied
            evidence["also_ran"], evidence["counters"] = also_ran, run.counters()
        run.at.finalizing, run.at.finalize_evidence = reason, evidence
        run.talk.messages.append(Message("user", FINALIZE_INSTRUCTION.format(reason=reason)))
    return entry
