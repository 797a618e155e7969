"""A stored run read back: its base snapshot with the journal entries after it applied, each checked first.

A store keeps a run as a base snapshot plus the entries written since
(``persist/plans.py``); reading it back is pure work on that text, apart
from any SQL: parse each part, refuse what a store never writes (a file
edited by hand, a tampered row, a deleted entry) with a ``SnapshotError``
naming the run and the part, and add the entries up.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NoReturn

from fsm_agent.core.snapshot import GROWING
from fsm_agent.errors import SnapshotError


def apply(snapshot: dict[str, Any], entry: dict[str, Any]) -> None:
    """Bring a snapshot up to date with one journal entry, in place: extend the growing lists, set the rest."""
    for name, items in entry.get("add", {}).items():
        snapshot[name].extend(items)
    snapshot.update(entry.get("set", {}))


def rebuild(
    base: str,
    entries: Iterable[tuple[int, str]],
    run_id: str = "",
    where: str = "",
    versions: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The snapshot a base and the journal entries ``(seq, text)`` after it add up to.

    A row that is not what a store writes (broken JSON, the wrong shapes: a
    file edited by hand, a tampered database) is a ``SnapshotError`` naming
    the run and the part at fault, never a stray ``KeyError`` or
    ``AttributeError`` from deep inside.  With ``versions``, the run's
    ``(base_seq, seq)``, the entries must be exactly ``base_seq + 1`` to
    ``seq``: a missing one (a deleted row) is a ``SnapshotError`` naming the
    first version missing, instead of a run quietly rebuilt without it.
    """
    snapshot = _parsed(base, "its base snapshot", run_id, where)
    snapshot.setdefault("io", [])  # stored before calls were kept (snapshot.GROWING)
    if bad := [name for name in GROWING if not isinstance(snapshot.get(name), list)]:
        _corrupted(run_id, where, "its base snapshot", f"{', '.join(bad)} must be lists")
    if versions is not None:
        entries = list(entries)
        _check_complete(entries, versions, run_id, where)
    for seq, text in entries:
        part = f"journal entry {seq}"
        entry = _parsed(text, part, run_id, where)
        added, changed = entry.get("add", {}), entry.get("set", {})
        if not isinstance(added, dict) or not isinstance(changed, dict):
            _corrupted(run_id, where, part, "'add' and 'set' must be objects")
        bad = sorted(str(name) for name, items in added.items() if name not in GROWING or not isinstance(items, list))
        if bad:
            _corrupted(run_id, where, part, f"'add' holds {', '.join(bad)}, not lists of {', '.join(GROWING)}")
        apply(snapshot, entry)
    return snapshot


def _check_complete(entries: list[tuple[int, str]], versions: tuple[int, int], run_id: str, where: str) -> None:
    """Refuse ``entries`` unless they are every version after the base's up to the run's, in order."""
    base_seq, seq = (int(v) for v in versions)
    expected = range(base_seq + 1, seq + 1)
    found = [int(number) for number, _ in entries]
    if found == list(expected):
        return
    present = set(found)
    missing = next((v for v in expected if v not in present), None)
    if missing is None:
        extra = next(v for v in found if v not in expected)
        _corrupted(run_id, where, f"journal entry {extra}", f"is past the run's version, {seq}")
    held = ", ".join(_spans(found)) or "none"
    why = f"its journal entry is missing (the run is at version {seq}, its base at {base_seq}; entries held: {held})"
    _corrupted(run_id, where, f"version {missing}", why)


def _spans(numbers: list[int]) -> list[str]:
    """Sorted ``numbers`` as runs: ``[2, 3, 4, 7]`` is ``["2-4", "7"]``."""
    spans: list[str] = []
    for number in numbers:
        if spans and int(spans[-1].rpartition("-")[2]) == number - 1:
            spans[-1] = f"{spans[-1].partition('-')[0]}-{number}"
        else:
            spans.append(str(number))
    return spans


def _parsed(text: object, part: str, run_id: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)  # type: ignore[arg-type]  # a tampered column may hold anything
    except (TypeError, ValueError) as exc:
        _corrupted(run_id, where, part, f"not JSON text ({exc})")
    if not isinstance(data, dict):
        _corrupted(run_id, where, part, f"a JSON {type(data).__name__}, not an object")
    return data


def _corrupted(run_id: str, where: str, part: str, why: str) -> NoReturn:
    msg = f"stored run {run_id!r} in {where} is corrupted: {part}: {why}"
    raise SnapshotError(msg)
