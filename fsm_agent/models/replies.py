"""What a well-formed provider reply holds, checked where each adapter reads one, and the tool-call wire rules.

Each rule that every provider must agree on lives here once: which tool
results count as failed, what becomes of argument text that is not a JSON
object, and what text can go out (``wire_safe``: half an emoji cannot).

A reply with no usage at all is counted as zero tokens; a usage object that
is there must hold each count the adapter reads as an integer >= 0
(missing, null, a string, a float, NaN, infinity, a bool or a negative
number is malformed: a count half there is not taken for zero, since it
would quietly switch ``token_budget`` off).  Tool call ids and names, and
texts, must be strings.  A body that is not JSON, and a reply whose only
content is of kinds the adapter does not read (under a stop reason that
reads as an answer), are malformed too: they would pass for an empty
answer.  A malformed reply is a ``MalformedReplyError`` (a
``ValueError``) naming the field, so the run stops with ``model_error``
instead of failing later on the junk; the adapter returns nothing, so that
reply is not in the run's messages.  (The openai SDK turns a numeric string
or a bool into an integer while parsing, before the adapter sees it.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from fsm_agent import Message, ModelResponse, ToolCall


@attrs.frozen
class ProviderResponse(ModelResponse):
    """A ``ModelResponse`` that also keeps the provider's own finish signal, as the reply said it.

    ``stop_reason`` is the engine's word for it; tracing reports this one
    (``gen_ai.response.finish_reasons``), as the GenAI conventions ask:
    ``"tool_calls"`` for OpenAI, ``"STOP"`` for Gemini.  ``None`` where the
    reply gave none.
    """

    finish_reason: str | None = attrs.field(default=None, kw_only=True)


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


def not_json(body: str | bytes) -> MalformedReplyError:
    """The error for a reply body that is not JSON (a proxy's error page sent with status 200), showing it."""
    return MalformedReplyError("response body", f"is not JSON: {_shown(body)}")


def check_body(response: Any) -> None:
    """Refuse a reply that is text: the Stainless SDKs hand a body they cannot read as JSON on as its text.

    Read field by field, that text would pass for an empty reply ("choices is
    empty", or an answer of nothing).
    """
    if isinstance(response, str | bytes):
        raise not_json(response)


ANSWERS = ("end_turn", "stop_sequence", "tool_use")
"""The stop reasons under which a reply is taken for the model's answer or its tool calls."""


def check_read(field: str, unread: Sequence[str], reply: Message, stop_reason: str) -> None:
    """Refuse a reply that would pass for an empty answer although content arrived that the adapter does not read.

    Content the engine's conversation has no place for (a server tool's
    block, an image, a kind newer than the adapter) is dropped beside text or
    tool calls.  Alone, under a stop reason that reads as an answer, dropping
    it would end the run ``done`` with an empty answer, so the reply is
    refused instead, ``unread`` saying what arrived.
    """
    if unread and not reply.content and not reply.tool_calls and stop_reason in ANSWERS:
        shown = ", ".join(unread)
        raise MalformedReplyError(field, f"holds no text or tool call, only what this adapter does not read: {shown}")


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


def detail_count(usage: Any, details: str, name: str) -> int:
    """``usage.<details>.<name>``, a breakdown count a provider may leave out (0), or ``MalformedReplyError``."""
    part = getattr(usage, details, None)
    if part is None:
        return 0
    try:
        return token_count(part, name, optional=True)
    except MalformedReplyError as exc:
        raise MalformedReplyError(f"usage.{details}.{name}", exc.problem) from None


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


def renamed_calls(kept: Sequence[dict[str, Any]], key: str, calls: Sequence[ToolCall]) -> None:
    """Give the calls of a reply kept verbatim (``provider_data``) the ids of its message's calls, in order.

    The engine renames a call whose id the conversation already holds
    (``call_0`` becomes ``call_0-2``, ``core.ledger.unique_calls``) on the
    message's ``ToolCall``; the reply's verbatim copy keeps the provider's id.
    An adapter that sends that copy back passes its call objects (``kept``,
    decoded from the payload, in order; changed in place) and the field
    holding their id, so the request carries each call under the id its tool
    result answers.  Only that field is written, and only where the id
    differs; a call sent without an id (Gemini may omit it) stays without
    one, and a call of the message that has no object in the copy (Gemini's
    malformed call) has nothing to rename.  Signed content (thinking blocks,
    encrypted reasoning, thought signatures) is left as it came.
    """
    for item, call in zip(kept, calls, strict=False):
        if key in item and item[key] != call.id:
            item[key] = call.id


_SURROGATE = re.compile("[\ud800-\udfff]")


def wire_text(text: str) -> str:
    """``text`` as UTF-8 can carry it: a split surrogate pair joined, a lone surrogate (half an emoji) as U+FFFD.

    The run's record keeps what the model or tool produced, exactly; only
    the copy sent to the provider is changed, since no SDK can encode a
    lone surrogate and the run would stop at its next model call.
    """
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def wire_safe(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` with every string in it (keys included) made ``wire_text``; the same object when none needed it."""
    cleaned: dict[str, Any] = _wire_value(request)
    return cleaned


def _wire_value(value: Any) -> Any:
    # Recursive: a request nests as deep as the tool arguments in it, which the engine bounds.
    if isinstance(value, str):
        return wire_text(value)
    if isinstance(value, dict):
        cleaned = {wire_text(k) if isinstance(k, str) else k: _wire_value(v) for k, v in value.items()}
        pairs = zip(value.items(), cleaned.items(), strict=False)  # fewer when two keys were cleaned alike
        same = len(cleaned) == len(value) and all(a is b and c is d for (a, c), (b, d) in pairs)
        return value if same else cleaned
    if isinstance(value, list | tuple):
        items = [_wire_value(item) for item in value]
        if all(a is b for a, b in zip(value, items, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


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
