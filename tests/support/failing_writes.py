"""A real store (SQLite or PostgreSQL) whose journal appends fail on demand, as a dropped connection fails them.

``failing_store(target, ...)`` opens the store ``target`` names (a SQLite
path or a ``postgresql://`` URL) as a subclass whose next ``fails`` appends
holding ``matching`` in their entry raise ``ConnectionError``: before the
write (nothing stored), or with ``landed=True`` after it committed (the
server had it; its answer never came back).  Sync and async appends alike.
With ``hangs`` (seconds), an async append that fails first waits that long,
as a server that does not answer, and says it began (``hanging``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from fsm_agent import PostgresStore, SqliteStore
from fsm_agent.persist import is_url
from fsm_agent.persist.summary import Entry

DROPPED = "the store's connection dropped"


class _Failing:
    """The appends that fail: how many are left, the text they hold, and whether they land first."""

    fails = 0
    matching = ""
    landed = False
    failed = 0
    hangs = 0.0
    hanging: threading.Event

    def _fails_now(self, entry: Entry) -> bool:
        if self.fails and self.matching in entry.text:
            self.fails -= 1
            self.failed += 1
            return True
        return False

    def append(self, entry: Entry, *, owner: str) -> None:
        if not self._fails_now(entry):
            super().append(entry, owner=owner)  # type: ignore[misc]
            return
        if self.landed:
            super().append(entry, owner=owner)  # type: ignore[misc]
        raise ConnectionError(DROPPED)

    async def aappend(self, entry: Entry, *, owner: str) -> None:
        if not self._fails_now(entry):
            await super().aappend(entry, owner=owner)  # type: ignore[misc]
            return
        if self.landed:
            await super().aappend(entry, owner=owner)  # type: ignore[misc]
        if self.hangs:
            self.hanging.set()
            await asyncio.sleep(self.hangs)
        raise ConnectionError(DROPPED)


class FailingSqlite(_Failing, SqliteStore):
    """A ``SqliteStore`` whose appends fail on demand."""


class FailingPostgres(_Failing, PostgresStore):
    """A ``PostgresStore`` whose appends fail on demand."""


def failing_store(target: str, *, fails: int = 0, matching: str = "", landed: bool = False, **options: Any) -> Any:
    """The store at ``target`` (``lease=``, ``every=``: ``options``) whose next ``fails`` appends holding ``matching``
    raise ``ConnectionError``, having written nothing, or (``landed``) having committed."""
    store: FailingSqlite | FailingPostgres = (
        FailingPostgres(target, **options) if is_url(target) else FailingSqlite(target, **options)
    )
    store.fails, store.matching, store.landed = fails, matching, landed
    store.hanging = threading.Event()
    return store
