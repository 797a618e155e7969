"""What a ``ForkEdit`` changes in a fork's source before it is rebuilt: its messages, model replies and tool results.

A fork goes on from its edited position, so each edit is made where the
rebuilt run reads it (``drivers.rebuild``): an edited model reply is the
reply the rebuilt run is given, so its tool calls are the calls the fork
makes (one with other arguments is another call, which takes no result of
the source's) and its text is the answer the fork checks and ends with; an
edited tool result (or tool message) is the outcome the rebuilt run is given
for that call, so the core counts it as it now reads (a failure edited into
a success no longer counts as a failure).  The fork writes no counter
itself.  The edited source is a copy: the caller's recording is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fsm_agent.core.exchanges import message_from
from fsm_agent.core.hand_down import canonical_arguments
from fsm_agent.core.history import check_paired
from fsm_agent.drivers.fork_source import error_in
from fsm_agent.errors import ForkError
from fsm_agent.records import Message, plain

_ANSWERS = ("tool_use", "end_turn")
"""The stop reasons that only say whether a reply asks for tools: an edited reply's follows its tool calls."""


def _copied(value: Mapping[Any, Any]) -> dict[Any, Any]:
    """A mapping given to ``ForkEdit``, copied so that the record does not change if the caller's does."""
    return dict(value)


@attrs.frozen
class ForkEdit:
    """Changes made to a fork's position before it goes on (``Agent.fork(..., edit=ForkEdit(...))``).

    ``messages`` replaces messages of the history by index (a ``Message``,
    or a text that keeps the message's role): an edited model reply is the
    reply the fork goes on from (its tool calls still to be made are the
    calls the fork makes, its text the answer it checks), and an edited tool
    message is that call's result.  ``results`` replaces the result of a
    tool call by the source's call id, one already in the history or one the
    source made after the fork point (the fork then takes the new text); a
    text of the form ``{"error": "..."}`` is a failed call's, any other a
    success, and the fork counts it so.  ``limits`` sets limits by name
    (``max_steps=20``), which also lifts a stop the fork was taken at (one
    already used up where the fork's next call is made is refused);
    ``approvals`` decides calls the fork is paused on, as ``Agent.resume`` does.
    """

    messages: Mapping[int, Message | str] = attrs.field(factory=dict, converter=_copied)
    results: Mapping[str, str] = attrs.field(factory=dict, converter=_copied)
    limits: Mapping[str, Any] = attrs.field(factory=dict, converter=_copied)
    approvals: Mapping[str, bool | str] = attrs.field(factory=dict, converter=_copied)


def checked_edit(edit: object) -> ForkEdit:
    """``edit`` (None: no edit) once it is a ``ForkEdit`` whose messages and results are of the right kinds."""
    edit = ForkEdit() if edit is None else edit
    if not isinstance(edit, ForkEdit):
        msg = f"edit must be a ForkEdit, got {type(edit).__name__}"
        raise TypeError(msg)
    for index, new in edit.messages.items():
        if isinstance(index, bool) or not isinstance(index, int):
            msg = f"ForkEdit.messages: {index!r} is not the index of a message"
            raise ForkError(msg)
        if not isinstance(new, Message | str):
            msg = f"ForkEdit.messages[{index}] must be a Message or a text, got {type(new).__name__}"
            raise TypeError(msg)
    for call_id, text in edit.results.items():
        if not isinstance(text, str):
            msg = f"ForkEdit.results[{call_id!r}] must be the result's text, got {type(text).__name__}"
            raise TypeError(msg)
    return edit


def edited_source(recording: dict[str, Any], edit: ForkEdit) -> dict[str, Any]:
    """``recording`` with ``edit``'s messages and results in it (a copy); ``recording`` itself if it edits neither.

    The copy names the calls whose tool or arguments an edited reply changed
    (``edited_calls``): the rebuild answers such a call, made before the
    fork point, with the source's result all the same.
    """
    if not edit.messages and not edit.results:
        return recording
    source = {
        **recording,
        "messages": list(recording["messages"]),
        "model_calls": list(recording["model_calls"]),
        "tool_calls": list(recording["tool_calls"]),
        "edited_calls": [],
    }
    for index, new in edit.messages.items():
        _edit_message(source, index, new)
    for call_id, text in edit.results.items():
        for i, message in enumerate(source["messages"]):
            if message["role"] == "tool" and message.get("tool_call_id") == call_id:
                source["messages"][i] = {**message, "content": text}
        _edit_outcome(source, call_id, text)
    return source


def _edit_message(source: dict[str, Any], index: int, new: Message | str) -> None:
    """Message ``index`` replaced; a model reply's in the reply given to the rebuild, a tool message's in its result."""
    messages, prior = source["messages"], source["prior"]
    if not 0 <= index < len(messages):
        msg = f"ForkEdit.messages: {index!r} is not the index of a message of the source (0 to {len(messages) - 1})"
        raise ForkError(msg)
    old = messages[index]
    message = {**old, "content": new} if isinstance(new, str) else plain(new)
    messages[index] = message
    if old["role"] == "assistant" and index >= prior:
        if message["role"] != "assistant":
            msg = (
                f"ForkEdit.messages[{index}] turns the model's reply into a {message['role']!r} message: a reply is "
                "edited as a reply (a text, or a Message with role 'assistant')"
            )
            raise ForkError(msg)
        turn = sum(1 for m in messages[prior:index] if m["role"] == "assistant")
        _edit_reply(source, turn, old, message)
    elif old["role"] == "tool" and message["role"] == "tool" and message["tool_call_id"] == old["tool_call_id"]:
        _edit_outcome(source, old["tool_call_id"], message["content"])


def _edit_reply(source: dict[str, Any], turn: int, old: dict[str, Any], message: dict[str, Any]) -> None:
    """The ``turn``-th kept reply (from 0) given as ``message``; a reply the source did not keep is left to the rebuild.

    (The rebuild refuses a source whose replies were not kept:
    ``rebuild._check_replies_kept``.)
    """
    kept = [i for i, call in enumerate(source["model_calls"]) if call.get("reply") is not None]
    if turn >= len(kept):
        return
    call = source["model_calls"][kept[turn]]
    reply = {**call["reply"], "message": message}
    if reply["stop_reason"] in _ANSWERS:
        reply["stop_reason"] = _ANSWERS[0] if message["tool_calls"] else _ANSWERS[1]
    source["model_calls"][kept[turn]] = {**call, "reply": reply}
    before = {c["id"]: _asked(c) for c in old["tool_calls"]}
    source["edited_calls"] += [c["id"] for c in message["tool_calls"] if before.get(c["id"]) != _asked(c)]


def _asked(call: dict[str, Any]) -> tuple[str, str]:
    """A tool call (its plain form) as what it asks: its tool and canonical arguments."""
    return call["name"], canonical_arguments(call["arguments"])


def _edit_outcome(source: dict[str, Any], call_id: str, text: str) -> None:
    """The recorded result of ``call_id`` (if the source has one) now reads ``text``: failed if it is an error's."""
    for i, call in enumerate(source["tool_calls"]):
        if call["id"] == call_id:
            source["tool_calls"][i] = {**call, "result": {**call["result"], "content": text, "error": error_in(text)}}


def in_source(source: dict[str, Any], call_id: str) -> bool:
    """Whether the source holds a result of ``call_id`` that ``ForkEdit.results`` can change: recorded, or answered."""
    return any(c["id"] == call_id for c in source["tool_calls"]) or any(
        m["role"] == "tool" and m.get("tool_call_id") == call_id for m in source["messages"]
    )


def unpaired(source: dict[str, Any], edit: ForkEdit) -> str | None:
    """Why the edited messages pair a tool call and its answer as no provider takes, or None.

    Asked when the edited source could not be rebuilt: an edited reply that
    drops a call whose answer follows (or adds one nothing answers) makes the
    rebuilt run go another way, and this says why.  The calls of the last
    reply may stay unanswered (the fork may be taken before their answers).
    """
    if not edit.messages:
        return None
    messages = [message_from(m) for m in source["messages"]]
    still_open: set[str] = set()
    for message in messages:
        if message.role in ("user", "assistant"):
            still_open = {call.id for call in message.tool_calls}
        elif message.role == "tool":
            still_open.discard(message.tool_call_id or "")
    try:
        check_paired(list(enumerate(messages)), where="messages", still_open=still_open)
    except ValueError as exc:
        return f"ForkEdit.messages leave a history providers refuse: {exc}"
    return None
