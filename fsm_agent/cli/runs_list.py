"""``runs list``: the stored runs, latest started first, a page at a time, each page after the last one's cursor.

The order is the run viewer's (``list_runs(order="created")``): when the
store first held a run never changes, so a page asked for with the cursor
the previous one named (``more runs: --after CURSOR``) lists each run that
was there exactly once, whatever is saved or started meanwhile.  A page asked
for by ``--offset``, as scripts written before cursors page, names the next
offset instead; a run started or deleted between two such pages shifts them.

``--parent RUN_ID`` lists only the sub-agent runs that run's tool calls
made, one level down, by the store's own filter (``list_runs(parent=...)``),
each line with one more column, last: ``call=ID``, the parent's call that
made it.  Lines without ``--parent`` keep their columns, which scripts read.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fsm_agent.cli import EXIT_DONE, SetupError
from fsm_agent.cli.terminal import one_field, printable
from fsm_agent.definition.states import STATES, State
from fsm_agent.errors import SnapshotError
from fsm_agent.persist.cursor import RunCursor
from fsm_agent.persist.store import filter_text

if TYPE_CHECKING:
    from fsm_agent import PostgresStore, SqliteStore

    AnyStore = SqliteStore | PostgresStore

PAGE = 50
"""Runs ``runs list`` shows unless ``--limit`` says otherwise."""
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


LARGEST = 2**63 - 1
"""The largest page a store can be asked for (its databases' 64-bit integers); ``--limit`` one less: one run more
is read to tell whether more follow."""


def add_parser(actions: Any) -> argparse.ArgumentParser:
    """Register the ``list`` action of ``runs``; the caller adds ``--store``."""
    listing: argparse.ArgumentParser = actions.add_parser(
        "list",
        help="the runs in the store, latest first, a page at a time",
        description="One line per run, latest started first: id, state, stop reason, tool calls, tokens, last save "
        "(tab-separated). When more runs follow, stderr says how to ask for them: 'more runs: --after CURSOR'. "
        "Paged that way, each run that was there is listed exactly once, whatever is saved or started meanwhile. "
        "With --parent, each line ends in one more column, call=ID: the parent's tool call that made the run.",
    )
    listing.add_argument("--state", help="only runs in this state (e.g. Failed, ExecuteTool)")
    listing.add_argument("--reason", help="only runs that stopped with this reason (e.g. max_steps, done)")
    listing.add_argument("--session", metavar="ID", help="only the turns of this conversation (fsm_agent.Session)")
    listing.add_argument(
        "--parent",
        metavar="RUN_ID",
        help="only the sub-agent runs this run's tool calls made (not theirs: one level), each line ending in "
        "call=ID, the parent's call that made it; a run the store does not hold is an error",
    )
    listing.add_argument("--since", type=moment, metavar="WHEN", help="only runs saved since: 2h, 7d or an ISO date")
    listing.add_argument("--limit", type=int, default=PAGE, help=f"runs per page (default {PAGE})")
    start = listing.add_mutually_exclusive_group()
    start.add_argument(
        "--after",
        type=_cursor,
        metavar="CURSOR",
        help="the page after the run CURSOR names: the cursor the line 'more runs: --after CURSOR' gives",
    )
    start.add_argument(
        "--offset",
        type=int,
        default=None,
        help="runs to skip, as scripts written before --after page (its 'more runs' line names the next offset): a "
        "run started or deleted between two pages makes the next one skip or repeat a run",
    )
    return listing


def seconds(text: str) -> float:
    """A duration: seconds, or a number with s, m, h, d or w."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if found is None:
        msg = f"not a duration: {text!r} (e.g. 90m, 12h, 7d)"
        raise argparse.ArgumentTypeError(msg)
    return float(found[1]) * _UNITS.get(found[2] or "s", 1)


def moment(text: str) -> float:
    """A point in time: that long ago (``2h``), or an ISO date or date and time (local unless it says)."""
    try:
        return time.time() - seconds(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        msg = f"not a duration or ISO date: {text!r} (e.g. 2h, 7d, 2026-12-01 or 2026-12-01T09:30)"
        raise argparse.ArgumentTypeError(msg) from None


def _cursor(text: str) -> RunCursor:
    """A page's cursor, as a ``more runs: --after CURSOR`` line gives it."""
    try:
        return RunCursor.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}: give the CURSOR a 'more runs' line names") from None


def main(store: AnyStore, args: argparse.Namespace) -> int:
    """A page of runs, latest started first (``order="created"``), from ``--after`` (or ``--offset``) on.

    The creation order is the viewer's: a run saved again keeps its place, so
    a page after a cursor lists each run that was there once.  A page asked
    for by ``--offset`` (scripts written before cursors) names the next
    offset, as it did; any other names the next cursor.
    """
    offset = args.offset
    if not 1 <= args.limit < LARGEST or (offset is not None and not 0 <= offset <= LARGEST):
        msg = f"--limit must be from 1 to {LARGEST - 1} and --offset from 0 to {LARGEST}"
        raise SetupError(msg)
    for name in ("state", "reason", "session", "parent"):
        value = getattr(args, name)
        try:
            filter_text(name, value)
        except ValueError:  # a NUL, or a byte argv could not decode (a lone surrogate): no store can compare it
            msg = f"runs list: --{name} {value!r} must be text without NUL or lone surrogates"
            raise SetupError(msg) from None
    _check_state(args.state)
    if args.parent is not None:
        _check_parent(store, args.parent)
    runs = store.list_runs(
        state=args.state,
        reason=args.reason,
        since=args.since,
        limit=args.limit + 1,
        offset=offset or 0,
        session=args.session,
        order="created",
        after=args.after,
        parent=args.parent,
    )
    for run in runs[: args.limit]:
        saved = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.updated))
        calls = run.tool_calls
        counts = f"{calls} tool call{'' if calls == 1 else 's'}\t{run.tokens} tokens"
        state = where(run.state, paused=run.paused)
        line = f"{one_field(run.run_id)}\t{state}\t{one_field(run.reason or '-')}\t{counts}\t{saved}"
        line += "" if run.forked_from is None else f"\t{one_field(origin(run.forked_from))}"
        if args.parent is not None:  # a last column only here: the lines of other listings keep theirs
            line += f"\tcall={'-' if run.parent is None else one_field(run.parent[1])}"
        print(line)
    if len(runs) > args.limit:
        if offset is not None:
            more = f"--offset {offset + args.limit}"
        else:  # quoted for the shell when its run id needs it (a plain id needs none); control characters escaped
            more = f"--after {shlex.quote(str(RunCursor.of(runs[args.limit - 1])))}"
        print(printable(f"more runs: {more}"), file=sys.stderr)
    return EXIT_DONE


def _check_state(state: str | None) -> None:
    """Refuse a ``--state`` no run can be in, which would list nothing; ``SetupError`` naming the states there are.

    The filter compares the state the store holds.  ``awaiting approval`` is
    how the listing shows a paused run, whose stored state is ``ExecuteTool``:
    refused too, pointing there, rather than filtered here a page at a time.
    """
    if state is None or state in STATES:
        return
    states = ", ".join(STATES)
    if state == where(State.ExecuteTool, paused=True):
        msg = (
            f"runs list: --state {state!r} is how a paused run is shown, not a state: paused runs are in "
            f"ExecuteTool (--state ExecuteTool lists them, with any running a tool); the states are {states}"
        )
        raise SetupError(msg)
    alike = [known for known in STATES if known.lower() == state.strip().lower()]
    hint = f" (did you mean {alike[0]}?)" if alike else ""
    msg = f"runs list: --state {state!r} is no state a run can be in{hint}; the states are {states}"
    raise SetupError(msg)


def _check_parent(store: AnyStore, run_id: str) -> None:
    """Refuse a ``--parent`` the store does not hold: the ``KeyError`` naming it, as ``runs show`` gives.

    Its sub-agent runs would list nothing, which reads as a run without
    any.  A parent stored but unreadable (``SnapshotError``) is there: its
    sub-agent runs are listed.
    """
    with contextlib.suppress(SnapshotError):  # a KeyError goes on, to the error every runs action prints
        store.load(run_id)


def origin(forked_from: tuple[str, int]) -> str:
    """Where a fork came from, as ``runs list`` and ``runs show`` print it."""
    source, at = forked_from
    return f"forked from {source} at {at}"


def where(state: str, *, paused: bool) -> str:
    """A run's state as a person reads it: a paused run is waiting for a decision, its held-back calls not run.

    Its stored state is ``ExecuteTool`` (the machine pauses on entering it),
    which read as it is would say a tool is running.
    """
    return "awaiting approval" if paused else state
