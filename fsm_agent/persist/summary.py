"""What a store keeps beside each run's snapshot and lists: the summary columns, the journal entry, the listing row.

A store never reads a snapshot to list runs: each write carries the run's
``Summary`` (state, reason, steps, tokens and its links: conversation, fork
origin, parent call), read from the snapshot here, once, as every store keeps
it.  ``StoredRun`` is a run as a listing shows it; ``Entry`` one journal write.
"""

from __future__ import annotations

from typing import Any

import attrs

from fsm_agent.definition.states import TERMINAL
from fsm_agent.errors import SnapshotError

FINISHED = tuple(str(state) for state in sorted(TERMINAL))
"""The terminal states' names, as stored."""


VERSION_KEY = "stored_seq"
"""The key a loaded snapshot carries its stored version under; a write built on it names that version."""


@attrs.frozen
class StoredRun:
    """One run as a store lists it: where it stands, why it stopped, how far it got, its last save, its fork origin.

    ``created`` is when the store first held the run, kept as it was however
    often the run is saved again: ``list_runs(order="created")`` lists by it, and
    a page's cursor (``RunCursor.of``) is made of it.  None from a store that
    does not record it (such a store cannot page by cursor).  ``parent`` is a
    sub-agent run's link, ``(parent run id, parent call id)``, which
    ``list_runs(parent=...)`` lists by; None for a run that is no tool call's.
    ``start_id`` is the run's start (None where the store does not list it):
    which of a parent's listed runs is the child of its call in its own start
    (``core.child_ids``) is told by it without reading a snapshot.
    """

    run_id: str
    state: str
    reason: str | None
    paused: bool
    updated: float
    steps: int = 0
    tokens: int = 0
    session: str | None = None
    forked_from: tuple[str, int] | None = None
    created: float | None = None
    parent: tuple[str, str] | None = None
    start_id: str | None = attrs.field(default=None, eq=False)

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
    forked_from: tuple[str, int] | None = None
    parent: tuple[str, str] | None = None
    start: str | None = None
    """The run's ``start_id``: which start of a run id a version is a version of (one deleted and started again)."""

    @classmethod
    def of(cls, snapshot: dict[str, Any]) -> Summary:
        """The summary of a whole snapshot."""
        counters = snapshot.get("counters") or {}
        tokens = int(counters.get("input_tokens", 0)) + int(counters.get("output_tokens", 0))
        paused = bool(snapshot.get("paused"))
        session = snapshot.get("session_id")
        steps = len(snapshot["steps"])
        origin, link = fork_origin(snapshot.get("forked_from")), parent_link(snapshot)
        start = session_id(snapshot.get("start_id"))  # text or None, as a session id is kept
        return cls(
            snapshot["state"], snapshot.get("reason"), paused, steps, tokens, session_id(session), origin, link, start
        )


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


def fork_origin(value: object) -> tuple[str, int] | None:
    """A snapshot's ``forked_from``, ``[source run id, transition]``, as a store keeps it; None for anything else."""
    match value:
        case [str(source), int(at)] if source and not isinstance(at, bool) and at >= 0:
            return source, at
    return None


def parent_link(snapshot: dict[str, Any]) -> tuple[str, str] | None:
    """A sub-agent run's ``(parent_run_id, parent_call_id)``, both non-empty text, as a store keeps it; else None.

    Written when the run is created and never changed, so a store may read it
    from the run's base snapshot.
    """
    match snapshot.get("parent_run_id"), snapshot.get("parent_call_id"):
        case str(run), str(call) if run and call:
            return run, call
    return None


@attrs.frozen
class Entry:
    """One journal entry of a run: its JSON text (see ``readback.apply``) and the run's summary after it.

    ``release`` gives the lease up with the write: the run finished or paused.
    """

    run_id: str
    seq: int
    text: str
    summary: Summary
    release: bool = False
