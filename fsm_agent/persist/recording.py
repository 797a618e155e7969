"""Recordings: a stored run as one self-contained, versioned JSON document, to replay in tests.

A recording holds, for each model call, the request the agent made (the
messages sent, the tool schemas, the output schema) with a canonical hash,
and the reply; each tool call with its arguments and result; the run's
trace, steps, limits and outcome; and the runs of its sub-agents, nested
under the id of the call they answered.  It is built from what the store
keeps (the snapshot's ``io``, see ``fsm_agent.core.exchanges``), so a run
stored before calls were kept has no requests to export.  It holds what the
store holds and nothing of the store itself (no address, so no password).

Readers accept every earlier version: ``MIGRATIONS`` brings each up to date.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsm_agent.errors import FsmAgentError
from fsm_agent.jsontext import dumps as json_text
from fsm_agent.jsontext import versioned

if TYPE_CHECKING:
    from fsm_agent.persist.store import AsyncStore, Store

RECORDING_FORMAT = "fsm_agent.Recording"
RECORDING_VERSION = 1


class RecordingError(FsmAgentError, ValueError):
    """A recording that cannot be read: not JSON, another format, a version this release does not know, or malformed."""


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}
"""How each older version becomes the next one (version 1 is the first: none yet)."""


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
    return {
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
    }


def _child_ids(data: dict[str, Any]) -> dict[str, str]:
    """The sub-agent runs a stored run's tool calls were, by call id."""
    found = {}
    for item in data.get("io") or ():
        child = item.get("result", {}).get("child") if "result" in item else None
        if child:
            found[item["id"]] = child["run_id"]
    return found


def export(store: Store, run_id: str) -> dict[str, Any]:
    """The recording of the run ``run_id`` in ``store``, its sub-agents' runs nested (``KeyError`` if absent)."""
    data = store.load(run_id)
    children = {call_id: export(store, child) for call_id, child in _child_ids(data).items()}
    return recording_of({"run_id": run_id, **data}, children)


async def aexport(store: AsyncStore, run_id: str) -> dict[str, Any]:
    """``export`` on an async store."""
    data = await store.aload(run_id)
    children = {call_id: await aexport(store, child) for call_id, child in _child_ids(data).items()}
    return recording_of({"run_id": run_id, **data}, children)


def read_recording(source: dict[str, Any] | str | Path) -> dict[str, Any]:
    """A recording from its dict, its JSON text or a file's ``Path``, brought up to this version; ``RecordingError``."""
    if isinstance(source, Path):
        source = source.read_text(encoding="utf-8")
    source = versioned(source, "recording", (RECORDING_FORMAT, RECORDING_VERSION), MIGRATIONS, RecordingError)
    missing = [k for k in ("messages", "trace", "limits", "model_calls", "tool_calls", "prior") if k not in source]
    if missing:
        msg = f"recording lacks {', '.join(missing)}"
        raise RecordingError(msg)
    for name, child in (source.get("children") or {}).items():
        try:
            read_recording(child)
        except RecordingError as exc:
            msg = f"the recording of sub-agent call {name!r}: {exc}"
            raise RecordingError(msg) from exc
    return source
