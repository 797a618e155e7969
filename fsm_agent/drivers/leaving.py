"""The ``KeyboardInterrupt`` or ``SystemExit`` a call of an async batch raised, which the batch's other calls hear.

Raised out of a call's own task, either would leave the event loop at
once, ending every run on it; so the batch cuts its other calls and the
run's own task raises it (``ConcurrentCalls._run_batch``).  A sub-agent's run
in flight under that batch is cut by a cancel with no cause it could see:
it reads the interrupt here, and is left unfinished for its next owner, as
the sync driver leaves a run a call's interrupt cut.
"""

from __future__ import annotations

import contextvars

LEAVING: contextvars.ContextVar[list[BaseException]] = contextvars.ContextVar("fsm_agent_leaving")
"""The interrupt a call of a batch raised, once one did: one list shared by the tasks of a run's outermost batch and
of every batch under them (its sub-agents' runs'), as each task inherits its context from the one that made it."""


def left_above() -> BaseException | None:
    """The ``KeyboardInterrupt`` or ``SystemExit`` a call of a batch this task runs under raised, if any.

    A sub-agent's run in flight beside that call (in its parent's batch, or
    further up) is cancelled by the loop's teardown, or by its parent's
    batch, with no cause the run could see: that cancel is the interrupt's
    doing too, and the run is left unfinished for its next owner, as its
    parent is (``AsyncDriver._acarry``).
    """
    leaving = LEAVING.get(None)
    return leaving[0] if leaving else None
