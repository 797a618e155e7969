"""What a well-formed provider reply holds, checked where each adapter reads one, and the tool-call wire rules.

Each rule that every provider must agree on lives here once: which tool
results count as failed, and what becomes of argument text that is not a
JSON object.

A reply with no usage at all is counted as zero tokens; a usage object that
is there must hold each count the adapter reads as an integer >= 0
(missing, null, a string, a float, NaN, infinity, a bool or a negative
number is malformed: a count half there is not taken for zero, since it
would quietly switch ``token_budget`` off).  Tool call ids and names, and
texts, must be strings.  A malformed reply is a ``MalformedReplyError`` (a
``ValueError``) naming the field, so the run stops with ``model_error``
instead of failing later on the junk; the adapter returns nothing, so that
reply is not in the run's messages.  (The openai SDK turns a numeric string
or a bool into an integer while parsing, before the adapter sees it.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from fsm_agent import Message, ToolCall


class MalformedReplyError(ValueError):
    """A provider reply the adapter will not pass on to the engine; ``field`` names the part at fault."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field = field
        self.problem = problem

    def __str__(self) -> str:
        return f"malformed provider reply: {self.field} {self.problem}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def reply_text(value: Any, field: str, *, nullable: bool = False) -> str:
    """A string field of a reply (null is ``""`` where ``nullable``), or ``MalformedReplyError`` naming it."""
    if value is None and nullable:
        return ""
    if not isinstance(value, str):
        raise MalformedReplyError(field, f"must be a string, got {_shown(value)}")
    return value


def reply_items(value: Any, field: str) -> list[Any]:
    """A list field of a reply (null is empty), or ``MalformedReplyError`` naming it."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedReplyError(field, f"must be a list, got {_shown(value)}")
    return value


def token_count(usage: Any, name: str, *, optional: bool = False) -> int:
    """``usage.<name>`` as an integer >= 0 (null is 0 where ``optional``), or ``MalformedReplyError`` naming it."""
    value = getattr(usage, name, None)
    if value is None:
        if optional:
            return 0
        raise MalformedReplyError(f"usage.{name}", "is missing or null")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedReplyError(f"usage.{name}", f"must be an integer >= 0, got {_shown(value)}")
    return value


def decode_arguments(call_id: str, name: str, raw: str | None) -> ToolCall:
    """Build a ``ToolCall`` from the model's argument text; text that is not a JSON object is kept raw.

    The registry turns a call with ``raw_arguments`` into a failed tool result
    telling the model what was wrong, so broken JSON (or a cut-off call) never
    crashes a run.  Empty text means "no arguments": OpenAI-compatible servers
    send ``""`` for tools without parameters.
    """
    if raw is None or not raw.strip():
        return ToolCall(call_id, name, {})
    try:
        value = json.loads(raw)
    except ValueError:
        return ToolCall(call_id, name, {}, raw_arguments=raw)
    if not isinstance(value, dict):
        return ToolCall(call_id, name, {}, raw_arguments=raw)
    return ToolCall(call_id, name, value)


def decoded_input(call_id: str, name: str, value: Any) -> ToolCall:
    """Build a ``ToolCall`` from arguments a provider already decoded; a non-object is kept as its JSON text."""
    if isinstance(value, dict):
        return ToolCall(call_id, name, value)
    return ToolCall(call_id, name, {}, raw_arguments=json.dumps(value, ensure_ascii=False))


def encode_arguments(call: ToolCall) -> str:
    """The argument text to send back to the provider: what the model wrote if it was not decodable."""
    if call.raw_arguments is not None:
        return call.raw_arguments
    return json.dumps(call.arguments, ensure_ascii=False)


# The line ToolRegistry appends to output it cut at max_output_chars; what comes before it is the start of the text.
_TRUNCATION_MARKER = re.compile(r"\n\[truncated: \d+ of \d+ characters cut, max_output_chars=\d+\]\Z")
_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _leading_keys(text: str) -> Iterator[str]:
    """The top-level keys of a JSON object that can be read from ``text``, the beginning of its encoding."""
    at = _skip(text, 0)
    if not text.startswith("{", at):
        return
    at += 1
    while True:
        try:
            key, at = _DECODER.raw_decode(text, _skip(text, at))
        except ValueError:
            return
        if not isinstance(key, str):
            return
        yield key
        at = _skip(text, at)
        if not text.startswith(":", at):
            return
        try:
            _, at = _DECODER.raw_decode(text, _skip(text, at + 1))
        except ValueError:
            return
        at = _skip(text, at)
        if not text.startswith(",", at):
            return
        at += 1


def _skip(text: str, at: int) -> int:
    match = _SPACE.match(text, at)
    return at if match is None else match.end()


def tool_failed(message: Message) -> bool:
    """True when a tool message reports a failure: its content is a JSON object with a top-level ``"error"``.

    That is exactly how the registry encodes every failure, so this is
    structural, never a search for the word "error" in a successful result.
    Output the registry cut at its ``max_output_chars`` is no longer whole
    JSON: its top-level keys are read as far as the cut allows, so a failure
    keeps counting as one (the registry's own failures put ``"error"``
    first; a tool's dict whose ``"error"`` key lies beyond the cut cannot be
    told from a success).
    """
    content = message.content
    marker = _TRUNCATION_MARKER.search(content)
    if marker is not None:
        return "error" in _leading_keys(content[: marker.start()])
    try:
        value = json.loads(content)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value
