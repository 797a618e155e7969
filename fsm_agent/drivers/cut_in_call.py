"""A Ctrl-C from inside a model or tool call: the run it found whole, written as the interrupt leaves it.

A run handle's (``RunBase``) half that keeps an interrupt from a call: the
call is the I/O between two transitions, so the run is whole there, and a
store that writes only some transitions is given the ones it lacks, so the
run's next owner makes only the cut call again.  Apart from ``base`` because
it reads only the interrupt, the journal and the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsm_agent.drivers.watched import WatchedRun
from fsm_agent.observe.events import logger

if TYPE_CHECKING:
    from fsm_agent.persist.journal import Journal


class CutInCall(WatchedRun):
    """The interrupt a call was cut by, and the write that keeps the run whole as it leaves."""

    # The Ctrl-C (KeyboardInterrupt, SystemExit) that came out of a model or tool call, itself or as the cause of
    # the cancel it became, the run whole, until _keep_cut reads it; and the sub-agent calls whose hand-down (a
    # fork's) was taken from this run and is not yet stored with the child's run (child_runs), while no Ctrl-C
    # writes this run.
    _cut: BaseException | None = None
    _handing_down = 0
    _hands_down = False  # a sub-agent's run: it holds what its parent's run handed down, not yet stored
    _journal: Journal | None

    if TYPE_CHECKING:  # the run handle's (RunBase)

        @property
        def paused(self) -> bool: ...

    def _cut_in_call(self, exc: BaseException) -> None:
        """``exc`` came out of a model or tool call: if it is a Ctrl-C, it found the run whole (``_keep_cut``).

        The drivers call this from the handler of the call itself (the I/O
        between two transitions), never around the run's changes before or
        after it: only there is the run known not to be in the middle of one.
        A ``KeyboardInterrupt`` or ``SystemExit``, or the ``CancelledError``
        that one raised in a call of an async batch became for the sub-agent runs
        cut beside it (``leaving.left_above``): the interrupt itself is kept, so each call of a
        batch it cut, whichever way it came out, names the same cut.
        """
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            self._cut = exc
        elif not isinstance(exc, Exception) and isinstance(exc.__cause__, KeyboardInterrupt | SystemExit):
            self._cut = exc.__cause__

    def _cut_here(self, exc: BaseException) -> bool:
        """Whether ``exc``, leaving the run, is the Ctrl-C a call was cut by (or the cancel it became) and the run is
        whole: no sub-agent call of it was handing its child outcomes down (``child_runs``) unstored."""
        cut, self._cut = self._cut, None
        return cut is not None and (exc is cut or exc.__cause__ is cut) and self._handing_down == 0

    def _keep_cut(self, exc: BaseException) -> None:
        """A Ctrl-C cut a call: write what the run took since its store's last write, the call left in flight.

        A store that writes only some transitions (``every="call"`` or
        ``"turn"``) has not kept those since its last write, though observers
        heard of them; written now, the run's next owner resumes after them,
        makes the cut call again (as it would have) and announces none of them
        again.  Only a Ctrl-C from inside the call (``_cut_in_call``): one
        anywhere else may have cut a change to the run in the middle.  A write
        that fails (the lease lost, the store gone, a second Ctrl-C) is
        logged: ``exc`` is what propagates.  ``_akeep_cut`` is the same, awaited.
        """
        journal = self._journal
        if journal is None or not self._cut_here(exc) or not journal.unwritten(self.position):
            return
        try:
            journal.keep(self.position, self.paused)
        except BaseException:  # noqa: BLE001 - the interrupt propagates; the next owner hears those transitions again
            logger().warning("fsm_agent: the run cut by an interrupt in a call could not be written", exc_info=True)
