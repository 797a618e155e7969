"""The driver's side of a store: owning one run and writing what each transition added, called or awaited.

A run with a store is first written whole (``create`` for a new run,
``claim`` for a resumed one), which also takes its lease.  After that each
checkpoint appends one journal entry: the messages, steps and trace entries
added since the last checkpoint, and the small fields that changed (state,
counters, pending calls, ...).  Its cost depends on what the transition
added, never on how long the run already is.  The write that finishes or
pauses the run gives the lease up, so anyone may resume a paused run.
Every write names the version this object last wrote (``seq``), so the
store refuses it (``StaleRunError``) once anybody else wrote the run; before
a call, ``hold`` makes that check if the run was let go of or its lease is
running out, so no call is made on a run this object no longer owns.

What each checkpoint writes is decided from the run alone in
``checkpoints`` (the half of a journal that plans, with no I/O and no
clock); this module makes the writes and keeps the version and lease they
move.  While a model or tool call is in flight the lease follows the owner,
not the call: see ``heartbeat`` (the half that keeps the lease).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Mapping
from typing import Any, cast

from fsm_agent.core import snapshot
from fsm_agent.core.child_ids import LINK
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import TERMINAL
from fsm_agent.definition.triggers import REPLIED
from fsm_agent.errors import RunExistsError, RunLeasedError
from fsm_agent.persist.checkpoints import RENEW, Checkpoints
from fsm_agent.persist.cut_writes import CutWrite, CutWrites, Point
from fsm_agent.persist.heartbeat import CallInFlight, HeartbeatThread
from fsm_agent.persist.store import JournaledStore, Store, new_owner, traits
from fsm_agent.persist.summary import VERSION_KEY, Entry


def link_of(data: Mapping[str, Any]) -> dict[str, str] | None:
    """The ``LINK`` fields a stored snapshot holds (a run that is no tool call's: None)."""
    found = {name: value for name in LINK if isinstance(value := data.get(name), str)}
    return found or None


def forked_from_of(data: dict[str, Any]) -> tuple[str | None, int] | None:
    """A fork's ``forked_from`` (its source run's id, or None, and the transition index); None for other runs."""
    found = data.get("forked_from")
    if found is None:
        return None
    if not (isinstance(found, list | tuple) and len(found) == 2 and isinstance(found[1], int)):
        msg = f"snapshot field forked_from must be [source run id, transition index], got {found!r}"
        raise snapshot.SnapshotError(msg)
    source, at = found
    return (source if isinstance(source, str) else None), at


class Journal(Checkpoints, CutWrites):
    """Ownership of one stored run and the bookkeeping of what its next checkpoint must append."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        owner: str | None = None,
        start_id: str = "",
        session: str | None = None,
        parent: Mapping[str, str] | None = None,
        forked_from: tuple[str | None, int] | None = None,
        request: str | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        # Written with the run, so the store lists it among its conversation's turns, and a sub-agent's run
        # names the run whose tool call it is.
        self._named: dict[str, Any] = (
            {"run_id": run_id} if session is None else {"run_id": run_id, "session_id": session}
        )
        self._named["start_id"] = start_id  # "": a run loaded from a snapshot written before start ids
        if parent is not None:
            self._named.update(parent)
        if forked_from is not None:  # a fork names its source run and the transition it was taken after
            self._named["forked_from"] = list(forked_from)
        if request is not None:  # a session's turn names the request that took it (Session.run's request_id)
            self._named["request_id"] = request
        self.owner = owner or new_owner()
        # What the store offers, asked once (store.traits): a store with only wants/save/load (not a
        # JournaledStore) gets whole snapshots and no leases, as before journals existed.
        self.traits = traits(store)
        self.full = self.traits.journaled
        self.journaled: JournaledStore | None = cast("JournaledStore", store) if self.full else None
        self.lease = self.traits.lease
        self.after_calls = self.traits.every == "call"  # every.EVERY: one write as each call returns
        self.seq = 0
        # The last write gave the lease up (the run paused): before it goes on, it must take the run back.
        self.released = False
        self._marks: tuple[int, ...] = (0, 0, 0, 0)
        self._tails: tuple[object, ...] = (None, None, None, None)
        self._small: dict[str, Any] = {}
        self._next: Point | None = None
        self._renew_at = math.inf
        self._early: set[str] = set()  # calls of a parallel batch whose outcome was written before they were recorded
        # A write (an entry, or a claim) whose await a cancel cut while the store had it: the store may have
        # committed it all the same, so the next write first reads which (``_resolve``, persist/cut_writes).
        self._unsure: CutWrite | None = None
        # The call in flight (its heartbeat's task, async), this run's heartbeat thread (sync: it outlives one
        # call, so a call costs no thread start), and why a renewal was refused, if one was.
        self._beat: CallInFlight | asyncio.Task[None] | None = None
        self._beater: HeartbeatThread | None = None
        self._beat_lock = threading.Lock()
        self.lost: RunLeasedError | KeyError | None = None

    def name_requests(self, turns: Mapping[str, int]) -> None:
        """Write with the run the request ids its session's earlier turns took, by turn number (``request_turns``).

        Called before the run's first write: ``Session.run`` reads them from
        its last turn to answer a request sent again from its turn.
        """
        self._named["request_turns"] = dict(turns)

    def _written(self, seq: int, released: bool = False, *, wrote: bool = True) -> None:
        """The planned write succeeded: only now does the next entry start after it (a failed write is redone).

        A renewal (``wrote=False``) wrote no transition, so it never takes
        the position of a write planned before it that failed.
        """
        if wrote and self._next is not None:
            self._marks, self._tails, self._small = self._next
            self._next = None
            self._unsure = None
        if wrote:
            self.owed = False
        self.seq = seq
        self.released = released
        self._renew_at = time.monotonic() + self.lease / 3
        if released and self._beater is not None:
            self._retire(None)  # the run was given up: nothing to renew until it is taken back

    def stamp(self) -> dict[str, Any]:
        """What this run's snapshots carry beside its position: the stored version last written, and its session."""
        stamp: dict[str, Any] = {VERSION_KEY: self.seq} if self.full and self.seq else {}
        for name in ("session_id", "request_id", "request_turns", *LINK, "forked_from"):
            if name in self._named:
                stamp[name] = self._named[name]
        return stamp

    # --- called ----------------------------------------------------------------------------------------------

    def open(self, run: Run, paused: bool, *, new: bool, overwrite: bool = False, expected: int | None = None) -> None:
        """Write the run whole and take its lease: a new run (``RunExistsError`` if its id is taken) or resumed one.

        A resumed run is claimed at the stored version its snapshot was read
        at, ``expected`` (``StaleRunError`` if the run moved on since).
        """
        whole = self._whole(run, paused)
        store = self.journaled
        released = False
        if store is None:
            if new and not overwrite and _exists(self.store, self.run_id):
                raise RunExistsError(self.run_id, repr(self.store))
            self.store.save(self.run_id, whole)
            seq = 0
        else:
            if new:
                seq = store.create(self.run_id, whole, owner=self.owner, overwrite=overwrite)
            else:
                seq = store.claim(self.run_id, _at(whole, expected), owner=self.owner)
            # A run stored paused (a fork taken at a pause, too) or finished: nothing runs until a decision or a
            # resume edge, so the run is left free (the next write re-takes it).
            released = paused or run.at.state in TERMINAL
            if released:
                store.renew(self.run_id, owner=self.owner, seq=seq, release=True)
        self._written(seq, released)

    def due(self) -> bool:
        """Whether ``hold`` must write: a write failed since the last, the run was let go of, or its lease is a third
        gone."""
        return self.owed or self.released or (self.full and self._lease_due())

    def _lease_due(self) -> bool:
        """Whether the lease is a third gone, so the next write renews it: the one clock a checkpoint reads."""
        return time.monotonic() >= self._renew_at

    def hold(self, run: Run) -> None:
        """Make sure this object still owns its run before a call is made (call it when ``due()``).

        A run the last write let go of (it paused) is taken back with an
        entry fenced by the version this object last wrote, carrying the
        decisions given since, so they are stored before the calls they allow
        are made.  So is a run whose last write failed (``owed``): what that
        write held is written before a call, or the call is not made.  Else a
        lease a third gone is renewed, fenced alike, so a call starts with two
        thirds of a lease ahead and never on a run another owner took over
        meanwhile (a ``StaleRunError`` if anyone decided, resumed or saved it
        since).
        """
        self._resolve()
        if self.released or self.owed:
            self._write(self._plan(run, False, force=True), run, False)
        elif self.full and self._lease_due():
            self._write(RENEW, run, False)

    async def ahold(self, run: Run) -> None:
        """``hold``, awaited."""
        await self._aresolve()
        if self.released or self.owed:
            await self._awrite(self._plan(run, False, force=True), run, False)
        elif self.full and self._lease_due():
            await self._awrite(RENEW, run, False)

    def save(self, run: Run, paused: bool) -> None:
        """Checkpoint the transition just taken if the store wants it or it ended a call, or renew a due lease.

        Nothing is written when the write a cancel cut landed and holds the run as it is (``_resolve``); a run
        that owes a failed write writes it now, whatever the store wants of this transition.
        """
        if self._resolve() and not self._moved(run, paused):
            return
        action = self._plan(run, paused, force=self._called(run) or self.owed)
        if action is not None:
            self._write(action, run, paused)

    def keep_outcome(self, run: Run) -> None:
        """A call returned and its outcome is kept, not yet recorded by a transition: write it now.

        Why: the transition that records it comes after the call's
        ``after_tool`` hooks (a strict one's error stops the run there), and a
        crash or a Ctrl-C inside a hook would otherwise make a finished call
        again.  A store that writes only before model calls (``every="turn"``)
        is not asked.
        """
        self._resolve()
        if self._outcome_due(run):
            kept = set(run.calls.ran)
            self._write(self._plan(run, False, force=True), run, False)
            self._early.update(kept)

    async def akeep_outcome(self, run: Run, *, in_flight: bool = True) -> None:
        """``keep_outcome``, awaited; ``in_flight``: a parallel batch's calls are still in flight beside it.

        A batch's transitions come only after its last call, so each outcome
        is written as it returns; the calls still in flight keep the lease (a
        new heartbeat, at the version just written).
        """
        await self._aresolve()
        if not self._outcome_due(run):
            return
        kept = set(run.calls.ran)
        await self._awrite(self._plan(run, False, force=True), run, False)
        self._early.update(kept)
        if in_flight:
            self.abeat()

    def keep_reply(self, run: Run) -> None:
        """A model's reply was taken in, not yet stepped: write it now, before its ``after_model`` hooks run.

        Why: the transition that takes the reply comes after those hooks (a
        strict one's error stops the run there), and a crash or a Ctrl-C
        inside a hook would otherwise lose a reply that was paid for, and the
        next owner would ask the model again.  A reply the run cannot use
        (a ``model_error`` stop), or whose ``approve=`` rule raised, is not
        written (a snapshot keeps such an error only as text): its call is
        made again.  A store that writes only before model calls
        (``every="turn"``) is not asked.
        """
        self._resolve()
        if self._reply_due(run):
            self._write(self._plan(run, False, force=True), run, False)

    async def akeep_reply(self, run: Run) -> None:
        """``keep_reply``, awaited."""
        await self._aresolve()
        if self._reply_due(run):
            await self._awrite(self._plan(run, False, force=True), run, False)

    def _reply_due(self, run: Run) -> bool:
        return run.at.replied == REPLIED and run.faults.condition_error is None and self.traits.every != "turn"

    def _outcome_due(self, run: Run) -> bool:
        """Whether a kept outcome is unwritten and wanted (none is when only model calls' turns are written)."""
        self._early.intersection_update(call.id for call in run.calls.pending)  # earlier batches' calls are recorded
        wanted = self.after_calls or self.store.wants(run.at.state, False)
        return wanted and not self._early.issuperset(run.calls.ran)  # else written already, with a sibling's

    def keep(self, run: Run, paused: bool) -> None:
        """Write the run as it is now, whatever the store wants: a Ctrl-C inside a call leaves it whole (the driver).

        Fenced as every write: refused (``StaleRunError``, ``RunLeasedError``)
        once the run is no longer this object's, and never written by a run
        whose lease renewal was refused.  The lease is kept, not given up: the
        run is unfinished, and its owner may be gone a moment later.
        """
        self._resolve()
        self._write(self._plan(run, paused, force=True), run, paused)

    async def akeep(self, run: Run, paused: bool) -> None:
        """``keep``, awaited.

        A Ctrl-C in a call of an async batch ends the event loop, whose
        teardown cancels every task: a batch's outcome write among them, which
        the store may still commit unawaited (``_aresolve`` reads whether).
        """
        await self._aresolve()
        await self._awrite(self._plan(run, paused, force=True), run, paused)

    def _write(self, action: Entry | dict[str, Any] | object, run: Run, paused: bool) -> None:
        self._settle()
        store = self.journaled
        if store is None:  # only whole snapshots are planned for a store that keeps no journal
            whole = cast("dict[str, Any]", action)
            self._sent(lambda: self.store.save(self.run_id, whole), 0, False)
            self._written(0)
        elif isinstance(action, Entry):
            self._sent(lambda: store.append(action, owner=self.owner), action.seq, action.release)
            self._written(action.seq, action.release)
        elif action is RENEW:
            store.renew(self.run_id, owner=self.owner, seq=self.seq)
            self._written(self.seq, wrote=False)
        else:
            whole = cast("dict[str, Any]", action)
            released = paused or run.at.state in TERMINAL
            seq = self._sent(
                lambda: store.claim(self.run_id, _at(whole, self.seq), owner=self.owner), self.seq + 1, False
            )
            if released:
                store.renew(self.run_id, owner=self.owner, seq=seq, release=True)
            self._written(seq, released)

    # --- awaited ---------------------------------------------------------------------------------------------

    async def aopen(
        self, run: Run, paused: bool, *, new: bool, overwrite: bool = False, expected: int | None = None
    ) -> None:
        """``open``, awaiting the store's async methods (or running its sync ones in a thread)."""
        whole = self._whole(run, paused)
        released = False
        if not self.full:
            if new and not overwrite:  # the id is refused once taken: asked with aload if the store has it
                try:
                    await self._await("load", self.run_id)
                except KeyError:
                    pass
                else:
                    raise RunExistsError(self.run_id, repr(self.store))
            await self._await("save", self.run_id, whole)
            seq = 0
        else:
            if new:
                create = self._await("create", self.run_id, whole, owner=self.owner, overwrite=overwrite)
                seq = await (create if overwrite else self._guarded(create, 1, False))  # a new run's version is 1
            else:
                claim = self._await("claim", self.run_id, _at(whole, expected), owner=self.owner)
                seq = await (claim if expected is None else self._guarded(claim, expected + 1, False))
            released = paused or run.at.state in TERMINAL
            if released:
                await self._arelease(seq)
        self._written(seq, released)

    async def asave(self, run: Run, paused: bool) -> None:
        """``save``, awaited: a checkpoint never blocks the event loop."""
        if await self._aresolve() and not self._moved(run, paused):
            return
        action = self._plan(run, paused, force=self._called(run) or self.owed)
        if action is not None:
            await self._awrite(action, run, paused)

    async def _awrite(self, action: Entry | dict[str, Any] | object, run: Run, paused: bool) -> None:
        self._settle()
        if not self.full:  # only whole snapshots are planned for a store that keeps no journal
            whole = cast("dict[str, Any]", action)
            await self._guarded(self._await("save", self.run_id, whole), 0, False)
            self._written(0)
        elif isinstance(action, Entry):
            await self._guarded(self._await("append", action, owner=self.owner), action.seq, action.release)
            self._written(action.seq, action.release)
        elif action is RENEW:
            await self._await("renew", self.run_id, owner=self.owner, seq=self.seq)
            self._written(self.seq, wrote=False)
        else:
            whole = cast("dict[str, Any]", action)
            released = paused or run.at.state in TERMINAL
            claim = self._await("claim", self.run_id, _at(whole, self.seq), owner=self.owner)
            seq = await self._guarded(claim, self.seq + 1, False)  # a claim writes the next version
            if released:
                await self._arelease(seq)
            self._written(seq, released)


def _at(whole: dict[str, Any], version: int | None) -> dict[str, Any]:
    """A whole snapshot naming the stored version it replaces (none: the run is new to the store)."""
    return whole if version is None else {**whole, VERSION_KEY: version}


def _exists(store: Store, run_id: str) -> bool:
    try:
        store.load(run_id)
    except KeyError:
        return False
    return True
