"""Checkpoint stores: the latest snapshot of each run, kept where a restarted process can find it.

The engine only needs the small ``Store`` protocol, so a networked store
(PostgreSQL, say) can be added without touching it.  ``SqliteStore`` is the
embedded default: standard library ``sqlite3`` in WAL mode, one row per run,
rewritten after every transition (or every turn), each write its own
transaction, so a process killed mid-run loses at most the transition in flight.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, Protocol

import attrs

from fsm_agent.definition.states import TERMINAL, State


@attrs.frozen
class StoredRun:
    """One run as a store lists it: its id, where it stands, why it stopped, when it was last saved."""

    run_id: str
    state: str
    reason: str | None
    paused: bool
    updated: float


class Store(Protocol):
    """What the engine needs of a checkpoint store."""

    def wants(self, state: State, paused: bool) -> bool:
        """Whether a snapshot should be saved now that the run is in ``state``."""
        ...

    def save(self, run_id: str, snapshot: dict[str, Any]) -> None:
        """Replace the run's latest snapshot."""
        ...

    def load(self, run_id: str) -> dict[str, Any]:
        """The run's latest snapshot; ``KeyError`` naming the id if there is none."""
        ...


class SqliteStore:
    """An embedded checkpoint store in one SQLite file (WAL mode, safe across threads of one process).

    ``every="transition"`` (default) saves after every transition;
    ``every="turn"`` only when a run is about to call the model, has finished,
    or is paused, which writes less for runs with many tool calls.
    """

    def __init__(self, path: str | Path, every: Literal["transition", "turn"] = "transition") -> None:
        if every not in ("transition", "turn"):
            msg = f"every must be 'transition' or 'turn', got {every!r}"
            raise ValueError(msg)
        self.path = Path(path)
        self.every = every
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL loses nothing on a process crash in WAL mode; only a power cut could drop the last commit.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, state TEXT NOT NULL, reason TEXT,"
            " paused INTEGER NOT NULL, updated REAL NOT NULL, snapshot TEXT NOT NULL)"
        )

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def wants(self, state: State, paused: bool) -> bool:
        """Every transition, or (``every="turn"``) before a model call, at the end and when paused."""
        return self.every == "transition" or paused or state is State.AwaitModel or state in TERMINAL

    def save(self, run_id: str, snapshot: dict[str, Any]) -> None:
        """Replace the run's latest snapshot in one transaction."""
        text = json.dumps(snapshot, ensure_ascii=False)
        row = (run_id, snapshot["state"], snapshot.get("reason"), int(bool(snapshot.get("paused"))), time.time(), text)
        with self._transaction() as db:
            db.execute(
                "INSERT INTO runs (run_id, state, reason, paused, updated, snapshot) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(run_id) DO UPDATE SET state=excluded.state, reason=excluded.reason,"
                " paused=excluded.paused, updated=excluded.updated, snapshot=excluded.snapshot",
                row,
            )

    def load(self, run_id: str) -> dict[str, Any]:
        """The run's latest snapshot."""
        with self._lock:
            found = self._db.execute("SELECT snapshot FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if found is None:
            msg = f"no run {run_id!r} in {self.path}"
            raise KeyError(msg)
        data: dict[str, Any] = json.loads(found[0])
        return data

    def list_runs(self) -> list[StoredRun]:
        """Every stored run, most recently saved first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT run_id, state, reason, paused, updated FROM runs ORDER BY updated DESC, run_id"
            ).fetchall()
        return [
            StoredRun(run_id, state, reason, bool(paused), updated) for run_id, state, reason, paused, updated in rows
        ]

    def delete(self, run_id: str) -> bool:
        """Forget one run; return whether it was there."""
        with self._transaction() as db:
            return db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount > 0

    def delete_finished(self) -> int:
        """Forget every run in ``Done`` or ``Failed``; return how many."""
        with self._transaction() as db:
            terminal = [str(s) for s in TERMINAL]
            return db.execute("DELETE FROM runs WHERE state IN (?, ?)", terminal).rowcount

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
