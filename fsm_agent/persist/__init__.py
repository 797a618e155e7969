"""Checkpoint stores: where a run's snapshot and journal live, so a restarted process (or another machine) resumes it.

``open_store`` picks the store from what it is given: a ``postgresql://`` or
``postgres://`` URL opens a ``PostgresStore``, anything else is a path to a
``SqliteStore`` file.  ``import fsm_agent`` never imports ``psycopg``.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
from pathlib import Path
from typing import Any

from fsm_agent.persist.checks import check_snapshot, check_store
from fsm_agent.persist.cursor import RunCursor
from fsm_agent.persist.postgres import PostgresStore
from fsm_agent.persist.sqlite import EMPTY_PATH, SqliteStore
from fsm_agent.persist.store import AsyncStore, FullStore, JournaledStore, Store, StoreError, journaled
from fsm_agent.persist.summary import StoredRun

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
STORE_KINDS = "a SQLite file's path or a postgresql:// (or postgres://) URL"
"""What a store location may be, as an error about one that is neither says it."""
_SCHEME = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")

StoreTarget = Store | str | os.PathLike[str]
"""What a ``store=`` argument takes: a store, a SQLite file's path, or a ``postgresql://`` URL."""

__all__ = [
    "POSTGRES_SCHEMES",
    "AsyncStore",
    "FullStore",
    "JournaledStore",
    "PostgresStore",
    "RunCursor",
    "SqliteStore",
    "Store",
    "StoreError",
    "StoreTarget",
    "StoredRun",
    "check_snapshot",
    "is_url",
    "journaled",
    "open_store",
    "store_for",
]


def is_url(target: str | Path) -> bool:
    """Whether ``target`` names a PostgreSQL database rather than a file."""
    return isinstance(target, str) and target.startswith(POSTGRES_SCHEMES)


def open_store(target: str | Path, **options: Any) -> SqliteStore | PostgresStore:
    """A ``PostgresStore`` for a ``postgresql://`` URL, else a ``SqliteStore`` at that path; ``options`` go to it.

    A location that cannot be a store is a ``StoreError`` (a ``FsmAgentError``) naming it; so is a URL
    of another kind (``mysql://``), which would otherwise be taken for a file's path.
    """
    scheme = _SCHEME.match(target) if isinstance(target, str) else None
    if scheme is not None and not is_url(target):
        # Only the scheme is repeated: the rest of the URL may hold a password.
        reason = f"{scheme['scheme']}:// is not a kind of store this package has; a store is {STORE_KINDS}"
        raise StoreError(f"{scheme['scheme']}://...", reason)
    if is_url(target):
        return PostgresStore(str(target), **options)
    return SqliteStore(target, **options)


_BUILT_IN = (SqliteStore, PostgresStore)
"""The stores whose methods are known to fit: a store object of another class has them checked as a run starts."""
_opened: dict[tuple[int, str], SqliteStore | PostgresStore] = {}
_opening = threading.Lock()


def store_for(target: StoreTarget | None) -> Store | None:
    """The store a ``store=`` argument names: a store as it is; a path or URL opened once per process and kept.

    A web handler calling ``agent.run(..., store="runs.db")`` per request so
    shares one connection (one pool, for PostgreSQL) instead of opening and
    migrating a database each time.  Keyed by process as well, so a forked
    worker opens its own; closed when the interpreter exits.
    """
    if target is None:
        return None
    if not isinstance(target, str | os.PathLike):
        if type(target) not in _BUILT_IN:  # checked before the run begins, not found wrong at a later write
            check_store(target, given_as="a store (wants, save, load), a path or a postgresql:// URL")
        return target
    where = os.fspath(target)
    if not where:
        raise StoreError("''", EMPTY_PATH)
    # A URL is kept as it is, so a URL of a kind no store has is refused as one, not opened as a file.
    key = (os.getpid(), where if is_url(where) or _SCHEME.match(where) else os.path.abspath(where))
    with _opening:
        store = _opened.get(key)
        if store is None:
            store = _opened[key] = open_store(key[1])
    return store


@atexit.register
def _close_opened() -> None:
    mine = [key for key in _opened if key[0] == os.getpid()]
    for key in mine:
        _opened.pop(key).close()
