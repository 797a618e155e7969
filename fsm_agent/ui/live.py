"""A run followed live: its page sent as a server-sent event whenever it differs from the last one sent, until it ends.

The stream polls the store (``poll`` seconds apart): each poll reads the
run and lists its sub-agent runs (one ``list_runs(parent=...)``, however
many there are), and the page is sent when it
differs from the last one sent; ``end`` once the run is in a terminal state,
``gone`` if it is deleted, ``corrupted`` if it no longer loads.  Why the
page and not a key of the run's record: a key (state, counts, paused,
approvals) missed what the page shows beside them, a sub-agent run moving
on while its parent's record stays put (steps during one call, a paused
child resumed under a paused parent) and a record saved again with the
same counts (a message's text redacted).  The run's layout is built again
only when its record changed (compared whole; it carries its stored
version), the children's standing at every poll, and the page written out
only when either changed, so a quiet poll costs a load and a listing and little more.
Writes that land between two polls (two decisions, a decision and the
resume that ends the run) come as one page: a page is the whole run as
stored, so it shows every one of them, and an ended run always sends
``end``.  A paused run's stream stays open (another person's decision, or a
resume, changes it), so it also ends, quietly, once the server is stopping
(``stopping``): otherwise the server's graceful shutdown cuts it, and every
tab left open on a paused run printed a traceback on Ctrl-C.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

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
    children: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
) -> AsyncIterator[str]:
    """Server-sent events: the run's page each time it differs from the last one sent; ``end`` once the run ends.

    ``load`` reads the stored run (the store's ``load``); ``view`` lays out
    its record (``replay.digest``); ``children`` adds where its sub-agent
    runs stand (``run_page.with_children``), from one listing of them.
    All three run off the event loop, once per poll.
    """
    known: _Known | None = None
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
        try:
            known, text = await run_in_threadpool(_page, data, known, view, children)
        except SnapshotError as exc:  # the rows are there, but the snapshot they add up to is not a run's
            yield f"event: corrupted\ndata: {event_data({'error': str(exc)})}\n\n"
            return
        if text is not None:
            quiet = 0.0
            yield f"data: {text}\n\n"
            if str(data.get("state")) in {str(state) for state in table.terminal}:
                yield "event: end\ndata: {}\n\n"
                return
        elif quiet >= QUIET:
            quiet = 0.0
            yield ": still following\n\n"  # a comment line keeps proxies from closing a quiet stream
        await _wait(poll, stopping)
        quiet += poll


class _Known(NamedTuple):
    """What the last page was built from: the run's record as read, its layout (``view``'s), and the page's text."""

    data: dict[str, Any]
    digest: dict[str, Any]
    children: list[dict[str, Any]]
    text: str


def _page(
    data: dict[str, Any],
    known: _Known | None,
    view: Callable[[dict[str, Any]], dict[str, Any]],
    children: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
) -> tuple[_Known, str | None]:
    """What the stream knows now, and the page's text if it differs from the last one sent (else None).

    The page is the run's record laid out (``view``, built again only when
    the record changed: it is compared whole, and carries its stored
    version, so any write differs) and its sub-agent runs' standing, read at
    every poll.  Both the same as last time: the page is, and is not even
    written out.  Else its text is compared with the last one sent: whatever
    the page shows, of the run or of a sub-agent run, a change is sent.
    """
    same = known is not None and known.data == data
    digest = known.digest if known is not None and same else view(data)
    page = children(data, digest)
    if known is not None and same and known.children == page["children"]:
        return known, None
    text = event_data(page)
    return _Known(data, digest, page["children"], text), None if known is not None and known.text == text else text


async def _wait(seconds: float, stopping: threading.Event) -> None:
    """Sleep ``seconds``, or less once ``stopping`` is set (looked at every ``SLICE``): the event loop never blocks."""
    until = time.monotonic() + seconds
    while not stopping.is_set():
        left = until - time.monotonic()
        if left <= 0:
            return
        await anyio.sleep(min(left, SLICE))
