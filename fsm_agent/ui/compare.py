"""Two stored runs side by side: their edges and messages, and where they first differ, as plain JSON.

The compare page shows a fork beside its source (or any two runs) in two
columns.  An edge is compared by what it did (source, trigger, destination,
guard, stop reason), a message by everything it holds; the first index where
the two lists part (or one of them ends) is marked on both sides.  Nothing
here reads a store: the app hands in the two runs' digests (``replay.digest``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EDGE = ("source", "trigger", "dest", "guard", "reason")
"""What makes two transitions the same: the edge taken, not when or what it brought."""


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first index where ``a`` and ``b`` differ, or where the shorter one ends; None if they are equal."""
    for index, (left, right) in enumerate(zip(a, b, strict=False)):
        if left != right:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def side(page: dict[str, Any]) -> dict[str, Any]:
    """What one column shows of a run's digest: its outcome, its edges and its messages."""
    return {
        "run_id": page["run_id"],
        "state": page["state"],
        "reason": page["reason"],
        "final": page["final"],
        "forked_from": page.get("forked_from"),
        "edges": [
            {"index": m["index"], **{k: m[k] for k in EDGE}, "label": m["label"], "messages": m["messages"]}
            for m in page["moments"]
        ],
        "messages": page["messages"],
    }


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two digests as the compare page shows them, with the first edge and the first message where they differ."""
    left, right = side(a), side(b)
    return {
        "a": left,
        "b": right,
        "first_edge": first_difference(
            [tuple(e[k] for k in EDGE) for e in left["edges"]], [tuple(e[k] for k in EDGE) for e in right["edges"]]
        ),
        "first_message": first_difference(left["messages"], right["messages"]),
    }
