"""Checkpoint stores: where a run's snapshot and journal live, so a restarted process (or another machine) resumes it.

``open_store`` picks the store from what it is given: a ``postgresql://`` or
``postgres://`` URL opens a ``PostgresStore``, anything else is a path to a
``SqliteStore`` file.  ``import fsm_agent`` never imports ``psycopg``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fsm_agent.persist.postgres import PostgresStore
from fsm_agent.persist.sqlite import SqliteStore
from fsm_agent.persist.store import Store, StoredRun, StoreError

POSTGRES_SCHEMES = ("postgresql://", "postgres://")

__all__ = [
    "POSTGRES_SCHEMES",
    "PostgresStore",
    "SqliteStore",
    "Store",
    "StoreError",
    "StoredRun",
    "is_url",
    "open_store",
]


def is_url(target: str | Path) -> bool:
    """Whether ``target`` names a PostgreSQL database rather than a file."""
    return isinstance(target, str) and target.startswith(POSTGRES_SCHEMES)


def open_store(target: str | Path, **options: Any) -> SqliteStore | PostgresStore:
    """A ``PostgresStore`` for a ``postgresql://`` URL, else a ``SqliteStore`` at that path; ``options`` go to it.

    A location that cannot be a store is a ``StoreError`` (a ``FsmAgentError``) naming it.
    """
    if is_url(target):
        return PostgresStore(str(target), **options)
    return SqliteStore(target, **options)
