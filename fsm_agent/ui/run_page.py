"""A run's page as the viewer sends it: the run's digest, and where each of its sub-agent runs stands in the store.

Two halves, because they change apart: the digest (``replay.digest``) is a
function of the run's own stored record alone, while the children's
standing is read from each child's record, which moves while the parent's
stays put (a child taking steps during one call of its parent, a paused
child resumed under a paused parent).  The live stream (``live.py``) builds
the digest again only when the run's record changed and reads the children
at every poll; ``with_children`` leaves the digest it is given unchanged, so
one digest serves every poll until the record moves.
"""

from __future__ import annotations

from typing import Any, Protocol

from fsm_agent import TABLE, SnapshotError, Table
from fsm_agent.ui.replay import digest


class Loads(Protocol):
    """What a page needs of a store: a run's latest snapshot (``KeyError`` if there is none)."""

    def load(self, run_id: str) -> dict[str, Any]:
        """The run's latest snapshot; ``KeyError`` if there is none."""
        ...


def run_view(store: Loads, run_id: str, data: dict[str, Any], table: Table = TABLE) -> dict[str, Any]:
    """The run's digest, and where each of its sub-agent runs stands in the store (one load each, this page only)."""
    return with_children(store, run_id, data, digest(run_id, data, table), table)


def with_children(
    store: Loads, run_id: str, data: dict[str, Any], page: dict[str, Any], table: Table = TABLE
) -> dict[str, Any]:
    """``page`` (the run's digest, left as it is) with where each sub-agent run stands, read from the store now.

    A sub-agent call in flight has no step naming its run yet: for each call
    the run has not finished, the run ``<run id>/<call id>`` is looked for,
    and taken only if its snapshot names this run its parent.  A child the
    store does not have (deleted, or a store that was not given to the
    parent) is listed with ``stored`` false and no state.
    """
    children = [{**child, **_standing(_load(store, child["run_id"]), table)} for child in page["children"]]
    listed = {child["run_id"] for child in children}
    found: dict[str, str] = {}  # call id -> the in-flight child run found for it
    for call in data.get("pending") or ():
        call_id = call.get("id") if isinstance(call, dict) else None
        candidate = f"{run_id}/{call_id}"
        if not isinstance(call_id, str) or candidate in listed:
            continue
        child = _load(store, candidate)
        if not isinstance(child, dict) or (child.get("parent_run_id"), child.get("parent_call_id", call_id)) != (
            run_id,
            call_id,
        ):
            continue
        children.append({"run_id": candidate, "call_id": call_id, "tool": call.get("name"), **_standing(child, table)})
        listed.add(candidate)
        found[call_id] = candidate
    moments = page["moments"]
    if found:
        moments = [_linked(moment, found) for moment in moments]
    return {**page, "children": children, "moments": moments}


def _linked(moment: dict[str, Any], found: dict[str, str]) -> dict[str, Any]:
    """The moment, naming the in-flight child run of its call if it names none yet (a copy; the digest's is kept)."""
    call_id = (moment["call"] or {}).get("id")
    if moment["child"] is None and call_id in found:
        return {**moment, "child": found[call_id]}
    return moment


def _load(store: Loads, run_id: str) -> dict[str, Any] | SnapshotError | None:
    """A run's snapshot, the error saying it is corrupted, or None if the store has no such run."""
    try:
        return dict(store.load(run_id))
    except KeyError:
        return None
    except SnapshotError as exc:
        return exc


def _standing(data: dict[str, Any] | SnapshotError | None, table: Table) -> dict[str, Any]:
    """Where a sub-agent run stands, as its parent's page shows it next to the link (no state if it is unreadable)."""
    if not isinstance(data, dict) or str(data.get("state")) not in {str(state) for state in table.states}:
        return {"stored": data is not None, "state": None, "reason": None, "paused": False}
    return {
        "stored": True,
        "state": str(data.get("state")),
        "reason": data.get("reason"),
        "paused": bool(data.get("paused")),
    }
