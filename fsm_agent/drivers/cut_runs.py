"""Runs whose task a cancel cut during or just after one of their writes, which nobody would go on with: ended.

A run's write may be cut by a cancel and land all the same
(``persist/cut_writes``), or land and the cancel come right after it.
Either way, when the caller never gets the run (a session's turn, a run
``Agent.aresume`` or ``afork`` was writing), the run would wait unfinished
in the store, leased to an object nobody holds, until the lease lapses.
So it is ended (``astop_cut``), or, a session's new turn nothing of which
ran, deleted (``adrop_cut``), out of the cancel's reach; the cancel then
propagates as it came.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsm_agent.drivers.leaving import left_above
from fsm_agent.drivers.stored import awaited
from fsm_agent.observe.events import logger

if TYPE_CHECKING:
    from fsm_agent.drivers.agent_run import AgentRun
    from fsm_agent.persist.store import Store


async def astop_cut(run: AgentRun, exc: BaseException, *, landed: bool = False) -> None:
    """A run whose task was cancelled during one of its writes or (``landed``) after one: ended.

    Nobody goes on with a session's turn once it is cut, nor with a run
    whose ``Agent.aresume`` or ``afork`` was cut while writing it (its caller
    never got the run), so the transition left closing (see
    ``AsyncDriver._aadvance``), the run's first write or claim, which the
    store may have committed all the same (``persist/cut_writes``), or one
    that completed before the cancel (``landed``, told by the caller) would
    keep the run unfinished in the store, its lease held until it lapses.
    The run is finished here instead, out of reach of the cancel
    (``AsyncDriver._aend_cut``): a cut write is read back or written again,
    and the run stops ``cancelled`` before its next call (none is made), or,
    when the model's answer had come, ends ``Done`` with it (nothing it
    produced is dropped); the end is stored and lets the run go.  A run
    whose first write never landed is not in the store (``KeyError``):
    there is nothing to end.  The cancel propagates as it came, whatever
    happens here.

    ``exc`` is what cut the run: a cancel (of the task, or of the run's
    token), as a cancel during a call stops the run ``cancelled``.  A
    ``KeyboardInterrupt`` or ``SystemExit`` (raised here, or by a call and
    carried up as a cancel) leaves the run unfinished for its next owner, as
    it does anywhere else; so does an ``Exception``, a refusal whose raiser
    left the run as it must be.
    """
    import asyncio  # as in drivers.aio: import fsm_agent loads no asyncio

    token, journal = run._cancel, run._journal  # noqa: SLF001 - the run's own token, set by whoever cut the turn
    # Cut in a write: a transition's checkpoint (closing), a first write or claim, or a reply's (replied, not stepped).
    cut = landed or run._closing is not None or (journal is not None and journal.cut_pending())  # noqa: SLF001
    cut = cut or run.position.at.replied is not None
    if not cut or not (_a_cancel(exc) or (token is not None and token.cancelled)):
        return
    try:
        await asyncio.shield(run._aend_cut())  # noqa: SLF001 - whoever cut the run ends it
    except KeyError:  # the turn was never stored
        pass
    except Exception:  # noqa: BLE001 - the cancel is what propagates; the turn's lease lapses as a dead owner's
        logger().warning("fsm_agent: the cut turn %s could not be ended", run.run_id, exc_info=True)


def _a_cancel(exc: BaseException) -> bool:
    """Whether ``exc`` is a task's cancel (a caller's timeout, a client that left), not an interrupt carried up."""
    import asyncio

    return (
        isinstance(exc, asyncio.CancelledError)
        and not isinstance(exc.__cause__, KeyboardInterrupt | SystemExit)
        and left_above() is None
    )


async def adrop_cut(store: Store | None, run_id: str) -> None:
    """A new turn ``run_id``, stored, cut while it checks the turn it was built on (``_astill_based``): deleted.

    Nothing of it ran and its request was answered by nobody, so it goes,
    out of the cancel's reach, as a turn that backs off there goes.  Left
    stored, it would wait unfinished, leased to an object nobody holds: the
    next turn asked for would be refused until the lease lapsed, then take
    this one over and run it.
    """
    import asyncio  # as in drivers.aio: import fsm_agent loads no asyncio

    try:
        await asyncio.shield(awaited(store, "delete", run_id))
    except Exception:  # noqa: BLE001 - the cancel is what propagates; the turn's lease lapses as a dead owner's
        logger().warning("fsm_agent: the cut turn %s could not be deleted", run_id, exc_info=True)
