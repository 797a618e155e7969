"""The async PostgreSQL connections of one event loop: opened when needed, reused, closed when the loop ends.

Why not ``psycopg_pool.AsyncConnectionPool``: its background tasks belong
to the loop, and ``asyncio.run`` cancels every task before anything can
close the pool, so each ``asyncio.run(agent.arun(..., store=pg))`` left its
connections open (two a run) and ``close()`` could not reach them.  These
connections have no task of their own: the store closes them from an async
generator the loop finalises as it shuts down (``PostgresStore._closed_with``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any


class LoopConnections:
    """Up to ``size`` connections for one event loop: an idle one reused unless broken or dropped."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Any]],
        size: int,
        idle: Any,
        check: Callable[[Any], Awaitable[None]],
    ) -> None:
        self._connect = connect
        self._check = check  # raises for an idle connection the server dropped (``persist/dropped_connections.py``)
        self._idle_status = idle  # psycopg's TransactionStatus.IDLE: no transaction left open
        self._idle: list[Any] = []
        self._free = asyncio.Semaphore(size)
        self._closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A connection for one plan; back to the idle ones after, unless it is broken or mid-transaction."""
        async with self._free:
            conn = await self._take()
            try:
                yield conn
            finally:
                # A plan cut off mid-query (a cancelled task) leaves its connection in a state nobody should reuse.
                reusable = not (self._closed or conn.closed) and conn.info.transaction_status == self._idle_status
                if reusable:
                    self._idle.append(conn)
                else:
                    await conn.close()

    async def _take(self) -> Any:
        """The last idle connection the server did not drop, or a new one."""
        while self._idle:
            conn = self._idle.pop()
            try:
                await self._check(conn)
            except BaseException as exc:
                await conn.close()  # dropped (psycopg's own error), or its check cut by a cancel: not one to reuse
                if isinstance(exc, Exception):
                    continue  # the next idle one, or a new one
                raise
            return conn
        return await self._connect()

    async def close(self) -> None:
        """Close the idle connections; one in use is closed when its plan ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()
