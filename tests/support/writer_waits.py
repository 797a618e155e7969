"""Waiting on a SQLite store's writer thread from the test's event loop, in short polls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool]) -> None:
    """Return once ``condition()`` holds, polling every 5 ms; an ``AssertionError`` after 10 s of polls."""
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    msg = "the writer thread never got there"
    raise AssertionError(msg)
