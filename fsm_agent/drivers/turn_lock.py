"""The lock of a session's turns, taken from threads and event loops alike: an awaited take never blocks its loop.

A ``Session`` serves turns from threads (``run``) and from any number of
event loops (``arun``) with one ``threading.Lock``: an ``asyncio.Lock``
would serve one loop only, and two locks would let a sync and an async turn
interleave.  A sync turn waits for it as for any lock; an awaited one polls.
"""

from __future__ import annotations

import threading

_FIRST_POLL, _LAST_POLL = 0.001, 0.02
"""Seconds an awaited turn first sleeps, then at most, between tries at a session's lock another turn holds.

Measured against waiting in a worker thread (``asyncio.to_thread(lock.acquire)``): that hands the lock over
in 0.15 ms, polling in 11 ms at the median (19 ms at most), nothing beside a model call of 300 ms or more;
but each waiting turn would hold one of the default executor's few threads, which the turn holding the lock
needs for its own model calls and store writes, and a cancelled wait would leave a thread to take the lock
for nobody.  A poll holds no thread, and a cancelled one holds nothing.
"""


async def acquire(lock: threading.Lock) -> None:
    """Take ``lock`` from an event loop without blocking it: try, then sleep a little longer each time, and retry.

    See ``_FIRST_POLL`` for why a poll and not a waiting thread.  A
    cancelled wait has taken nothing.
    """
    import asyncio  # as in drivers.aio: import fsm_agent loads no asyncio

    pause = _FIRST_POLL
    while not lock.acquire(blocking=False):
        await asyncio.sleep(pause)
        pause = min(pause * 2, _LAST_POLL)
