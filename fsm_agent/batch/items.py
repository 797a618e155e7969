"""A batch's inputs as items: each one's position, question and run id, checked before any run starts.

The run id is what makes a batch resumable: the same input at the same
position gets the same id every time, so a second pass over a batch finds
every run it already started in the store and continues it instead of
starting over.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from fsm_agent.persist.checks import check_run_id


@attrs.frozen
class BatchItem:
    """One run of a batch: where it sits in the input, what it asks, and its id in the store."""

    index: int
    input: str
    run_id: str


def derive_run_id(index: int, user_input: str) -> str:
    """The id of the run at ``index`` asking ``user_input``: stable across processes and Python versions.

    Position and content both go in, so the same question asked twice in one
    batch is two runs, and an edited question is a new run rather than the
    continuation of a different conversation.
    """
    # surrogatepass: an input holding half an emoji (as a provider's text may) still has an id.
    digest = hashlib.sha256(f"{index}\0{user_input}".encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"batch-{index}-{digest}"


def batch_items(inputs: Iterable[str | Mapping[str, Any]]) -> list[BatchItem]:
    """Check every input and give it a run id; a bad entry or a duplicate id is a ``ValueError`` naming it.

    Done up front, before the first run starts, so a typo in line 9,000 of an
    input file is not found after hours of work.
    """
    if isinstance(inputs, str | bytes | Mapping):
        msg = f"inputs must be an iterable of inputs, got a single {type(inputs).__name__}; wrap it in a list"
        raise TypeError(msg)
    items: list[BatchItem] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(inputs):
        item = _item(index, entry)
        if item.run_id in seen:
            msg = f"inputs {seen[item.run_id]} and {index} share run_id {item.run_id!r}; each run needs its own"
            raise ValueError(msg)
        seen[item.run_id] = index
        items.append(item)
    return items


def _item(index: int, entry: str | Mapping[str, Any]) -> BatchItem:
    if isinstance(entry, str):
        return BatchItem(index, entry, derive_run_id(index, entry))
    if not isinstance(entry, Mapping):
        msg = f'input {index} must be a str or a dict {{"input": ..., "run_id": ...}}, got {type(entry).__name__}'
        raise TypeError(msg)
    unknown = sorted(set(entry) - {"input", "run_id"})
    if unknown:
        msg = f"input {index} has unknown keys {unknown}; only 'input' and 'run_id' are read"
        raise ValueError(msg)
    text = entry.get("input")
    if not isinstance(text, str):
        msg = f"input {index} needs an 'input' that is a str, got {type(text).__name__}"
        raise TypeError(msg)
    run_id = entry.get("run_id")
    if run_id is None:
        return BatchItem(index, text, derive_run_id(index, text))
    if not isinstance(run_id, str) or not run_id:
        msg = f"input {index} has run_id {run_id!r}; it must be a non-empty str"
        raise ValueError(msg)
    try:
        check_run_id(run_id)  # what every store checks as it writes: here before any run starts, not as this one does
    except ValueError as exc:
        msg = f"input {index}: {exc}"
        raise ValueError(msg) from None
    return BatchItem(index, text, run_id)
