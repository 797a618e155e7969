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
    """Up to ``size`` connections for one event loop: an idle one is reused, a doubtful one closed."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], size: int, idle: Any) -> None:
        self._connect = connect
        self._idle_status = idle  # psycopg's TransactionStatus.IDLE: no transaction left open
        self._idle: list[Any] = []
        self._free = asyncio.Semaphore(size)
        self._closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A connection for one plan; back to the idle ones after, unless it is broken or mid-transaction."""
        async with self._free:
            conn = self._idle.pop() if self._idle else await self._connect()
            try:
                yield conn
            finally:
                # A plan cut off mid-query (a cancelled task) leaves its connection in a state nobody should reuse.
                reusable = not (self._closed or conn.closed) and conn.info.transaction_status == self._idle_status
                if reusable:
                    self._idle.append(conn)
                else:
                    await conn.close()

    async def close(self) -> None:
        """Close the idle connections; one in use is closed when its plan ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()
