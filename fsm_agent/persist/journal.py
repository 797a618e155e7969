"""The driver's side of a store: owning one run and writing what each transition added, called or awaited.

A run with a store is first written whole (``create`` for a new run,
``claim`` for a resumed one), which also takes its lease.  After that each
checkpoint appends one journal entry: the messages, steps and trace entries
added since the last checkpoint, and the small fields that changed (state,
counters, pending calls, ...).  Its cost depends on what the transition
added, never on how long the run already is.  The write that finishes or
pauses the run gives the lease up, so anyone may resume a paused run.
"""

from __future__ import annotations

import asyncio
import copy
import math
import time
from collections.abc import Sequence
from typing import Any

from fsm_agent.core import snapshot
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import TERMINAL
from fsm_agent.errors import RunExistsError
from fsm_agent.jsontext import dumps
from fsm_agent.persist.store import DEFAULT_LEASE, Entry, Store, Summary, new_owner

_MISSING = object()
_RENEW = object()
_BY_REFERENCE = ("evidence", "finalize_evidence")
"""Fields ``dump_small`` hands out as the run's own dicts: remembered as copies, so a later change is seen."""


class Journal:
    """Ownership of one stored run and the bookkeeping of what its next checkpoint must append."""

    def __init__(self, store: Store, run_id: str, owner: str | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.owner = owner or new_owner()
        # A store with only wants/save/load gets whole snapshots and no leases, as before journals existed.
        self.full = callable(getattr(store, "append", None))
        self.lease = float(getattr(store, "lease", DEFAULT_LEASE))
        self.seq = 0
        self._marks = (0, 0, 0)
        self._tails: tuple[object, ...] = (None, None, None)
        self._small: dict[str, Any] = {}
        self._next: tuple[tuple[int, int, int], tuple[object, ...], dict[str, Any]] | None = None
        self._renew_at = math.inf
        self._memo: dict[int, Any] = {}  # plain forms of records that outlive a transition (see dump_small)

    # --- what to write (no I/O) ------------------------------------------------------------------------------

    def _whole(self, run: Run, paused: bool) -> dict[str, Any]:
        return snapshot.dump(run, run_id=self.run_id, paused=paused)

    def _laid(self, run: Run, whole: dict[str, Any], seq: int) -> None:
        """Remember a whole snapshot just written as the point the next entry starts from."""
        self._next = self._position(run, {k: v for k, v in whole.items() if k not in snapshot.GROWING})
        self._written(seq)

    @staticmethod
    def _position(run: Run, small: dict[str, Any]) -> tuple[tuple[int, int, int], tuple[object, ...], dict[str, Any]]:
        lists = (run.messages, run.steps, run.trace)
        marks = (len(lists[0]), len(lists[1]), len(lists[2]))
        kept = {**small, **{k: copy.deepcopy(small[k]) for k in _BY_REFERENCE if small.get(k)}}
        return marks, tuple(items[-1] if items else None for items in lists), kept

    def _written(self, seq: int) -> None:
        """The planned write succeeded: only now does the next entry start after it (a failed write is redone)."""
        if self._next is not None:
            self._marks, self._tails, self._small = self._next
            self._next = None
        self.seq = seq
        self._renew_at = time.monotonic() + self.lease / 3

    def _plan(self, run: Run, paused: bool) -> Entry | dict[str, Any] | object | None:
        """The entry to append now, a whole snapshot, a lease renewal, or nothing."""
        release = paused or run.state in TERMINAL
        if not self.full:
            return self._whole(run, paused) if self.store.wants(run.state, paused) else None
        if not (release or self.store.wants(run.state, paused)):
            return _RENEW if time.monotonic() >= self._renew_at else None
        lists: tuple[Sequence[object], ...] = (run.messages, run.steps, run.trace)
        for items, mark, tail in zip(lists, self._marks, self._tails, strict=True):
            if len(items) < mark or (mark and items[mark - 1] is not tail):
                return self._whole(run, paused)  # history was rewritten, not extended: write it whole
        small = snapshot.dump_small(run, self._memo, run_id=self.run_id, paused=paused)
        changed = {k: v for k, v in small.items() if self._small.get(k, _MISSING) != v}
        growth = {k: v for k, v in snapshot.dump_growth(run, self._marks).items() if v}
        self._next = self._position(run, small)
        tokens = run.input_tokens + run.output_tokens
        summary = Summary(str(run.state), run.reason, paused, len(run.steps), tokens)
        return Entry(self.run_id, self.seq + 1, dumps({"add": growth, "set": changed}), summary, release)

    # --- called ----------------------------------------------------------------------------------------------

    def open(self, run: Run, paused: bool, *, new: bool, overwrite: bool = False) -> None:
        """Write the run whole and take its lease: a new run (``RunExistsError`` if its id is taken) or resumed one."""
        whole = self._whole(run, paused)
        if not self.full:
            if new and not overwrite and _exists(self.store, self.run_id):
                raise RunExistsError(self.run_id, repr(self.store))
            self.store.save(self.run_id, whole)
            seq = 0
        elif new:
            seq = self.store.create(self.run_id, whole, owner=self.owner, overwrite=overwrite)  # type: ignore[attr-defined]
        else:
            seq = self.store.claim(self.run_id, whole, owner=self.owner)  # type: ignore[attr-defined]
            if paused or run.state in TERMINAL:
                # Nothing runs until a decision or a resume edge: leave the run free (the next write re-takes it).
                self.store.renew(self.run_id, owner=self.owner, seq=seq, release=True)  # type: ignore[attr-defined]
        self._laid(run, whole, seq)

    def save(self, run: Run, paused: bool) -> None:
        """Checkpoint the transition just taken, if the store wants it; else renew the lease when it is due."""
        action = self._plan(run, paused)
        if action is None:
            return
        store: Any = self.store
        if isinstance(action, Entry):
            store.append(action, owner=self.owner)
            self._written(action.seq)
        elif action is _RENEW:
            store.renew(self.run_id, owner=self.owner, seq=self.seq)
            self._written(self.seq)
        elif self.full:
            seq = store.claim(self.run_id, action, owner=self.owner)
            if paused or run.state in TERMINAL:
                store.renew(self.run_id, owner=self.owner, seq=seq, release=True)
            self._laid(run, action, seq)  # type: ignore[arg-type]
        else:
            store.save(self.run_id, action)
            self._laid(run, action, 0)  # type: ignore[arg-type]

    # --- awaited ---------------------------------------------------------------------------------------------

    async def aopen(self, run: Run, paused: bool, *, new: bool, overwrite: bool = False) -> None:
        """``open``, awaiting the store's async methods (or running its sync ones in a thread)."""
        whole = self._whole(run, paused)
        if not self.full:
            if new and not overwrite and await asyncio.to_thread(_exists, self.store, self.run_id):
                raise RunExistsError(self.run_id, repr(self.store))
            await _acall(self.store, "save", self.run_id, whole)
            seq = 0
        elif new:
            seq = await _acall(self.store, "create", self.run_id, whole, owner=self.owner, overwrite=overwrite)
        else:
            seq = await _acall(self.store, "claim", self.run_id, whole, owner=self.owner)
            if paused or run.state in TERMINAL:
                await _acall(self.store, "renew", self.run_id, owner=self.owner, seq=seq, release=True)
        self._laid(run, whole, seq)

    async def asave(self, run: Run, paused: bool) -> None:
        """``save``, awaited: a checkpoint never blocks the event loop."""
        action = self._plan(run, paused)
        if action is None:
            return
        if isinstance(action, Entry):
            await _acall(self.store, "append", action, owner=self.owner)
            self._written(action.seq)
        elif action is _RENEW:
            await _acall(self.store, "renew", self.run_id, owner=self.owner, seq=self.seq)
            self._written(self.seq)
        elif self.full:
            seq = await _acall(self.store, "claim", self.run_id, action, owner=self.owner)
            if paused or run.state in TERMINAL:
                await _acall(self.store, "renew", self.run_id, owner=self.owner, seq=seq, release=True)
            self._laid(run, action, seq)  # type: ignore[arg-type]
        else:
            await _acall(self.store, "save", self.run_id, action)
            self._laid(run, action, 0)  # type: ignore[arg-type]


def _exists(store: Store, run_id: str) -> bool:
    try:
        store.load(run_id)
    except KeyError:
        return False
    return True


async def _acall(store: Store, name: str, *args: Any, **kwargs: Any) -> Any:
    """Await the store's ``a<name>`` if it has one, else run ``<name>`` in a worker thread."""
    method = getattr(store, f"a{name}", None)
    if method is not None:
        return await method(*args, **kwargs)
    return await asyncio.to_thread(getattr(store, name), *args, **kwargs)
