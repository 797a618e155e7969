"""``SqliteStore``: the embedded checkpoint store, one SQLite file in WAL mode, standard library only.

Each write is a transaction under SQLite's write lock (the awaited writes
of many runs in flight share one), so several processes may share one
file; a process killed mid-run loses at most the transition in flight
(``every="call"``, the default: the transitions since the last call
returned, which a resume takes again, making only the call in flight
again).
The schema is versioned with ``PRAGMA user_version`` and migrated on open:
a file written by the first ``SqliteStore`` (one whole snapshot per run,
version 1) opens and loads as it was; version 5 added each run's ``created``
time (the listing's creation order), set to the last save of the runs
already there; version 6 a sub-agent run's ``parent`` and ``parent_call``
(``list_runs(parent=...)``), read from the base snapshot of the runs already
there; version 7 each run's ``start_id`` (``persist/sqlite_schema.py``).  The methods are
``PlannedStore``'s (``persist/planned.py``); the async ones hand the same
plans to the store's writer thread, which commits those of many runs in
flight together (``persist/sqlite_writer.py``).

A forked child (``os.fork``, multiprocessing's fork start method, a
pre-loading server) must not inherit an open SQLite connection: SQLite keeps
the locks a process holds in its own memory, so a connection the child opens
beside an inherited one takes no file locks, and the last parent connection
to close deletes the write-ahead log under the child's feet (its committed
writes are lost).  So the fork hooks at the end of this module close every
open store's connection before the fork, once its transaction in progress
ended, and each process opens its own again at its next use; the child gets
a writer thread of its own, and the parent's queued writes stay the parent's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Literal, TypeVar

from fsm_agent.persist import plans
from fsm_agent.persist import sqlite_schema as schema
from fsm_agent.persist.checks import check_lease
from fsm_agent.persist.every import check_every
from fsm_agent.persist.planned import PlannedStore
from fsm_agent.persist.sqlite_schema import SCHEMA_VERSION
from fsm_agent.persist.sqlite_writer import GroupWriter
from fsm_agent.persist.store import DEFAULT_LEASE, StoreError
from fsm_agent.persist.summary import Summary

T = TypeVar("T")

EMPTY_PATH = "the path is empty; name a SQLite file (runs.db, say) or a postgresql:// URL"
"""Why an empty ``store=""`` (an unset setting, often) is refused, rather than taken for the working directory."""
BUSY_TIMEOUT = 30.0
"""Seconds a store waits for another connection's write transaction to end before "database is locked".

Opening a store and each of its writes wait this long for a writer in
another process or thread, even a stalled one (frozen, swapped out), before
the write fails: more than two leases (``DEFAULT_LEASE``), so a writer that
holds the file no longer than a stall the lease allows for is waited out."""

"""The columns versions 6 and 7 add: an older file has none of them."""


class SqliteStore(PlannedStore):
    """An embedded checkpoint store in one SQLite file (WAL mode, safe across threads and processes).

    ``every="call"`` (default) writes, as each model or tool call returns,
    its outcome with the transitions since the last write, in one
    transaction, and the end or a pause: at most model calls + tool calls + 2
    transactions a run, with the exactly-once and resume guarantees of a
    write per transition (``every.EVERY`` says what differs);
    ``every="transition"`` checkpoints after every transition, so a stored
    run reads at every transition as the run object (for a viewer following
    runs live step by step); ``every="turn"`` only when a run is about to
    call the model, has finished, or is paused.  ``lease`` (default 12 s,
    ``DEFAULT_LEASE``) is how many
    seconds a run stays owned by the process advancing it without a renewal;
    the owner renews it at checkpoints and, while a call is in flight, every
    third of a lease, so a run whose owner died is free within ``lease``
    seconds, however slow its calls; see ``Agent.run(store=...)``.
    A path that SQLite cannot use as a store is a ``StoreError`` naming it.
    Opening the store and its writes wait up to ``BUSY_TIMEOUT`` (30 s) for
    another connection's write transaction to end; a file whose schema is
    current opens without waiting for one.
    ``close()`` ends the store.  ``await store.aclose()`` does what it does
    without blocking the event loop, but leaves the store usable (its next
    use opens the file again); leaving ``async with store:`` ends it for
    good, also without blocking the loop.  Each lets the batch of awaited
    writes in progress commit and fails those still queued with a
    ``StoreError``.  A child process forked while the store is
    open (multiprocessing's fork start method, gunicorn's ``preload_app``)
    uses it as its own: it opens its own connection and writer thread, and
    never runs or fails the parent's queued writes.
    """

    def __init__(
        self,
        path: str | Path,
        every: Literal["transition", "call", "turn"] = "call",
        *,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        if isinstance(path, str) and not path:  # Path("") would be the working directory
            raise StoreError("''", EMPTY_PATH)
        self.every = check_every(every)
        self.lease = check_lease(lease)
        self.path = Path(path)
        self._lock = threading.Lock()
        self._plans = plans.Plans("runs", "journal", placeholder="?", no_limit="-1", where=str(self.path), lease=lease)
        self._writer = GroupWriter(self._connection, self._lock, str(self.path))
        self._released = False  # the connection was closed by ``aclose`` or for a fork: the next use opens it again
        self._closed = False
        self._db = self._open()
        try:
            self._wal_mode()
            self._migrate()
        except sqlite3.Error as exc:
            self._db.close()
            raise self._unusable(exc) from None
        _open_stores.add(self)

    def _open(self) -> sqlite3.Connection:
        """A new connection to the file, set up as the store's connection is."""
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT)
        except sqlite3.Error as exc:
            raise self._unusable(exc) from None
        try:
            # NORMAL loses nothing on a process crash in WAL mode; only a power cut could drop the last commit.
            db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            db.close()
            raise self._unusable(exc) from None
        return db

    def _connection(self) -> sqlite3.Connection:
        """The store's connection, opened again if ``aclose`` or a fork closed it; called under the store's lock."""
        if self._released:
            self._db = self._open()
            self._released = False
        return self._db

    def _release(self) -> None:
        """Close the connection until the next use; called under the store's lock."""
        self._db.close()
        self._released = not self._closed

    def _wal_mode(self) -> None:
        """Switch the file to WAL mode, waiting up to ``BUSY_TIMEOUT`` for a writer that holds it.

        SQLite's busy timeout does not cover this switch: while another
        connection writes to a file not yet in WAL mode, it fails at once
        ("database is locked"), so it is tried again until the writer is done.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
            else:
                return
            time.sleep(0.05)

    def _unusable(self, exc: sqlite3.Error) -> StoreError:
        """The error naming the file, and why SQLite cannot use it: a missing directory or a directory said as such."""
        where = self.path.absolute()
        if not where.parent.exists():
            reason = f"the directory {where.parent} does not exist; create it first, or name a file in one that does"
        elif where.is_dir():
            reason = f"it is a directory; name a file in it, such as {where / 'runs.db'}"
        else:
            reason = str(exc)
        return StoreError(str(self.path), reason)

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def _migrate(self) -> None:
        """Bring the file's schema to ``SCHEMA_VERSION``; one transaction, so concurrent openers do it once.

        A file already at ``SCHEMA_VERSION`` is only read (its columns
        checked), without taking the write lock another connection may hold.
        """
        with self._lock:
            if self._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                self._check_columns(schema.COLUMNS)
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
                tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if version == 0 and "runs" in tables:
                    version = 1  # the first SqliteStore kept no version number
                if version > SCHEMA_VERSION:
                    msg = f"schema version {version} is newer than this fsm_agent reads ({SCHEMA_VERSION})"
                    raise sqlite3.DatabaseError(msg)  # noqa: TRY301 - inside the transaction, so it rolls back
                if version < 1:
                    self._db.execute(schema.V1)
                if version < 2:
                    self._upgrade_to_v2()
                if version < 3:
                    # Another program's table is refused, not altered.
                    before_sessions = {"session", "forked_from", "forked_at", "created", *schema.LATER}
                    self._check_columns(schema.COLUMNS - before_sessions)
                    for statement in schema.V3:  # a run stored before sessions is no session's turn: NULL is right
                        self._db.execute(statement)
                if version < 4:
                    self._check_columns(schema.COLUMNS - {"forked_from", "forked_at", "created", *schema.LATER})
                    for statement in schema.V4:  # a run stored before forks is no fork: NULL is right, no snapshot read
                        self._db.execute(statement)
                if version < 5:
                    self._check_columns(schema.COLUMNS - {"created", *schema.LATER})
                    # When a run stored before this column was created is known nowhere (its snapshot keeps no
                    # time either): its last save is the closest, and it is set once, like any run's creation.
                    for statement in schema.V5:
                        self._db.execute(statement)
                if version < 6:
                    self._check_columns(schema.COLUMNS - schema.LATER)
                    for statement in schema.V6:
                        self._db.execute(statement)
                if version < 7:
                    self._check_columns(schema.COLUMNS - {"start_id"})
                    for statement in schema.V7:
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                self._check_columns(schema.COLUMNS)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _check_columns(self, wanted: set[str]) -> None:
        missing = wanted - {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        if missing:
            msg = f"its runs table is not a run store's (no {', '.join(sorted(missing))})"
            raise sqlite3.DatabaseError(msg)

    def _upgrade_to_v2(self) -> None:
        for statement in schema.V2:
            self._db.execute(statement)
        rows = self._db.execute("SELECT run_id, snapshot FROM runs").fetchall()
        for run_id, text in rows:
            summary = Summary.of(json.loads(text))
            columns = (summary.steps, summary.tokens, run_id)
            self._db.execute("UPDATE runs SET steps = ?, tokens = ? WHERE run_id = ?", columns)

    def _run(self, plan: plans.Plan[T], *, write: bool = True, atomic: bool = False) -> T:
        """Run a plan in one transaction (a write takes the file's write lock at once, so it cannot deadlock).

        ``atomic`` is ignored: every plan, one statement or several, runs in
        its own transaction under the lock.
        """

        def execute(sql: str, params: tuple[Any, ...]) -> plans.Reply:
            cursor = db.execute(sql, params)
            return cursor.rowcount, cursor.fetchall()

        with self._lock:
            db = self._connection()
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                value = plans.drive(plan, execute)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        return value

    async def _arun(self, plan: plans.Plan[T], *, write: bool = True, atomic: bool = False) -> T:
        """``_run`` by the store's writer thread, in one transaction with the other plans queued meanwhile.

        Its own savepoint keeps the plan's failure its own; it returns once
        the transaction committed.  A cancelled caller's plan still runs,
        and may commit, if the writer had already taken it (a run's journal
        reads back whether it did: ``persist/cut_writes``).
        """
        return await self._writer.run(plan, write)

    def close(self) -> None:
        """Close the database connection, after the writer thread's batch in progress; queued plans fail."""
        self._closed = True
        _open_stores.discard(self)
        self._writer.close()
        with self._lock:
            self._release()

    async def aclose(self) -> None:
        """``close()`` without blocking the event loop, the store left usable: its next use opens the file again.

        As with ``PostgresStore.aclose``, code that awaits it before its loop
        ends may use the store afterwards.  A fresh writer takes the writes
        awaited from now on; the old one commits its batch in progress, fails
        its queued writes and ends.
        """
        await self._aclose(final=False)

    async def __aenter__(self) -> SqliteStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """``close()``, without blocking the event loop."""
        await self._aclose(final=True)

    async def _aclose(self, *, final: bool) -> None:
        """Stop the writer and close the connection, waiting in worker threads (``final``: for good, as ``close``).

        Joining the writer thread, and taking the lock a sync write of
        another thread may hold, would block the event loop.
        """
        if self._closed:
            return
        if final:
            self._closed = True
            _open_stores.discard(self)
            writer = self._writer  # closed below, it refuses the writes awaited from now on
        else:
            writer, self._writer = self._writer, GroupWriter(self._connection, self._lock, str(self.path))
        await writer.aclose()
        await asyncio.to_thread(self._release_locked)

    def _release_locked(self) -> None:
        with self._lock:
            self._release()

    # --- os.fork: each process opens its own connection, and the child has a writer thread of its own -----------

    def _before_fork(self) -> None:
        """Wait for the transaction in progress and close the connection; the lock is held over the fork."""
        self._lock.acquire()
        _forking.append(self)
        self._release()

    def _after_fork_in_child(self) -> None:
        """A lock and a writer of the child's own: the parent's queued writes stay in the old writer, never run."""
        self._lock = threading.Lock()
        self._writer = GroupWriter(self._connection, self._lock, str(self.path))


_open_stores: weakref.WeakSet[SqliteStore] = weakref.WeakSet()
"""The stores of this process not closed yet, whose connections the fork hooks close."""

_forking: list[SqliteStore] = []
"""The stores whose locks ``_before_fork`` holds over a fork, for the hooks after it."""


def _before_fork() -> None:
    for store in list(_open_stores):
        store._before_fork()  # noqa: SLF001 - this module's fork hooks, kept beside the class they serve


def _after_fork_in_parent() -> None:
    """The parent's stores go on as they were; each opens its connection again at its next use."""
    for store in _forking:
        store._lock.release()  # noqa: SLF001 - as above
    _forking.clear()


def _after_fork_in_child() -> None:
    for store in _forking:
        store._after_fork_in_child()  # noqa: SLF001 - as above
    _forking.clear()


if sys.platform != "win32":  # Windows has no fork
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
