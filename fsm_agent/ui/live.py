"""A run followed live: its page sent as a server-sent event each time the stored run changes, until it ends.

The stream polls the store (``poll`` seconds apart) and sends the run's
page whenever what the page shows changed; ``end`` once the run is in a
terminal state, ``gone`` if it is deleted, ``corrupted`` if it no longer
loads.  Writes that land between two polls (two decisions, a decision and
the resume that ends the run) come as one page: a page is the whole run as
stored, so it shows every one of them, and an ended run always sends
``end``.  A paused run's stream stays open (another person's decision, or a
resume, changes it), so it also ends, quietly, once the server is stopping
(``stopping``): otherwise the server's graceful shutdown cuts it, and every
tab left open on a paused run printed a traceback on Ctrl-C.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.concurrency import run_in_threadpool

from fsm_agent import SnapshotError, Table
from fsm_agent.ui.answers import event_data

QUIET = 15.0
"""Seconds without a change after which a comment line is sent, so no proxy closes a quiet stream."""
SLICE = 0.05
"""Seconds of a poll's wait between looks at ``stopping``: a stream ends within this of the server stopping."""


async def follow(
    load: Callable[[str], dict[str, Any]],
    run_id: str,
    table: Table,
    poll: float,
    gone: Callable[[], Any],
    stopping: threading.Event,
    view: Callable[[dict[str, Any]], dict[str, Any]],
) -> AsyncIterator[str]:
    """Server-sent events: the run's page (``view`` of its stored data) each time it changes; ``end`` once it ends.

    ``load`` reads the stored run (the store's ``load``), off the event loop.
    """
    last: tuple[Any, ...] | None = None
    quiet = 0.0
    while not stopping.is_set() and not await gone():
        try:
            data = await run_in_threadpool(load, run_id)
        except KeyError:
            yield "event: gone\ndata: {}\n\n"
            return
        except SnapshotError as exc:
            yield f"event: corrupted\ndata: {event_data({'error': str(exc)})}\n\n"
            return
        key = (
            data.get("state"),
            len(data.get("trace") or ()),
            len(data.get("messages") or ()),
            bool(data.get("paused")),
            json.dumps(data.get("approvals"), sort_keys=True),
        )
        if key != last:
            last, quiet = key, 0.0
            try:
                page = await run_in_threadpool(view, data)
            except SnapshotError as exc:  # the rows are there, but the snapshot they add up to is not a run's
                yield f"event: corrupted\ndata: {event_data({'error': str(exc)})}\n\n"
                return
            yield f"data: {event_data(page)}\n\n"
            if str(data.get("state")) in {str(state) for state in table.terminal}:
                yield "event: end\ndata: {}\n\n"
                return
        elif quiet >= QUIET:
            quiet = 0.0
            yield ": still following\n\n"  # a comment line keeps proxies from closing a quiet stream
        await _wait(poll, stopping)
        quiet += poll


async def _wait(seconds: float, stopping: threading.Event) -> None:
    """Sleep ``seconds``, or less once ``stopping`` is set (looked at every ``SLICE``): the event loop never blocks."""
    until = time.monotonic() + seconds
    while not stopping.is_set():
        left = until - time.monotonic()
        if left <= 0:
            return
        await anyio.sleep(min(left, SLICE))
