"""Batch planning: which calls of a turn may run together, decided by ``Dispatch``'s own rows.

The plan walks ``Dispatch`` with the one row walker on a copy of the run,
after ``count_call`` has done to the copy what each earlier call of the batch
will have done, so the batch is exactly the calls the machine would let run
one after another, given the clock and cancel token as they are now (the
stepper freezes both until the batch is replayed).  A user's check on
``Dispatch`` (an opaque guard) reads the run as it is, messages and all,
which the copy does not carry forward: with one, a batch is its first call
alone, so the check is asked before each call as on the sync driver.  What a call's result
decides (``tool_failures``, ``cycle``) cannot be known before it runs: those
stops may fire in the middle of a replayed batch, and the later calls, which
already ran, are kept and recorded.

A sub-agent call in a batch takes its share of the parent's tool calls
while the batch runs; ``unrun`` names the calls of the batch it must leave
room for, by making the plan again.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable

from fsm_agent.core.ledger import count_call
from fsm_agent.definition.guards import is_opaque
from fsm_agent.definition.run import Faults, Run
from fsm_agent.definition.states import Dispatch, ExecuteTool
from fsm_agent.definition.stops import ConditionError
from fsm_agent.definition.table import first_row
from fsm_agent.definition.triggers import DISPATCH
from fsm_agent.records import ToolCall


def plan_batch(run: Run, cleared: Callable[[ToolCall], bool]) -> list[ToolCall]:
    """The calls of this turn, from the current one on, that may run now; ``cleared`` says a person allowed one."""
    return _plan(run, cleared, run.faults)


def unrun(run: Run, cleared: Callable[[ToolCall], bool]) -> list[ToolCall]:
    """The calls planned to run now that have not run yet: the batch under way's, else the current call alone.

    While a planned batch runs (the run is frozen) its plan is made again,
    and it comes out the same: what the plan reads changes only when the
    batch is replayed (the counts, the pending calls, the decisions), or is
    held since the plan (the clock, a cancel); a strict hook's failure
    during the batch, kept for the replay, was not there when it was made.
    """
    calls = run.calls.pending
    if not calls:
        return []
    if not run.at.frozen:
        planned = [calls[0]]
    else:
        faults = copy.copy(run.faults)
        faults.hook_error = None
        planned = _plan(run, cleared, faults)
    return [call for call in planned if call.id not in run.calls.ran]


def _plan(run: Run, cleared: Callable[[ToolCall], bool], faults: Faults) -> list[ToolCall]:
    calls = list(run.calls.pending)
    if len(calls) == 1 or _asks_the_user(run):
        return calls[:1]
    probe = copy.copy(run)
    # count_call and the probe write only the records copied here (and calls_by_tool in them); the Dispatch walk
    # reads but never writes the rest.
    probe.at, probe.counts, probe.calls = copy.copy(run.at), copy.copy(run.counts), copy.copy(run.calls)
    probe.counts.calls_by_tool = dict(run.counts.calls_by_tool)
    probe.faults = faults
    probe.at.state = Dispatch
    planned = calls[:1]
    ids = {calls[0].id}
    for i in range(1, len(calls)):
        count_call(probe, calls[i - 1])
        probe.calls.pending = deque(calls[i:])
        try:
            row = first_row(probe, DISPATCH)
        except ConditionError:
            break  # the replay will meet the same error and stop there
        # A repeated call id would make two results share one key, so such a call waits for its own turn.
        if row is None or row.dest is not ExecuteTool or not cleared(calls[i]) or calls[i].id in ids:
            break
        planned.append(calls[i])
        ids.add(calls[i].id)
    return planned


def _asks_the_user(run: Run) -> bool:
    """Whether a row of ``Dispatch`` has an opaque guard (a user's check), which only the real run can answer.

    Why: the plan's copy has only ``count_call`` applied, not the earlier
    calls' results, so such a check would clear a call it stops once the
    results are in, and the call would already have run beside them.
    """
    return any(row.guard is not None and is_opaque(row.guard) for row in run.rows.get((Dispatch, DISPATCH), ()))
