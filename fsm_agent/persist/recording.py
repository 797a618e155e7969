"""Recordings: a stored run as one self-contained, versioned JSON document, to replay in tests.

A recording holds, for each model call, the request the agent made (the
messages sent, the tool schemas, the output schema) with a canonical hash,
and the reply; each tool call with its arguments and result (and, for
runs stored since it was kept, ``held``: whether it waited for a person's
decision, an optional field of version 1); the run's trace, steps, limits
and outcome (``unfinished``, optional too: the call its last stop cut off,
which a replay cuts again); what the run spent in all as its counters
say (``spent``, optional too: a fork counts a cut sub-agent call's whole
run from it, ``drivers.fork_spend``); and the runs of its sub-agents,
nested under the id of the call they answered.  It is built from what the store
keeps (the snapshot's ``io``, see ``fsm_agent.core.exchanges``), so a run
stored before calls were kept has no requests to export.  It holds what the
store holds and nothing of the store itself (no address, so no password).

Reading one back (its format, its versions, its shape checked) is
``persist.recording_format``; its names are handed out here too.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fsm_agent.core import child_ids
from fsm_agent.jsontext import dumps as json_text
from fsm_agent.persist.recording_format import (
    MIGRATIONS,
    RECORDING_FORMAT,
    RECORDING_VERSION,
    SPENT,
    RecordingError,
    check_recording,
    read_recording,
)

if TYPE_CHECKING:
    from fsm_agent.persist.store import AsyncStore, Store

__all__ = [
    "MIGRATIONS",
    "RECORDING_FORMAT",
    "RECORDING_VERSION",
    "RecordingError",
    "aexport",
    "canonical",
    "check_recording",
    "export",
    "read_recording",
    "recording_of",
    "request_hash",
]


def canonical(request: dict[str, Any]) -> str:
    """A request as canonical JSON text: sorted keys, no spaces, so equal requests are equal texts."""
    return json_text(request, sort_keys=True, separators=(",", ":"))


def request_hash(request: dict[str, Any]) -> str:
    """The ``sha256:`` digest of a request's canonical text."""
    digest = hashlib.sha256(canonical(request).encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256:{digest}"


def recording_of(data: dict[str, Any], children: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The recording of a run from its snapshot, with ``children`` (recordings of its sub-agents by call id)."""
    messages: list[dict[str, Any]] = data["messages"]
    arguments = {c["id"]: c["arguments"] for m in messages for c in m.get("tool_calls") or ()}
    model_calls, tool_calls = [], []
    tools: list[Any] = []
    output: Any = None
    for item in data.get("io") or ():
        if "result" in item:
            call_id = item["id"]
            kept = {"id": call_id, "name": item["name"], "arguments": arguments.get(call_id), "result": item["result"]}
            if isinstance(item.get("held"), bool):  # whether it waited for a person: kept for runs since it was
                kept["held"] = item["held"]
            if item.get("cut") is not None:  # what cuts of a sub-agent call counted before this outcome answered it
                kept["cut"] = item["cut"]
            tool_calls.append(kept)
            continue
        if item["offered"]:
            tools, output = item["tools"], item["output"]
        sent = item["messages"]
        request = {"messages": messages[:sent] if isinstance(sent, int) else sent, "tools": tools, "output": output}
        model_calls.append(
            {
                "turn": item["turn"],
                "request": request,
                "hash": request_hash(request),
                "reply": item["reply"],
                "error": item["error"],
            }
        )
    kept = {
        "format": RECORDING_FORMAT,
        "version": RECORDING_VERSION,
        "run_id": data.get("run_id"),
        "state": data["state"],
        "reason": data.get("reason"),
        "final": data.get("final", ""),
        "prior": data.get("prior", 0),
        "limits": data["limits"],
        "earlier_limits": data.get("earlier_limits") or [],  # the limits before each resume edge
        "messages": messages,
        "steps": data["steps"],
        "trace": data["trace"],
        "model_calls": model_calls,
        "tool_calls": tool_calls,
        "children": children,
        # A fork's outcomes of its source's calls it had not taken yet, kept so that a fork of it takes them too.
        "carried": data.get("carried") or [],
        "carried_down": data.get("carried_down") or [],
    }
    if "cut_shares" in data:  # each cut's share of a sub-agent call, where it was counted: met again there
        kept["cut_shares"] = data["cut_shares"]
        kept["cuts_taken_back"] = data.get("cuts_taken_back") or []  # and where a fork took them back
    if data.get("unfinished") is not None:  # the call its last stop cut off (a cancel, a deadline): a replay cuts it
        kept["unfinished"] = data["unfinished"]
    blocked = (data.get("evidence") or {}).get("blocked_by")
    if isinstance(blocked, str):  # what forbade the retry its last stop's answer was owed: a replay meets it again
        kept["blocked_by"] = blocked
    if data.get("forked_from") is not None:  # a fork's source run and the transition it was taken after
        kept["forked_from"] = data["forked_from"]
    spent = spent_of(data.get("counters"))
    if spent is not None:  # what the run spent in all, as its counters say: a fork of its parent counts it whole
        kept["spent"] = spent
    return kept


def spent_of(counters: Any) -> dict[str, Any] | None:
    """What a run spent as its snapshot's ``counters`` say (``SPENT``), its cost None if a call was unpriced.

    The counts a snapshot from before they were kept has none of are left
    out; None where there are no counters (a ``RunResult``'s recording).
    """
    if not isinstance(counters, dict):
        return None
    spent = {name: counters[name] for name in SPENT if name in counters}
    if spent.get("unpriced"):
        spent["cost"] = None
    return spent


def _child_ids(data: dict[str, Any]) -> dict[str, str]:
    """The sub-agent runs a stored run's tool calls were, by call id."""
    found = {}
    for item in data.get("io") or ():
        child = item.get("result", {}).get("child") if "result" in item else None
        if child:
            found[item["id"]] = child["run_id"]
    return found


def _unfinished_calls(run_id: str, data: dict[str, Any]) -> dict[str, tuple[tuple[str, ...], Callable[[Any], bool]]]:
    """For each sub-agent call without a result, by call id: the ids its stored run may have, and its test.

    A run cut while a sub-agent was running holds no result of that call,
    but the sub-agent's run is stored (``core.child_ids``: under
    ``<run id>/<call id>``, or where that held another run, an id its input,
    then its parent's start, names), linked to the call and begun by this
    start of the run; only a call with a text ``input`` can be one.
    """
    done = {item["id"] for item in data.get("io") or () if "result" in item}
    given = data.get("start_id")
    start = given if isinstance(given, str) else ""
    found: dict[str, tuple[tuple[str, ...], Callable[[Any], bool]]] = {}
    for message in data["messages"]:
        for call in message.get("tool_calls") or ():
            text = (call.get("arguments") or {}).get("input") if isinstance(call.get("arguments"), dict) else None
            if call["id"] not in done and isinstance(text, str):
                ids = child_ids.child_ids(run_id, start, call["id"], text)
                found[call["id"]] = (ids, functools.partial(_answers, run_id, start, call["id"], text))
    return found


def _answers(run_id: str, start: str, call_id: str, text: str, child: Any) -> bool:
    """Whether the stored run ``child`` is the sub-agent run of this call in this start of the run ``run_id``."""
    return isinstance(child, dict) and child_ids.is_child(child, run_id, start, call_id, text)


def _unfinished_children(store: Store, run_id: str, data: dict[str, Any]) -> dict[str, str]:
    """The stored sub-agent runs of the calls of ``run_id`` that hold no result (the run was cut), by call id."""
    found = {}
    for call_id, (names, answers) in _unfinished_calls(run_id, data).items():
        for name in names:
            try:
                child = store.load(name)
            except KeyError:
                continue
            if answers(child):
                found[call_id] = name
                break
    return found


async def _aunfinished_children(
    read: Callable[[str], Awaitable[dict[str, Any]]], run_id: str, data: dict[str, Any]
) -> dict[str, str]:
    """``_unfinished_children``, each run read with ``read``."""
    found = {}
    for call_id, (names, answers) in _unfinished_calls(run_id, data).items():
        for name in names:
            try:
                child = await read(name)
            except KeyError:
                continue
            if answers(child):
                found[call_id] = name
                break
    return found


def export(store: Store, run_id: str) -> dict[str, Any]:
    """The recording of the run ``run_id`` in ``store``, its sub-agents' runs nested (``KeyError`` if absent).

    A sub-agent run of a call the run holds no result of (the run was cut
    while it ran) is nested too, under the call's id.
    """
    data = store.load(run_id)
    ids = {**_unfinished_children(store, run_id, data), **_child_ids(data)}
    children = {call_id: export(store, child) for call_id, child in ids.items()}
    return recording_of({"run_id": run_id, **data}, children)


async def aexport(
    store: AsyncStore, run_id: str, *, load: Callable[[str], Awaitable[dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """``export`` on an async store: each run read with ``load`` (default: the store's ``aload``).

    A store whose ``aload`` twin is optional passes the driver's read here
    (``drivers.stored.awaited``: the twin if it has one, else ``load`` in a
    worker thread).
    """
    read = store.aload if load is None else load
    data = await read(run_id)
    ids = {**await _aunfinished_children(read, run_id, data), **_child_ids(data)}
    children = {call_id: await aexport(store, child, load=read) for call_id, child in ids.items()}
    return recording_of({"run_id": run_id, **data}, children)
