"""What a checkpoint store is: the ``Store`` protocols, and what the engine reads of a store (``traits``).

A store keeps, per run, a base snapshot (written whole at a compaction
point: a run's start or takeover, or ``save``) and a journal of what each
checkpoint after it added, so a checkpoint costs the same at turn 4,000 as at
turn 10.  A run being advanced is leased by one owner; every journal write is
conditional on still holding that lease, so two owners can never interleave
their entries.  The lease (``DEFAULT_LEASE``, 12 s) is renewed while the
owner lives, even during a long call, so a dead owner's run is free again
within one lease.  ``SqliteStore`` and ``PostgresStore`` implement it all; a store
with only ``wants``/``save``/``load`` still works, saving whole snapshots
without leases.

The contract is declared, in layers (``fsm_agent.testing.stores`` checks a store against it):

- ``Store``: ``wants``, ``save``, ``load``.  Enough for the engine to checkpoint whole snapshots.
- ``JournaledStore``: a ``Store`` with ``create``, ``claim``, ``append`` and ``renew``.  The engine then
  journals, leases and versions every write.  Checked once per run, by ``traits`` (an ``isinstance``).
- ``FullStore``: a ``JournaledStore`` with everything else the bundled stores have and the package uses:
  the ``lease`` and ``every`` attributes, ``keep`` (the heartbeat), ``decide``, ``list_runs``, ``delete``,
  ``delete_finished`` (the run viewer, the ``runs`` commands, ``Session``).
- ``AsyncStore``: the async twins (``asave``, ``aappend``, ...).  Each is optional on its own: the async
  driver awaits a twin the store has and runs the sync method in a worker thread otherwise.

What a journaled store lacks of ``FullStore`` has a default (``traits``): a lease of ``DEFAULT_LEASE``,
a write per wanted transition, ``renew`` for ``keep``.  The checks every store makes of its arguments
(run ids, filters, pages, snapshots) are in ``checks.py``; a listing's order and cursor (``RunCursor``), which
page the runs so that each shows once while others are added or saved, in ``cursor.py``; what a store keeps
beside each snapshot and lists (``Summary``, ``StoredRun``, ``Entry``), in ``summary.py``.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

import attrs

from fsm_agent.definition.states import State
from fsm_agent.errors import FsmAgentError

# The argument checks moved to checks.py; what other modules import from here stays importable.
from fsm_agent.persist.checks import check_run_id as check_run_id
from fsm_agent.persist.checks import filter_text as filter_text
from fsm_agent.persist.cursor import Order, RunCursor
from fsm_agent.persist.summary import Entry, StoredRun

DEFAULT_LEASE = 12.0
"""Seconds a run's lease lasts unless renewed, so a run whose owner died is free again within this time.

The driver renews it at every checkpoint, before a call once a third of it is gone, and, while a model or tool call
is in flight, from a heartbeat every third of a lease: the lease follows the owner, not the slowest call, and need
only outlast a stall of the owning process (or of its database) of two thirds of a lease.  A renewal is fenced (the
run is still this owner's at the version it last wrote), so an owner that lost its run is refused at its next
write, before its next call, and never overwrites the new owner's work."""


class StoreError(FsmAgentError, RuntimeError):
    """A store location that cannot be used as one: not a database, unreadable, or another program's tables.

    ``where`` names the location (a URL without its password), ``reason`` says what the database said.
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(where, reason)
        self.where = where
        # One line: a message shown on a terminal must not spread over several.
        self.reason = "; ".join(line.strip() for line in reason.strip().splitlines())

    def __str__(self) -> str:
        return f"{self.where} cannot be used as a run store: {self.reason}"


@runtime_checkable
class Store(Protocol):
    """The minimal store: what the engine needs to checkpoint a run as whole snapshots (no leases, no journal).

    A store that is also a ``JournaledStore`` gets a journal entry per
    checkpoint, leases and versioned writes instead.
    """

    def wants(self, state: State, paused: bool) -> bool:
        """Whether a checkpoint should be written now that the run is in ``state``."""
        ...

    def save(self, run_id: str, snapshot: dict[str, Any]) -> int | None:
        """Replace the stored run with this whole snapshot (a compaction point); its new version, if it keeps one."""
        ...

    def load(self, run_id: str) -> dict[str, Any]:
        """The run's latest snapshot; ``KeyError`` naming the id if there is none."""
        ...


@runtime_checkable
class JournaledStore(Store, Protocol):
    """A store that versions, leases and journals its runs: what the engine needs to append instead of save whole.

    Every write names its owner and the version it follows, so a store
    refuses (``StaleRunError``, ``RunLeasedError``) the write of anyone who
    no longer holds the run.  ``load`` rebuilds the base with the journal
    after it and carries the version as ``stored_seq``; ``save`` is a
    compare-and-set on it.  Runtime-checkable: ``traits`` checks it once
    when a run's journal is built, not at each write.
    """

    def create(self, run_id: str, snapshot: dict[str, Any], *, owner: str, overwrite: bool = False) -> int:
        """Store a new run leased to ``owner``, return its version; ``RunExistsError`` if the id is taken.

        ``overwrite`` replaces a stored run of that id instead (unless another owner's lease on it is live).
        """
        ...

    def claim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        """Take a run over from ``snapshot``, leased to ``owner``; its new version.

        ``RunLeasedError`` naming the holder while another owner's lease is
        live; ``StaleRunError`` unless the run is still at the version
        ``snapshot["stored_seq"]`` names, of the start ``snapshot["start_id"]``
        names: a run deleted and started again under its id counts from 1 again.
        """
        ...

    def append(self, entry: Entry, *, owner: str) -> None:
        """Add ``entry`` as version ``entry.seq`` if the run is ``owner``'s (or free) at ``entry.seq - 1``.

        Else ``RunLeasedError`` (another owner's live lease) or
        ``StaleRunError`` (the run moved on); ``entry.release`` gives the
        lease up with the write.
        """
        ...

    def renew(self, run_id: str, *, owner: str, seq: int, release: bool = False) -> None:
        """Extend ``owner``'s lease (``release``: give it up), checked like ``append`` at version ``seq``."""
        ...


@runtime_checkable
class FullStore(JournaledStore, Protocol):
    """Everything the package uses of a store: a ``JournaledStore`` with its settings, heartbeat, decisions and listing.

    ``SqliteStore`` and ``PostgresStore`` are ``FullStore``\\ s (mypy checks
    it, in ``planned.py``).  The run viewer needs ``load``, ``decide`` and
    ``list_runs`` (a run's sub-agent runs with ``list_runs(parent=...)``); the
    ``runs`` commands the deletions too; a ``Session`` lists its turns with
    ``list_runs(session=...)``.  The engine itself needs only a
    ``JournaledStore`` and falls back (see ``traits``) for ``lease``, ``every``
    and ``keep``.  Runtime-checkable: ``isinstance(store, FullStore)``.
    """

    lease: float
    """Seconds a run stays leased without a renewal (``DEFAULT_LEASE``)."""
    every: str
    """Which transitions are written as they are taken (``persist.every.EVERY``)."""

    def keep(self, run_id: str, *, owner: str, seq: int) -> None:
        """Extend the lease during a call only if the run is still ``owner``'s at ``seq``: never take a run back."""
        ...

    def decide(self, run_id: str, call_id: str, decision: bool | str) -> dict[str, Any]:
        """Record a decision on a paused run's pending call in one transaction; the run as stored now.

        A value other than True, False or a reason text is a ``TypeError``
        before the run is looked at, and a text that reads as an approval
        (``"yes"``, ``"true"``) a ``ValueError``: pass True to approve.  ``DecisionError`` if the run is not
        paused, the call not pending, already ran, needs no approval (it is
        not in the run's ``to_approve``) or has another decision (the store is
        then unchanged); the same decision given again is taken as given,
        writing nothing, and ``False`` and ``""`` are the same decision
        (``check_decision`` of ``fsm_agent.core.approval`` applies these
        rules).  ``RunLeasedError`` while someone advances the run;
        ``KeyError`` if there is no such run.
        """
        ...

    def list_runs(
        self,
        *,
        state: str | None = None,
        reason: str | None = None,
        since: float | datetime | None = None,
        limit: int | None = None,
        offset: int = 0,
        session: str | None = None,
        order: Order = "updated",
        after: RunCursor | None = None,
        parent: str | None = None,
    ) -> list[StoredRun]:
        """The stored runs, most recently saved first, filtered and paged; ``ValueError`` for a filter with a NUL.

        ``parent`` keeps the sub-agent runs of that run (``StoredRun.parent``
        names it), not theirs: the run viewer lists a run's children in one
        read with it.

        ``order="created"`` lists them by when the store first held them
        instead, latest first, ties by run id descending; ``after`` (a
        ``RunCursor``, that order only, no ``offset`` with it) starts right after
        the run it was made from.  A run keeps its creation time when saved
        again, so pages read one after the other by cursor show each run
        there exactly once, whatever was added or saved meanwhile.  The checks
        of ``order``, ``after`` and ``offset`` are ``cursor.check_listing``'s.
        """
        ...

    def delete(self, run_id: str) -> bool:
        """Forget one run; whether it was there."""
        ...

    def delete_finished(self, older_than: float | timedelta | None = None) -> int:
        """Forget every finished run (last saved more than ``older_than`` ago); how many."""
        ...


class AsyncStore(Protocol):
    """The async twins of a store's methods, each optional on its own: awaited by the async driver if present.

    A twin the store lacks is its sync method run in a worker thread
    (``traits``), so the event loop never waits on the store either way.
    Not runtime-checkable: which twins a store has is read one by one.
    """

    async def asave(self, run_id: str, snapshot: dict[str, Any]) -> int | None:
        """``save``, awaited."""
        ...

    async def aload(self, run_id: str) -> dict[str, Any]:
        """``load``, awaited."""
        ...

    async def acreate(self, run_id: str, snapshot: dict[str, Any], *, owner: str, overwrite: bool = False) -> int:
        """``create``, awaited."""
        ...

    async def aclaim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        """``claim``, awaited."""
        ...

    async def aappend(self, entry: Entry, *, owner: str) -> None:
        """``append``, awaited."""
        ...

    async def arenew(self, run_id: str, *, owner: str, seq: int, release: bool = False) -> None:
        """``renew``, awaited."""
        ...

    async def akeep(self, run_id: str, *, owner: str, seq: int) -> None:
        """``keep``, awaited."""
        ...

    async def adecide(self, run_id: str, call_id: str, decision: bool | str) -> dict[str, Any]:
        """``decide``, awaited."""
        ...

    async def alist_runs(self, **filters: Any) -> list[StoredRun]:
        """``list_runs``, awaited."""
        ...


TWINS = ("save", "load", "create", "claim", "append", "renew", "keep")
"""The methods the engine calls whose async twin (``a`` + name, ``AsyncStore``) the async driver awaits."""


@attrs.frozen
class Traits:
    """What one store offers the engine, read once when a run's journal is built (``traits``), not at each write.

    ``journaled``: a ``JournaledStore`` (else whole snapshots, no leases);
    ``lease`` and ``every`` its settings or their defaults; ``keeps``: it has
    ``keep`` (else the heartbeat renews with ``renew``); ``awaits``: the
    ``TWINS`` it has an async twin of.
    """

    journaled: bool
    lease: float
    every: str | None
    keeps: bool
    awaits: frozenset[str]


def traits(store: Store) -> Traits:
    """The ``Traits`` of ``store``: the one place the engine asks what a store has."""
    journaled = isinstance(store, JournaledStore)
    awaits = frozenset(name for name in TWINS if callable(getattr(store, f"a{name}", None)))
    return Traits(
        journaled=journaled,
        lease=float(getattr(store, "lease", DEFAULT_LEASE)),
        every=getattr(store, "every", None),
        keeps=callable(getattr(store, "keep", None)),
        awaits=awaits,
    )


def journaled(store: Store) -> bool:
    """Whether the engine journals, leases and versions ``store``'s runs (a ``JournaledStore``) or saves them whole."""
    return isinstance(store, JournaledStore)


def new_owner() -> str:
    """A fresh owner id naming this host and process, so a ``RunLeasedError`` tells a person where to look."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def __getattr__(name: str) -> Any:
    # ``SqliteStore`` lived in this module before the stores got modules of their own; old imports keep working.
    if name == "SqliteStore":
        from fsm_agent.persist.sqlite import SqliteStore

        return SqliteStore
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
