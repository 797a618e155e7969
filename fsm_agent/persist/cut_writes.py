"""A stored run's write that failed or whose await a cancel cut: whether the store committed it all the same.

A cancelled caller stops waiting, but the store may have its write already
(SQLite's writer thread took it, or a PostgreSQL statement ran before the
cancel reached the server) and commit it.  So may a write whose connection
dropped after the server committed it, before its answer came back.  Planned
as if it failed, the run's next write would be refused against the run's own
(``StaleRunError``) and its lease held until it lapses; planned as if it
landed, a write that failed would be lost.  So the journal keeps what the
unsure write would mean (``CutWrite``), and its next write first reads the
stored run to learn which (``landed``).  Until a write succeeds the run owes
one (``owed``): the driver makes no call before it is written (``Journal.due``).
A refusal (``REFUSALS``: the run is another owner's, or gone) wrote nothing
and owes nothing: the object no longer owns the run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from fsm_agent.core import snapshot
from fsm_agent.errors import RunExistsError, RunLeasedError, StaleRunError
from fsm_agent.persist.heartbeat import Heartbeats
from fsm_agent.persist.summary import VERSION_KEY

T = TypeVar("T")

Point = tuple[tuple[int, ...], tuple[object, ...], dict[str, Any]]
"""Where a journal's next entry starts: the lengths of the run's growing lists, their last items, its small fields."""

_MISSING = object()
_log = logging.getLogger("fsm_agent")
REFUSALS = (StaleRunError, RunLeasedError, RunExistsError, KeyError)
"""What a store raises for a write it refused, having written nothing: another owner's run, or none by the id."""


@attrs.frozen
class CutWrite:
    """A write cut in flight: the version it writes, whether it gives the lease up, and where the next entry starts."""

    seq: int
    release: bool
    planned: Point


def landed(cut: CutWrite, stored: dict[str, Any]) -> bool:
    """Whether ``stored`` (the run as the store holds it now) is what ``cut`` wrote: this owner's write, committed.

    The version, the lengths of the growing lists and every small field
    must be the cut write's: another owner's write of the same version
    differs in them.
    """
    marks, _, small = cut.planned
    lengths = tuple(len(stored.get(name) or ()) for name in snapshot.GROWING)
    if stored.get(VERSION_KEY) != cut.seq or lengths != marks:
        return False
    return all(stored.get(name, _MISSING) == value for name, value in small.items())


class CutWrites(Heartbeats):
    """The half of a ``Journal`` that learns, before its next write, whether a failed or cut write landed."""

    _unsure: CutWrite | None
    _next: Point | None
    owed = False
    """A write failed (not refused) and none has succeeded since: the run holds transitions its store may lack."""

    if TYPE_CHECKING:

        def _written(self, seq: int, released: bool = False, *, wrote: bool = True) -> None:
            """The ``Journal``'s: the planned write succeeded."""

    def cut_pending(self) -> bool:
        """Whether a write a cancel cut is yet to be read back (the next write does it first)."""
        return self._unsure is not None

    def _sent(self, write: Callable[[], T], seq: int, release: bool) -> T:
        """``write()``, which writes version ``seq``; if it fails, it is kept as a write that may have landed."""
        planned = self._next
        try:
            return write()
        except BaseException as exc:
            self._failed(exc, planned, seq, release)
            raise

    async def _guarded(self, write: Awaitable[T], seq: int, release: bool) -> T:
        """Await ``write``, which writes version ``seq``; if it fails or a cancel cuts it, it may land all the same."""
        planned = self._next
        try:
            return await write
        except BaseException as exc:
            self._failed(exc, planned, seq, release)
            raise

    def _failed(self, exc: BaseException, planned: Point | None, seq: int, release: bool) -> None:
        """A write of version ``seq`` raised ``exc``: unless the store refused it, it is owed, and it may have landed.

        ``planned`` is where the next entry starts once it is written, taken with the plan.
        """
        if isinstance(exc, REFUSALS):
            return
        if isinstance(exc, Exception):  # the store's own error, told what became of the run
            exc.add_note(
                f"fsm_agent: run {self.run_id!r} could not be written to {self.store!r}. The run object holds what the"
                " write held: driven again (AgentRun.finish() or afinish()) once the store answers, it writes that"
                " before any call. A run let go of instead (Agent.run, a Session's turn, a batch) is resumed from the"
                " store by its next owner once its lease lapses, and the calls this write held are made again."
            )
        self.owed = True
        if planned is not None:
            self._unsure = CutWrite(seq, release, planned)

    async def _arelease(self, seq: int) -> None:
        """Give the lease of the run just written at ``seq`` up (it is paused or finished), even if a cancel cuts it.

        The write before it landed, so the run is this object's, and its
        caller may never get it (``Agent.aresume`` of a still paused run is
        cut): a release the cancel withdrew (SQLite drops a write its writer
        had not taken) would keep the run leased until the lease lapses.  So
        it is written again out of the cancel's reach (giving up a free lease
        changes nothing), and the cancel propagates after.
        """
        try:
            await self._await("renew", self.run_id, owner=self.owner, seq=seq, release=True)
        except asyncio.CancelledError:
            try:
                await asyncio.shield(self._await("renew", self.run_id, owner=self.owner, seq=seq, release=True))
            except Exception:  # noqa: BLE001 - the cancel is what propagates; the lease lapses as a dead owner's
                _log.warning("fsm_agent: the lease of the cut run %s could not be given up", self.run_id, exc_info=True)
            else:
                self._written(seq, True)
            raise

    def _resolve(self) -> bool:
        """Whether the write a cancel cut (``_unsure``) landed, read from the store; if so it counts as written.

        False also when no write was cut, and when it was refused or withdrawn: the next write is planned as usual.
        """
        if self._unsure is None:
            return False
        try:
            stored = self.store.load(self.run_id)
        except KeyError:  # a first write that never landed: nothing is stored
            stored = {}
        return self._take(stored)

    async def _aresolve(self) -> bool:
        """``_resolve``, awaited: read with the store's ``aload`` (on SQLite, queued after the cut write)."""
        if self._unsure is None:
            return False
        try:
            stored = await self._await("load", self.run_id)
        except KeyError:  # a first write that never landed: nothing is stored
            stored = {}
        return self._take(stored)

    def _take(self, stored: dict[str, Any]) -> bool:
        """The cut write taken as written if ``stored`` is what it held; forgotten either way."""
        cut, self._unsure = self._unsure, None
        if cut is None or not landed(cut, stored):
            return False
        self._next = cut.planned
        self._written(cut.seq, cut.release)
        # Its lease dates from when it committed, which may be a lease ago: renewed (fenced) before the next call,
        # or another owner could claim the run in the meantime and make that call too.
        self._renew_at = time.monotonic()
        return True
