"""What a checkpoint store is: the ``Store`` protocol, the records it lists, and what every store shares.

A store keeps, per run, a base snapshot (written whole at a compaction
point: a run's start or takeover, or ``save``) and a journal of what each
checkpoint after it added, so a checkpoint costs the same at turn 4,000 as at
turn 10.  A run being advanced is leased by one owner; every journal write is
conditional on still holding that lease, so two owners can never interleave
their entries.  The lease (``DEFAULT_LEASE``, 12 s) is renewed while the
owner lives, even during a long call, so a dead owner's run is free again
within one lease.  ``SqliteStore`` and ``PostgresStore`` implement it all; a store
with only ``wants``/``save``/``load`` still works, saving whole snapshots
without leases.
"""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from datetime import datetime, timedelta
from typing import Any, Protocol

import attrs

from fsm_agent.core.snapshot import SnapshotError
from fsm_agent.definition.states import TERMINAL, State
from fsm_agent.errors import FsmAgentError

DEFAULT_LEASE = 12.0
"""Seconds a run's lease lasts unless renewed, so a run whose owner died is free again within this time.

The driver renews it at every checkpoint, before a call once a third of it is gone, and, while a model or tool call
is in flight, from a heartbeat every third of a lease: the lease follows the owner, not the slowest call, and need
only outlast a stall of the owning process (or of its database) of two thirds of a lease.  A renewal is fenced (the
run is still this owner's at the version it last wrote), so an owner that lost its run is refused at its next
write, before its next call, and never overwrites the new owner's work."""

FINISHED = tuple(str(state) for state in sorted(TERMINAL))
"""The terminal states' names, as stored."""


class StoreError(FsmAgentError, RuntimeError):
    """A store location that cannot be used as one: not a database, unreadable, or another program's tables.

    ``where`` names the location (a URL without its password), ``reason`` says what the database said.
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(where, reason)
        self.where = where
        # One line: a message shown on a terminal must not spread over several.
        self.reason = "; ".join(line.strip() for line in reason.strip().splitlines())

    def __str__(self) -> str:
        return f"{self.where} cannot be used as a run store: {self.reason}"


@attrs.frozen
class StoredRun:
    """One run as a store lists it: where it stands, why it stopped, how far it got, when it was last saved."""

    run_id: str
    state: str
    reason: str | None
    paused: bool
    updated: float
    steps: int = 0
    tokens: int = 0
    session: str | None = None

    @property
    def tool_calls(self) -> int:
        """The tool calls the run made: its ``Step`` records (``steps``) are one per call, plus a finished run's answer.

        What a listing shows: "steps" as a count means model turns (what
        ``max_steps`` counts), which a listing does not keep.
        """
        return max(self.steps - (self.state == "Done"), 0)


@attrs.frozen
class Summary:
    """The columns a store keeps beside a run's snapshot so that listing runs never reads a snapshot."""

    state: str
    reason: str | None
    paused: bool
    steps: int
    tokens: int
    session: str | None = None

    @classmethod
    def of(cls, snapshot: dict[str, Any]) -> Summary:
        """The summary of a whole snapshot."""
        counters = snapshot.get("counters") or {}
        tokens = int(counters.get("input_tokens", 0)) + int(counters.get("output_tokens", 0))
        paused = bool(snapshot.get("paused"))
        session = snapshot.get("session_id")
        steps = len(snapshot["steps"])
        return cls(snapshot["state"], snapshot.get("reason"), paused, steps, tokens, session_id(session))


def stored_version(snapshot: dict[str, Any]) -> int | None:
    """The stored version a snapshot was read at (``stored_seq``), None if none; ``SnapshotError`` if malformed."""
    version = snapshot.get(VERSION_KEY)
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        msg = f"snapshot field {VERSION_KEY} must be the integer version the run was loaded at, got {version!r}"
        raise SnapshotError(msg)
    return version


def session_id(value: object) -> str | None:
    """A snapshot's ``session_id`` as a store keeps it: text, or None for a run that is no conversation's turn."""
    return value if isinstance(value, str) and value else None


@attrs.frozen
class Entry:
    """One journal entry of a run: its JSON text (see ``journal.apply``) and the run's summary after it.

    ``release`` gives the lease up with the write: the run finished or paused.
    """

    run_id: str
    seq: int
    text: str
    summary: Summary
    release: bool = False


class Store(Protocol):
    """What the engine needs of a checkpoint store (the ownership methods and async twins are optional)."""

    def wants(self, state: State, paused: bool) -> bool:
        """Whether a checkpoint should be written now that the run is in ``state``."""
        ...

    def save(self, run_id: str, snapshot: dict[str, Any]) -> int | None:
        """Replace the stored run with this whole snapshot (a compaction point); its new version, if it keeps one."""
        ...

    def load(self, run_id: str) -> dict[str, Any]:
        """The run's latest snapshot; ``KeyError`` naming the id if there is none."""
        ...


VERSION_KEY = "stored_seq"
"""The key a loaded snapshot carries its stored version under; a write built on it names that version."""


def new_owner() -> str:
    """A fresh owner id naming this host and process, so a ``RunLeasedError`` tells a person where to look."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


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


EVERY = ("transition", "call", "turn")
"""When a store's runs are written (``every=``), from the most writes to the fewest.

``"call"`` (the default): one write per I/O boundary.  As each model or tool
call returns, the transition recording its outcome is written together with
the transitions taken since the last write, in one transaction fenced like
every write; so are the end and a pause.  A run of M model calls and T tool
calls costs at most M + T + 2 store transactions (its creation, one per call,
its end) instead of one per transition.  Exactly-once is as with
``"transition"``: a call's outcome (each result of a parallel batch too) is
durable as soon as the call returns, and a process killed anywhere resumes
from the last write, running again only the call that was in flight; the
transitions between a call's outcome and the next call are pure and are
simply taken again.  What differs: between two calls the stored run lags the
run object, and observers hear of those transitions before they are stored,
so a viewer following a run live sees it move at its calls.

``"transition"``: one write per transition, so the stored run is the run
object at every transition (what a viewer following a run live shows at
every step, and what earlier releases did by default).

``"turn"``: before each model call, at the end and when paused; a tool call's
outcome may be written only after later tool calls of its turn ran, so a crash
in between runs them again."""


def check_every(every: str) -> str:
    """``"transition"``, ``"call"`` or ``"turn"`` (see ``EVERY``)."""
    if every not in EVERY:
        msg = f"every must be 'transition', 'call' or 'turn', got {every!r}"
        raise ValueError(msg)
    return every


def wants(every: str, state: State, paused: bool) -> bool:
    """Whether the transition into ``state`` is written as it is taken (see ``EVERY``).

    Every transition; or (``every="call"``) at the end and when paused, the
    driver writing the others with the outcome of the next call (``Journal.save``);
    or (``every="turn"``) before a model call, at the end and when paused.
    """
    if every == "transition" or paused or state in TERMINAL:
        return True
    return every == "turn" and state is State.AwaitModel


def epoch(moment: float | datetime | None) -> float | None:
    """Seconds since the epoch for a ``since`` bound: a number as it is, a datetime (naive means local) converted."""
    if moment is None or isinstance(moment, int | float):
        return moment
    return moment.timestamp()


def cutoff(older_than: float | timedelta | None) -> float:
    """The ``updated`` time before which a finished run counts as older than ``older_than`` (seconds or a timedelta)."""
    if older_than is None:
        return math.inf
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


def __getattr__(name: str) -> Any:
    # ``SqliteStore`` lived in this module before the stores got modules of their own; old imports keep working.
    if name == "SqliteStore":
        from fsm_agent.persist.sqlite import SqliteStore

        return SqliteStore
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
