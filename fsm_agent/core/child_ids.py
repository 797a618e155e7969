"""Where a sub-agent call's run is stored, and whether a stored run is that call's: one rule for every reader.

A sub-agent call's run is stored under ``<parent run id>/<call id>``,
linked to its call (the parent run, the call's id, its input's digest) and
begun by one start of the parent (its ``start_id`` made from the parent's).
Where that id holds another run (another call's, or an earlier start's of
a parent started again over its id), the child is stored under the id
with the input's digest, and where that too is taken, under one its
parent's start names.  The run driving the parent (``drivers.child_runs``),
a recording nesting a cut call's child (``persist.recording``) and the
viewer (``ui.run_page``) all find a call's child by these ids and this test.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from fsm_agent.jsontext import input_digest

LINK = ("parent_run_id", "parent_call_id", "input_digest")
"""What a sub-agent's stored run says of the call it answers: the parent run, the call's id, its input's digest."""


def child_start(parent_start: str, call_id: str) -> str:
    """The ``start_id`` of the child of call ``call_id`` in the parent's start ``parent_start`` (none: none).

    The same each time that start makes the call, so a resumed parent's
    child, begun again after a cut, keeps the keys its calls went out
    under; a new start of the parent (a fork, ``overwrite=True``) makes a new one.
    """
    return parent_start and uuid.uuid5(uuid.NAMESPACE_URL, f"{parent_start}/{call_id}").hex


def link(parent_run_id: str, call_id: str, text: str) -> dict[str, str]:
    """The ``LINK`` a call's child run keeps of its call."""
    return {"parent_run_id": parent_run_id, "parent_call_id": call_id, "input_digest": input_digest(text)}


def child_ids(parent_run_id: str, parent_start: str, call_id: str, text: str) -> tuple[str, ...]:
    """The ids the call's child may be stored under, in the order they are taken: its own, by input, by start."""
    named = f"{parent_run_id}/{call_id}"
    renamed = f"{named}@{input_digest(text)[:12]}"
    start = child_start(parent_start, call_id)
    return (named, renamed, f"{renamed}-{start[:12]}") if start else (named, renamed)


def is_child(data: Mapping[str, Any], parent_run_id: str, parent_start: str, call_id: str, text: str) -> bool:
    """Whether the stored run ``data`` is the child of this call in this start of its parent."""
    linked = {name: data.get(name) for name in LINK} == link(parent_run_id, call_id, text)
    return linked and (data.get("start_id") or "") == child_start(parent_start, call_id)
