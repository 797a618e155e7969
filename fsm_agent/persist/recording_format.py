"""A recording's format: its name and version, the migrations of older ones, its shape checked as it is read.

A recording comes back from a file or a text a person may have written
or edited, so each field a replay or a fork reads is checked before
anything reads it (``check_recording``): a malformed one is a
``RecordingError`` naming the field at fault, never a replay that goes
wrong later; the recordings of its sub-agents, nested in it, are read
the same way.  Reading one needs no store, so this is apart from
``persist.recording``, which builds recordings from a store (and hands
out these names too, where users import them).

Readers accept every earlier version: ``MIGRATIONS`` brings each up to date.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsm_agent.errors import FsmAgentError
from fsm_agent.jsontext import no_json_text, versioned

RECORDING_FORMAT = "fsm_agent.Recording"
RECORDING_VERSION = 1
SPENT = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cost",
    "priced",
    "unpriced",
    "tool_calls",
)
"""The counts a recording's optional ``spent`` holds: what the run spent in all, its sub-agents' runs included."""


class RecordingError(FsmAgentError, ValueError):
    """A recording that cannot be read: not JSON, another format, a version this release does not know, or malformed."""


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}
"""How each older version becomes the next one (version 1 is the first: none yet)."""


def read_recording(source: dict[str, Any] | str | Path) -> dict[str, Any]:
    """A recording from its dict, its JSON text or a file's ``Path``, brought up to this version; ``RecordingError``.

    Its shape is checked before anything reads it (``check_recording``): a
    malformed recording is a ``RecordingError`` naming the field at fault,
    its sub-agents' recordings too.
    """
    if isinstance(source, Path):
        source = source.read_text(encoding="utf-8")
    try:
        read = versioned(source, "recording", (RECORDING_FORMAT, RECORDING_VERSION), MIGRATIONS, RecordingError)
    except RecordingError as exc:
        shown = no_json_text(source, exc)
        if shown is None:
            raise
        # Most often a file's path, given as a str: a text is the recording's own JSON, never opened as a file.
        msg = f"a recording is a dict, its JSON text or a file's Path, and the text {shown!r} is no JSON"
        msg += f"; to read the file of that name, pass its Path: Path({shown!r})" if shown.strip() else ""
        raise RecordingError(msg) from exc
    check_recording(read)
    return read


_TRANSITION_FIELDS = ("source", "trigger", "dest", "guard", "reason")


def check_recording(data: dict[str, Any]) -> None:
    """Check the shape of a recording of this version: each field a replay or a fork reads; else ``RecordingError``.

    The error names the field (``model_calls[1].reply``); a sub-agent's
    recording is checked whole, its error prefixed with the call it answered.
    """
    missing = [k for k in ("messages", "trace", "limits", "model_calls", "tool_calls", "prior") if k not in data]
    if missing:
        msg = f"recording lacks {', '.join(missing)}"
        raise RecordingError(msg)
    for name in ("run_id", "state", "reason", "final", "unfinished", "blocked_by"):
        _text_or_null(data.get(name), name)
    _spent(data.get("spent"))
    forked_from = data.get("forked_from")
    if forked_from is not None and not _fork_origin(forked_from):
        msg = f"recording field forked_from must be [source run id or null, transition index], got {forked_from!r}"
        raise RecordingError(msg)
    messages = _list(data["messages"], "messages")
    if not messages:
        msg = "recording field messages is empty: it holds at least the run's question"
        raise RecordingError(msg)
    for index, message in enumerate(messages):
        _message(message, f"messages[{index}]")
    prior = data["prior"]
    if isinstance(prior, bool) or not isinstance(prior, int) or not 0 <= prior < len(messages):
        msg = f"recording field prior must index the run's question in its {len(messages)} messages, got {prior!r}"
        raise RecordingError(msg)
    if messages[prior]["role"] != "user":
        msg = f"recording field messages[{prior}] (the run's question, at prior) must be a user message"
        raise RecordingError(msg)
    for index, entry in enumerate(_list(data["trace"], "trace")):
        _transition(entry, f"trace[{index}]")
    _limits(data)
    if not isinstance(data.get("steps", []), list):
        msg = f"recording field steps must be a list, got {_kind(data['steps'])}"
        raise RecordingError(msg)
    for index, call in enumerate(_list(data["model_calls"], "model_calls")):
        _model_call(call, f"model_calls[{index}]")
    for index, call in enumerate(_list(data["tool_calls"], "tool_calls")):
        _tool_call(call, f"tool_calls[{index}]")
    for index, carried in enumerate(_entries(data.get("carried") or [], "carried")):
        _outcome(carried, f"carried[{index}]")
    for index, down in enumerate(_entries(data.get("carried_down") or [], "carried_down")):
        for inner, outcome in enumerate(_entries(down[2], f"carried_down[{index}][2]")):
            _outcome(outcome, f"carried_down[{index}][2][{inner}]")
    children = data.get("children") or {}
    if not isinstance(children, dict):
        msg = f"recording field children must be an object of recordings by call id, got {_kind(children)}"
        raise RecordingError(msg)
    for name, child in children.items():
        try:
            read_recording(child)
        except RecordingError as exc:
            msg = f"the recording of sub-agent call {name!r}: {exc}"
            raise RecordingError(msg) from exc


def _spent(value: Any) -> None:
    """A recording's ``spent``, if it has one: an object of ``SPENT`` counts, each a whole number >= 0, but
    ``cost``, US dollars >= 0 or null (unknown: a model call was unpriced); else ``RecordingError``."""
    if value is None:
        return
    if not isinstance(value, dict):
        msg = f"recording field spent must be an object of counts, got {_kind(value)}"
        raise RecordingError(msg)
    strange = sorted(set(value) - set(SPENT))
    if strange:
        msg = f"recording field spent has counts a run has not: {', '.join(strange)} (it may hold {', '.join(SPENT)})"
        raise RecordingError(msg)
    for name, count in value.items():
        number = isinstance(count, (int, float)) and not isinstance(count, bool) and math.isfinite(count) and count >= 0
        if name == "cost" and (count is None or number):
            continue
        if not number or not isinstance(count, int):
            wanted = "US dollars >= 0 or null" if name == "cost" else "a whole number >= 0"
            msg = f"recording field spent.{name} must be {wanted}, got {count!r:.40}"
            raise RecordingError(msg)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _fork_origin(value: Any) -> bool:
    """Whether ``value`` is a fork's origin as a snapshot keeps it: its source run's id (None for a source that was
    not stored) and the index of the transition it was taken after."""
    match value:
        case [str() | None, int(at)] if not isinstance(at, bool) and at >= 0:
            return True
    return False


def _text_or_null(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, str):
        msg = f"recording field {where} must be a string or null, got {_kind(value)}"
        raise RecordingError(msg)


def _list(value: Any, where: str) -> list[dict[str, Any]]:
    """``value``, a list of objects; else ``RecordingError`` naming ``where`` (and the entry at fault)."""
    if not isinstance(value, list):
        msg = f"recording field {where} must be a list, got {_kind(value)}"
        raise RecordingError(msg)
    for index, item in enumerate(value):
        _object(item, f"{where}[{index}]")
    return value


def _object(value: Any, where: str, *keys: str) -> dict[str, Any]:
    """``value``, an object holding ``keys``; else ``RecordingError`` naming ``where``."""
    if not isinstance(value, dict):
        msg = f"recording field {where} must be an object, got {_kind(value)}"
        raise RecordingError(msg)
    missing = [key for key in keys if key not in value]
    if missing:
        msg = f"recording field {where} lacks {', '.join(missing)}"
        raise RecordingError(msg)
    return value


def _message(value: Any, where: str) -> None:
    from fsm_agent.core.snapshot import SnapshotError, message_of

    try:
        message_of(_object(value, where, "role", "content", "tool_calls", "tool_call_id"))
    except SnapshotError as exc:
        msg = f"recording field {where} is not a message: {exc.__cause__ or exc}"
        raise RecordingError(msg) from exc


def _transition(value: Any, where: str) -> None:
    entry = _object(value, where, "source", "trigger", "dest")
    strange = sorted(set(entry) - set(_TRANSITION_FIELDS))
    if strange:
        msg = f"recording field {where} has fields a transition has not: {', '.join(strange)}"
        raise RecordingError(msg)
    for name in _TRANSITION_FIELDS:
        value = entry.get(name)
        if not isinstance(value, str) and (value is not None or name not in ("guard", "reason")):
            msg = f"recording field {where}.{name} must be a string, got {_kind(value)}"
            raise RecordingError(msg)


def _limits(data: dict[str, Any]) -> None:
    from fsm_agent.core.snapshot import SnapshotError, cut_shares_of, cuts_taken_back_of, earlier_limits_of, limits_of

    try:
        limits_of(data)
        earlier_limits_of(data)
        cut_shares_of(data)
        cuts_taken_back_of(data)
    except SnapshotError as exc:
        msg = str(exc).replace("snapshot field", "recording field", 1)
        raise RecordingError(msg) from exc


def _model_call(value: Any, where: str) -> None:
    from fsm_agent.core.exchanges import response_from

    call = _object(value, where, "request", "reply", "error")
    request = _object(call["request"], f"{where}.request", "messages", "tools", "output")
    for index, message in enumerate(_list(request["messages"], f"{where}.request.messages")):
        _message(message, f"{where}.request.messages[{index}]")
    if not isinstance(request["tools"], list):
        msg = f"recording field {where}.request.tools must be a list, got {_kind(request['tools'])}"
        raise RecordingError(msg)
    if request["output"] is not None:
        _object(request["output"], f"{where}.request.output")
    _text_or_null(call["error"], f"{where}.error")
    reply = call["reply"]
    if reply is None:
        return
    _message(_object(reply, f"{where}.reply", "message", "stop_reason", "usage")["message"], f"{where}.reply.message")
    try:
        response_from(reply)
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"recording field {where}.reply is not a model reply: {type(exc).__name__}: {exc}"
        raise RecordingError(msg) from exc


def _entries(value: Any, where: str) -> list[list[Any]]:
    """``value``, a list of ``[tool name, canonical arguments, outcome]`` entries (a fork's carried outcomes)."""
    if not isinstance(value, list):
        msg = f"recording field {where} must be a list, got {_kind(value)}"
        raise RecordingError(msg)
    for index, entry in enumerate(value):
        shaped = isinstance(entry, list) and len(entry) == 3 and all(isinstance(part, str) for part in entry[:2])
        if not shaped:
            msg = f"recording field {where}[{index}] must be [tool name, arguments text, outcome], got {entry!r:.80}"
            raise RecordingError(msg)
    return value


def _outcome(entry: list[Any], where: str) -> None:
    """A carried ``[name, arguments, result]`` entry whose result is a tool result's plain form."""
    _tool_call({"id": "", "name": entry[0], "arguments": entry[1], "result": entry[2]}, where)


def _tool_call(value: Any, where: str) -> None:
    from fsm_agent.core import snapshot_fields as fields

    call = _object(value, where, "id", "name", "arguments", "result")
    for name in ("id", "name"):
        if not isinstance(call[name], str):
            msg = f"recording field {where}.{name} must be a string, got {_kind(call[name])}"
            raise RecordingError(msg)
    result = _object(call["result"], f"{where}.result", "content")
    if not isinstance(result["content"], str):
        msg = f"recording field {where}.result.content must be a string, got {_kind(result['content'])}"
        raise RecordingError(msg)
    _text_or_null(result.get("error"), f"{where}.result.error")
    if call.get("held") is not None and not isinstance(call["held"], bool):
        msg = f"recording field {where}.held must be true, false or null, got {_kind(call['held'])}"
        raise RecordingError(msg)
    try:
        fields.result(result)
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"recording field {where}.result is not a tool result: {type(exc).__name__}: {exc}"
        raise RecordingError(msg) from exc
    cut = call.get("cut")  # what cuts of a sub-agent call counted before the result answered it
    if cut is None:
        return
    if not isinstance(cut, dict):
        msg = f"recording field {where}.cut must be an object of counts or null, got {_kind(cut)}"
        raise RecordingError(msg)
    try:
        fields.spend(cut, f"recording field {where}.cut")
    except (TypeError, ValueError) as exc:
        shown = str(exc) if isinstance(exc, ValueError) else f"recording field {where}.cut: {exc}"
        raise RecordingError(shown) from exc
