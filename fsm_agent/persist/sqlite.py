"""``SqliteStore``: the embedded checkpoint store, one SQLite file in WAL mode, standard library only.

Each write is its own transaction under SQLite's write lock, so several
processes may share one file; a process killed mid-run loses at most the
transition in flight.  The schema is versioned with ``PRAGMA user_version``
and migrated on open: a file written by the first ``SqliteStore`` (one whole
snapshot per run, version 1) opens and loads as it was.  The async methods
run the sync ones in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

from fsm_agent.definition.states import State
from fsm_agent.persist import plans
from fsm_agent.persist.store import (
    DEFAULT_LEASE,
    Entry,
    StoredRun,
    StoreError,
    Summary,
    check_every,
    check_lease,
    check_run_id,
    cutoff,
    epoch,
    page,
    wants,
)

T = TypeVar("T")

SCHEMA_VERSION = 2

_V1 = (
    "CREATE TABLE runs (run_id TEXT PRIMARY KEY, state TEXT NOT NULL, reason TEXT,"
    " paused INTEGER NOT NULL, updated REAL NOT NULL, snapshot TEXT NOT NULL)"
)
_V2 = (
    "ALTER TABLE runs ADD COLUMN steps INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE runs ADD COLUMN tokens INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE runs ADD COLUMN seq INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE runs ADD COLUMN base_seq INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE runs ADD COLUMN owner TEXT",
    "ALTER TABLE runs ADD COLUMN lease_until REAL",
    "CREATE TABLE journal (run_id TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL,"
    " PRIMARY KEY (run_id, seq)) WITHOUT ROWID",
    "CREATE INDEX runs_by_updated ON runs (updated)",
)
_COLUMNS = {"run_id", "state", "reason", "paused", "updated", "snapshot", "steps", "tokens", "seq", "base_seq", "owner"}


class SqliteStore:
    """An embedded checkpoint store in one SQLite file (WAL mode, safe across threads and processes).

    ``every="transition"`` (default) checkpoints after every transition;
    ``every="turn"`` only when a run is about to call the model, has finished,
    or is paused.  ``lease`` is how many seconds a run stays owned by the
    process advancing it without a checkpoint; see ``Agent.run(store=...)``.
    A path that SQLite cannot use as a store is a ``StoreError`` naming it.
    """

    def __init__(
        self, path: str | Path, every: Literal["transition", "turn"] = "transition", *, lease: float = DEFAULT_LEASE
    ) -> None:
        self.every = check_every(every)
        self.lease = check_lease(lease)
        self.path = Path(path)
        self._lock = threading.Lock()
        self._plans = plans.Plans("runs", "journal", placeholder="?", no_limit="-1", where=str(self.path), lease=lease)
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        except sqlite3.Error as exc:
            raise self._unusable(exc) from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL loses nothing on a process crash in WAL mode; only a power cut could drop the last commit.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
        except sqlite3.Error as exc:
            self._db.close()
            raise self._unusable(exc) from None

    def _unusable(self, exc: sqlite3.Error) -> StoreError:
        return StoreError(str(self.path), str(exc))

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def _migrate(self) -> None:
        """Bring the file's schema to ``SCHEMA_VERSION``; one transaction, so concurrent openers do it once."""
        with self._lock:
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
                    self._db.execute(_V1)
                if version < 2:
                    self._upgrade_to_v2()
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                missing = _COLUMNS - {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
                if missing:
                    msg = f"its runs table is not a run store's (no {', '.join(sorted(missing))})"
                    raise sqlite3.DatabaseError(msg)  # noqa: TRY301 - inside the transaction, so it rolls back
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _upgrade_to_v2(self) -> None:
        for statement in _V2:
            self._db.execute(statement)
        rows = self._db.execute("SELECT run_id, snapshot FROM runs").fetchall()
        for run_id, text in rows:
            summary = Summary.of(json.loads(text))
            columns = (summary.steps, summary.tokens, run_id)
            self._db.execute("UPDATE runs SET steps = ?, tokens = ? WHERE run_id = ?", columns)

    def _run(self, plan: plans.Plan[T], *, write: bool = True) -> T:
        """Run a plan in one transaction (a write takes the file's write lock at once, so it cannot deadlock)."""

        def execute(sql: str, params: tuple[Any, ...]) -> plans.Reply:
            cursor = self._db.execute(sql, params)
            return cursor.rowcount, cursor.fetchall()

        with self._lock:
            self._db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                value = plans.drive(plan, execute)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return value

    # --- the protocol --------------------------------------------------------------------------------------

    def wants(self, state: State, paused: bool) -> bool:
        """Every transition, or (``every="turn"``) before a model call, at the end and when paused."""
        return wants(self.every, state, paused)

    def save(self, run_id: str, snapshot: dict[str, Any]) -> None:
        """Replace the stored run with this whole snapshot (``RunLeasedError`` while another owner advances it)."""
        self._run(self._plans.put(check_run_id(run_id), snapshot, None, "replace"))

    def load(self, run_id: str) -> dict[str, Any]:
        """The run's latest snapshot: its base with the journal after it; ``KeyError`` naming the id if absent."""
        return self._run(self._plans.load(run_id), write=False)

    def create(self, run_id: str, snapshot: dict[str, Any], *, owner: str, overwrite: bool = False) -> int:
        """Store a new run, leased to ``owner``; ``RunExistsError`` if the id is taken (unless ``overwrite``)."""
        mode: plans.Mode = "overwrite" if overwrite else "create"
        return self._run(self._plans.put(check_run_id(run_id), snapshot, owner, mode))

    def claim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        """Take a run over to resume it from ``snapshot``; ``RunLeasedError`` while another owner's lease is live."""
        return self._run(self._plans.put(check_run_id(run_id), snapshot, owner, "claim"))

    def append(self, entry: Entry, *, owner: str) -> None:
        """Add one journal entry for ``owner``; ``RunLeasedError`` if the run is no longer its to write."""
        self._run(self._plans.append(entry, owner))

    def renew(self, run_id: str, *, owner: str, seq: int, release: bool = False) -> None:
        """Extend ``owner``'s lease (or give it up), checked like ``append``."""
        self._run(self._plans.renew(run_id, owner, seq, release=release))

    def list_runs(
        self,
        *,
        state: str | None = None,
        reason: str | None = None,
        since: float | datetime | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[StoredRun]:
        """The stored runs, most recently saved first, filtered by state, reason and last save time, one page."""
        size, skip = page(limit, offset)
        plan = self._plans.list_runs(state, reason, epoch(since), None if size < 0 else size, skip)
        return self._run(plan, write=False)

    def delete(self, run_id: str) -> bool:
        """Forget one run; return whether it was there."""
        return self._run(self._plans.delete(run_id))

    def delete_finished(self, older_than: float | timedelta | None = None) -> int:
        """Forget every run in ``Done`` or ``Failed`` (last saved more than ``older_than`` ago); return how many."""
        before = None if older_than is None else cutoff(older_than)
        return self._run(self._plans.delete_finished(before))

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- awaited: the same calls in a worker thread, so the event loop never waits on the file --------------

    async def _thread(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(method, *args, **kwargs)

    async def asave(self, run_id: str, snapshot: dict[str, Any]) -> None:
        """``save`` in a worker thread."""
        await self._thread(self.save, run_id, snapshot)

    async def aload(self, run_id: str) -> dict[str, Any]:
        """``load`` in a worker thread."""
        return await self._thread(self.load, run_id)

    async def acreate(self, run_id: str, snapshot: dict[str, Any], *, owner: str, overwrite: bool = False) -> int:
        """``create`` in a worker thread."""
        return await self._thread(self.create, run_id, snapshot, owner=owner, overwrite=overwrite)

    async def aclaim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        """``claim`` in a worker thread."""
        return await self._thread(self.claim, run_id, snapshot, owner=owner)

    async def aappend(self, entry: Entry, *, owner: str) -> None:
        """``append`` in a worker thread."""
        await self._thread(self.append, entry, owner=owner)

    async def arenew(self, run_id: str, *, owner: str, seq: int, release: bool = False) -> None:
        """``renew`` in a worker thread."""
        await self._thread(self.renew, run_id, owner=owner, seq=seq, release=release)

    async def alist_runs(self, **filters: Any) -> list[StoredRun]:
        """``list_runs`` in a worker thread."""
        return await self._thread(self.list_runs, **filters)

    async def adelete(self, run_id: str) -> bool:
        """``delete`` in a worker thread."""
        return await self._thread(self.delete, run_id)

    async def adelete_finished(self, older_than: float | timedelta | None = None) -> int:
        """``delete_finished`` in a worker thread."""
        return await self._thread(self.delete_finished, older_than)

    async def aclose(self) -> None:
        """Nothing of this store belongs to the event loop (``close()`` closes the file), so nothing to do."""
