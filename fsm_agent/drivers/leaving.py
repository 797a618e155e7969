"""The ``KeyboardInterrupt`` or ``SystemExit`` a call raised on the event loop, which leaves the loop at once.

asyncio lets either out of the task that raised it, stopping the loop; the
loop's teardown then cancels the tasks left, the ones running a run among
them.  Those cancels are the interrupt's doing, not a request to stop the
run: the async driver and the clean-up of cut runs (``cut_runs``) read them
here, and leave such a run unfinished for its next owner, as the sync
driver leaves a run a call's interrupt cut.
"""

from __future__ import annotations

import contextvars
from typing import Any


def left_the_loop(tasks: list[Any]) -> BaseException | None:
    """The ``KeyboardInterrupt`` or ``SystemExit`` a call of a batch raised, if any.

    asyncio lets either leave the event loop at once, and the loop's
    teardown (``asyncio.run``'s, say) then cancels the task that awaits the
    batch: that cancel is the interrupt's doing, not a request to stop the run.
    """
    for task in tasks:
        raised: BaseException | None = task.exception() if task.done() and not task.cancelled() else None
        if isinstance(raised, KeyboardInterrupt | SystemExit):
            return raised
    return None


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
