"""The checks every store makes of what it is given, the same in every store: run ids, filters, pages, snapshots.

A value no store could hold is refused here, by name, before any query, so
SQLite and PostgreSQL (and a store of yours that calls these) refuse alike:
PostgreSQL cannot take a NUL in a query's text, nor an integer past 64 bits.
"""

from __future__ import annotations

import inspect
import math
import time
from datetime import datetime, timedelta
from typing import Any

from fsm_agent.core import snapshot as snapshots
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.definition.table import TABLE
from fsm_agent.errors import SnapshotError

MAX_RUN_ID_BYTES = 1024
"""The longest run id, in UTF-8 bytes: the same bound in every store (PostgreSQL cannot index a key past 2,704)."""


def storable(run_id: object) -> bool:
    """Whether a store could hold a run under ``run_id`` (a lookup of any other id finds no run, in every store)."""
    try:
        check_run_id(run_id)
    except (TypeError, ValueError):
        return False
    return True


def check_run_id(run_id: object) -> str:
    """A run id a store can key on: UTF-8 text, not empty, no NUL, ``MAX_RUN_ID_BYTES`` at most; else ``ValueError``."""
    if not isinstance(run_id, str):
        msg = f"run_id must be a str, got {type(run_id).__name__}"
        raise TypeError(msg)
    if not run_id:
        # An empty id used to become a random one, leaving a run nobody could find again.
        msg = "run_id must not be empty (leave it out, or None, for a fresh id)"
        raise ValueError(msg)
    try:
        size = len(run_id.encode("utf-8"))
    except UnicodeEncodeError:
        size = -1
    if "\x00" in run_id or size < 0:
        msg = f"run_id {run_id!r} must be text without NUL or lone surrogates"
        raise ValueError(msg)
    if size > MAX_RUN_ID_BYTES:
        msg = f"run_id must be at most {MAX_RUN_ID_BYTES} bytes of UTF-8, got {size} ({run_id[:40]!r}...)"
        raise ValueError(msg)
    return run_id


STORE_CALLS: tuple[tuple[str, str, tuple[Any, ...]], ...] = (
    ("wants", "wants(state, paused)", (State.AwaitModel, False)),
    ("save", "save(run_id, snapshot)", ("run", {})),
    ("load", "load(run_id)", ("run",)),
)
"""The methods every store has, as the journal calls them, with arguments of the kinds it passes."""


def check_store(store: object, *, given_as: str) -> None:
    """Refuse a store object that lacks ``wants``, ``save`` or ``load``, or whose method takes other arguments.

    Checked as a run starts, before any call: the journal first asks
    ``wants`` at a run's second checkpoint, after a paid model call, so a
    wrong signature found there loses the reply.  ``given_as`` says what a
    store may be in the place it was given (a path, a URL, ...).
    """
    kind = type(store).__name__
    missing = [name for name, _, _ in STORE_CALLS if not callable(getattr(store, name, None))]
    if missing:  # one without any is no store at all; one with some is a store missing a method, named
        lacks = "" if len(missing) == len(STORE_CALLS) else f", which has no {' or '.join(missing)} method"
        msg = f"store must be {given_as}, got {kind}{lacks}"
        raise TypeError(msg)
    for name, call, sample in STORE_CALLS:
        method = getattr(store, name)
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):  # a method without a readable signature (a builtin): not checked
            continue
        try:
            signature.bind(*sample)
        except TypeError as exc:
            msg = f"store {kind}'s {name}{signature} cannot be called as {call}, as the journal calls it: {exc}"
            raise TypeError(msg) from None


def filter_text(name: str, value: str | None) -> str | None:
    """A ``list_runs`` text filter as given: None, or text a store can compare (no NUL, no lone surrogate).

    A value no store could hold is a ``ValueError`` naming the filter, the
    same in every store (PostgreSQL cannot take a NUL in a query's text).
    """
    if value is None:
        return None
    if not isinstance(value, str):
        msg = f"list_runs {name} must be a str or None, got {type(value).__name__}"
        raise TypeError(msg)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        ok = False
    else:
        ok = "\x00" not in value
    if not ok:
        msg = f"list_runs {name} {value[:40]!r} must be text without NUL or lone surrogates"
        raise ValueError(msg)
    return value


def check_lease(lease: float) -> float:
    """A lease length in seconds: finite and > 0."""
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not 0 < lease < math.inf:
        msg = f"lease must be a finite number of seconds > 0, got {lease!r}"
        raise ValueError(msg)
    return float(lease)


def check_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot``, once it passed the checks a resume makes; ``SnapshotError`` naming the field at fault if not.

    What a store's ``save`` calls first, so a store never holds a run that
    would not load: the format, every field and their agreement are checked,
    as ``Agent.resume`` checks them.
    """
    if not isinstance(snapshot, dict):
        msg = f"a snapshot to save must be a dict, got {type(snapshot).__name__}"
        raise SnapshotError(msg)
    data = snapshots.parse(snapshot)
    snapshots.load(Run(snapshots.limits_of(data), [], table=TABLE), data, TABLE.states)
    return snapshot


def epoch(moment: float | datetime | None) -> float | None:
    """Seconds since the epoch for a ``since`` bound: a number as it is, a datetime (naive means local) converted."""
    if moment is None or (isinstance(moment, int | float) and not isinstance(moment, bool)):
        return moment
    if not isinstance(moment, datetime):
        msg = f"since must be None, seconds since the epoch or a datetime, got {type(moment).__name__}"
        raise TypeError(msg)
    return moment.timestamp()


def cutoff(older_than: float | timedelta | None) -> float:
    """The ``updated`` time before which a finished run counts as older than ``older_than`` (seconds or a timedelta)."""
    if older_than is None:
        return math.inf
    if isinstance(older_than, bool) or not isinstance(older_than, int | float | timedelta):
        msg = f"older_than must be None, seconds or a timedelta, got {type(older_than).__name__}"
        raise TypeError(msg)
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
    if not seconds >= 0:
        msg = f"older_than must be >= 0 seconds, got {older_than!r}"
        raise ValueError(msg)
    return time.time() - seconds


def page(limit: int | None, offset: int) -> tuple[int, int]:
    """``LIMIT``/``OFFSET`` values for ``list_runs`` (-1 means no limit to SQLite; PostgreSQL gets ``NULL``)."""
    # Both databases take 64-bit integers: a larger page would be an OverflowError or a server error there.
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 2**63):
        msg = f"limit must be None or an integer from 0 to 2**63 - 1, got {limit!r}"
        raise ValueError(msg)
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2**63:
        msg = f"offset must be an integer from 0 to 2**63 - 1, got {offset!r}"
        raise ValueError(msg)
    return (-1 if limit is None else limit), offset
