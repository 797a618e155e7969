"""A fork's source as a recording: a stored run's export, a snapshot, a recording, or a finished run's messages.

``Agent.fork`` takes its source in any of these forms (``ForkSource``);
``drivers.rebuild`` rebuilds it from the one form they all become here, a
recording (``persist.recording``).  A ``RunResult`` of a run that ended in
``Done`` keeps no snapshot, so its recording is read from its messages.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Literal

from fsm_agent.core import snapshot
from fsm_agent.core.approval import rejection_in
from fsm_agent.drivers.stored import awaited
from fsm_agent.errors import ForkError
from fsm_agent.records import RunResult, plain

if TYPE_CHECKING:
    from fsm_agent.persist.store import AsyncStore, Store

ForkSource = RunResult | dict[str, Any] | str
"""What a fork is taken from: a ``RunResult``, a snapshot or recording (dict or JSON text), or a stored run's id."""
Rerun = Collection[str] | Literal["all"] | None
"""The source's call ids a fork makes again although the source completed them (``"all"``: every one)."""


def recording_of_source(source: ForkSource, store: Store | None) -> dict[str, Any]:
    """The source as a recording (a stored run's id is exported from ``store``).

    A text is a stored run's id or the JSON text of a snapshot or recording;
    which one, is decided in this order: with ``store`` given, a text that is
    the id of a run the store holds is that run (any id a store takes, ``{``
    first too); else a text that is a JSON object is a snapshot or recording;
    else it is a stored run's id (a ``KeyError`` if ``store`` lacks it, a
    ``ForkError`` without ``store``).
    """
    from fsm_agent.persist.recording import export

    if isinstance(source, str):
        data = _json_object(source)
        if data is None or (store is not None and _holds(store, source)):
            return export(_store_of(source, store), source)
        source = data
    return _recording_of_data(source)


async def arecording_of_source(source: ForkSource, store: AsyncStore | None) -> dict[str, Any]:
    """``recording_of_source``, a stored run read with the store's async methods."""
    from fsm_agent.persist.recording import aexport

    if isinstance(source, str) and store is not None:
        data = _json_object(source)
        if data is None or await _aholds(store, source):

            async def load(run_id: str) -> dict[str, Any]:
                return dict(await awaited(store, "load", run_id))

            return await aexport(store, source, load=load)
        return _recording_of_data(data)
    return recording_of_source(source, None)


def _json_object(text: str) -> dict[str, Any] | None:
    """``text`` as the JSON object it is, or None: a text that is no JSON object can only be a run id."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _holds(store: Store, run_id: str) -> bool:
    try:
        store.load(run_id)
    except KeyError:
        return False
    return True


async def _aholds(store: AsyncStore, run_id: str) -> bool:
    """``_holds``, awaited: the store's ``aload`` twin if it has one, else its ``load`` in a worker thread."""
    try:
        await awaited(store, "load", run_id)
    except KeyError:
        return False
    return True


def _store_of(run_id: str, store: Store | None) -> Store:
    """The store a text that is no JSON object names a run of; a ``ForkError`` without one."""
    if store is None:
        shown = run_id if len(run_id) <= 60 else f"{run_id[:57]}..."
        msg = f"fork of the stored run {shown!r} needs store=, the store that holds it"
        if run_id.lstrip().startswith("{"):
            msg += " (the text is no JSON object, so no snapshot or recording)"
        raise ForkError(msg)
    return store


def _recording_of_data(source: RunResult | dict[str, Any]) -> dict[str, Any]:
    """A source given as data (a ``RunResult``, a snapshot or a recording) as a recording."""
    from fsm_agent.persist.recording import recording_of
    from fsm_agent.persist.recording_format import RECORDING_FORMAT, read_recording

    if isinstance(source, RunResult):
        if source.snapshot is None:
            return _recording_of_result(source)
        source = source.snapshot
    if not isinstance(source, dict):
        msg = f"a fork's source is a RunResult, a snapshot, a recording or a run id, got {type(source).__name__}"
        raise ForkError(msg)
    if source.get("format") == RECORDING_FORMAT:
        return read_recording(source)
    return recording_of(snapshot.parse(source), {})


def _recording_of_result(result: RunResult) -> dict[str, Any]:
    """A finished run's recording from its messages alone: its replies and tool results, without their requests.

    A ``RunResult`` of a run that finished in ``Done`` keeps no snapshot:
    its assistant messages are the replies (no usage), its tool messages
    the results (an ``{"error": ...}`` text is a failed call, as tools report
    failures, and a person's rejection no result at all), and its limits are
    unknown, so the agent's own apply.
    """
    names = {c.id: c for m in result.messages for c in m.tool_calls}
    replies = [m for m in result.messages[result.prior :] if m.role == "assistant"]
    model_calls = [
        {"reply": {"message": plain(m), "stop_reason": "tool_use" if m.tool_calls else "end_turn", "usage": None}}
        for m in replies
    ]
    tool_calls = []
    for message in result.messages[result.prior :]:
        call = names.get(message.tool_call_id or "")
        if message.role == "tool" and call is not None:
            error = error_in(message.content)
            if error is not None and rejection_in(call.name, error) is not None:
                continue  # a person rejected it: it never ran, and the rebuild rejects it again (rebuild.decisions)
            result_of = {"content": message.content, "error": error}
            tool_calls.append({"id": call.id, "name": call.name, "arguments": call.arguments, "result": result_of})
    return {
        "run_id": None,
        "messages": [plain(m) for m in result.messages],
        "prior": result.prior,
        "trace": [plain(t) for t in result.trace],
        "limits": None,
        "model_calls": model_calls,
        "tool_calls": tool_calls,
        "from_messages": True,
    }


def error_in(content: str) -> str | None:
    """The message of a failed call's ``{"error": ...}`` text, else None."""
    try:
        data = json.loads(content)
    except ValueError:
        return None
    if isinstance(data, dict) and list(data) == ["error"] and isinstance(data["error"], str):
        return data["error"]
    return None
