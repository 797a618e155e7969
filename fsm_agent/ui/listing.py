"""The viewer's list of runs, page by page: where a page starts (a cursor, or an old link's offset) and its answer.

The list is in the order the runs started, latest first
(``list_runs(order="created")``), and paged by cursor: the "older" link
carries the last run's ``RunCursor`` (its creation time and id, neither of
which a save changes), so the next page holds each run once, whatever was
added or saved in between.  An offset, which counts positions in a list that
moves, repeated a run shifted onto the next page and passed over one that
was saved again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fsm_agent.persist.cursor import RunCursor
from fsm_agent.persist.summary import StoredRun
from fsm_agent.ui.answers import JSONText

UNPAGED = "this store cannot list its runs in creation order, which the viewer pages by"
"""The start of the 501 over a store whose ``list_runs`` has no ``order``/``after`` or lists no ``created``."""


def refused(message: str, status: int) -> JSONText:
    """An error answer of the list, its message as the page shows it."""
    return JSONText({"error": message}, status_code=status)


def page_start(after: str | None, offset: str | None) -> tuple[RunCursor | None, int] | JSONText:
    """Where a page starts: after a cursor (``?after=``, the "older" link's), or an old link's offset; else a 400.

    ``?offset=N``, what links made before cursors say, still skips the first
    N runs of the same order, counted now.  The refusal says which of the two
    is at fault and why, and refuses both at once (two starting points).
    """
    if after is not None and offset is not None:
        return refused("give after (the older link's cursor) or offset, not both", 400)
    if after is not None:
        try:
            return RunCursor.parse(after), 0
        except ValueError as exc:
            return refused(f"after must be the cursor of a page of this list: {exc}", 400)
    given = "0" if offset is None else offset
    try:
        skip = int(given)
    except ValueError:  # not a number (or more digits than Python reads)
        skip = -1
    if not 0 <= skip < 2**63:  # both databases take 64-bit integers
        return refused(f"offset must be a whole number from 0 to 2**63 - 1, got {given[:40]!r}", 400)
    return None, skip


def page_answer(found: Sequence[StoredRun], size: int, after: RunCursor | None, offset: int) -> JSONText:
    """The first ``size`` runs of ``found`` (asked for one more, to know if more follow) and the next page's cursor.

    ``next`` is the cursor of the last run shown, None on the last page; a
    store that lists no creation time (``StoredRun.created``) has none to
    give, which is a 501 once a second page is needed.
    """
    more = len(found) > size
    try:
        following = str(RunCursor.of(found[size - 1])) if more else None
    except ValueError as exc:
        return refused(f"{UNPAGED}: {exc}", 501)
    return JSONText(
        {
            "runs": [_row(run) for run in found[:size]],
            "more": more,
            "next": following,
            "after": None if after is None else str(after),
            "offset": offset,
            "now": time.time(),
        }
    )


def _row(run: StoredRun) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "state": run.state,
        "reason": run.reason,
        "paused": run.paused,
        "updated": run.updated,
        "created": run.created,
        "tool_calls": run.tool_calls,
        "session": run.session,
        "tokens": run.tokens,
        "forked_from": run.forked_from,
    }
