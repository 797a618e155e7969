"""A run's page as the viewer sends it: the run's digest, and where each of its sub-agent runs stands in the store.

Two halves, because they change apart: the digest (``replay.digest``) is a
function of the run's own stored record alone, while the children's
standing is read from the store's listing of the run's sub-agent runs
(``list_runs(parent=...)``, one read however many there are), which moves
while the parent's record stays put (a child taking steps during one call of
its parent, a paused child resumed under a paused parent).  The live stream (``live.py``) builds
the digest again only when the run's record changed and reads the children
at every poll; ``with_children`` leaves the digest it is given unchanged, so
one digest serves every poll until the record moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from fsm_agent import TABLE, SnapshotError, Table
from fsm_agent.core import child_ids
from fsm_agent.persist.summary import StoredRun
from fsm_agent.ui.replay import digest


class Loads(Protocol):
    """What a page needs of a store: a run's latest snapshot, and a run's sub-agent runs (``FullStore`` has both)."""

    def load(self, run_id: str) -> dict[str, Any]:
        """The run's latest snapshot; ``KeyError`` if there is none."""
        ...

    def list_runs(self, *, parent: str | None = None) -> Sequence[StoredRun]:
        """The stored runs whose snapshot names ``parent`` their parent run (``StoredRun.parent``)."""
        ...


def run_view(store: Loads, run_id: str, data: dict[str, Any], table: Table = TABLE) -> dict[str, Any]:
    """The run's digest, and where each of its sub-agent runs stands in the store (one listing, this page only)."""
    return with_children(store, run_id, data, digest(run_id, data, table), table)


def with_children(
    store: Loads, run_id: str, data: dict[str, Any], page: dict[str, Any], table: Table = TABLE
) -> dict[str, Any]:
    """``page`` (the run's digest, left as it is) with where each sub-agent run stands, read from the store now.

    One read: the store lists the run's sub-agent runs (``list_runs(parent=run_id)``), with the state, reason
    and paused flag each stands at, whatever their number.  A sub-agent call in flight has no step naming its
    run yet: for each call the run has not finished, its child in this start of the run is taken if it is
    listed (``_in_flight_child``).  A child a step names that is not listed (deleted, a fork's source's, or
    stored by a worker of a version before the listing) is loaded, as before; one the store does not have is listed with
    ``stored`` false and no state.  A child whose snapshot is corrupted is shown as the listing has it (its
    last write's state): only its own page reads its snapshot, and says so.
    """
    listed = _children_of(store, run_id)
    children = [{**child, **_standing(_known(store, listed, child["run_id"]), table)} for child in page["children"]]
    shown = {child["run_id"] for child in children}
    found: dict[str, str] = {}  # call id -> the in-flight child run found for it
    for call in data.get("pending") or ():
        candidate = _in_flight_child(run_id, data, call, listed)
        if candidate is None or candidate in shown:
            continue
        call_id = call["id"]
        child = listed[candidate]
        children.append({"run_id": candidate, "call_id": call_id, "tool": call.get("name"), **_standing(child, table)})
        shown.add(candidate)
        found[call_id] = candidate
    moments = page["moments"]
    if found:
        moments = [_linked(moment, found) for moment in moments]
    return {**page, "children": children, "moments": moments}


Standing = dict[str, Any] | StoredRun | SnapshotError | None
"""What a page knows of a sub-agent run: its snapshot or its listing, the error saying it is corrupted, or none."""


def _children_of(store: Loads, run_id: str) -> dict[str, StoredRun]:
    """The run's sub-agent runs as the store lists them, by run id."""
    return {run.run_id: run for run in store.list_runs(parent=run_id)}


def _known(store: Loads, listed: dict[str, StoredRun], child: str) -> Standing:
    """The child as listed, or else loaded (a child the listing does not have: deleted, or not this run's)."""
    found = listed.get(child)
    return found if found is not None else _load(store, child)


def _in_flight_child(run_id: str, data: dict[str, Any], call: object, listed: dict[str, StoredRun]) -> str | None:
    """The listed run that is the child of the pending ``call`` in this start of the run, if any (``core.child_ids``).

    The listing says which call a run was made for and, from a store that
    lists it, in which start of the parent (a parent started again over its
    id leaves its old run's children listed under it); within one start a
    call id names one call, so no snapshot is read.  A store that lists no
    start is taken at the call's word, as before.
    """
    arguments = call.get("arguments") if isinstance(call, dict) else None
    text = arguments.get("input") if isinstance(arguments, dict) else None
    call_id = call.get("id") if isinstance(call, dict) else None
    given = data.get("start_id")
    start = given if isinstance(given, str) else ""
    if not (isinstance(call_id, str) and isinstance(text, str)):
        return None
    for candidate in child_ids.child_ids(run_id, start, call_id, text):
        child = listed.get(candidate)
        if child is None or child.parent != (run_id, call_id):
            continue
        if child.start_id is None or child.start_id == child_ids.child_start(start, call_id):
            return candidate
    return None


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


def _standing(data: Standing, table: Table) -> dict[str, Any]:
    """Where a sub-agent run stands, as its parent's page shows it next to the link (no state if it is unreadable)."""
    if isinstance(data, StoredRun):
        data = {"state": data.state, "reason": data.reason, "paused": data.paused}
    if not isinstance(data, dict) or str(data.get("state")) not in {str(state) for state in table.states}:
        return {"stored": data is not None, "state": None, "reason": None, "paused": False}
    return {
        "stored": True,
        "state": str(data.get("state")),
        "reason": data.get("reason"),
        "paused": bool(data.get("paused")),
    }
