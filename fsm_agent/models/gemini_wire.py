"""Gemini's wire format both ways, for the Gemini adapter: contents and parts out, responses (and streams) in.

Pure functions over plain data and the SDK's response objects, so the
adapter (:mod:`fsm_agent.models.gemini`) holds only its facts and the client.
The rules they follow are the adapter's: parts with thought signatures go
back verbatim, derived call ids are never sent, results pair with calls by
name and order, and the adapter's ``finish_reasons`` map the stop signals.  A typed
agent's answer schema becomes JSON mode with a JSON Schema
(:func:`to_gemini_output`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fsm_agent import Message, ModelResponse, OutputSchema, ProviderData, ToolCall, Usage
from fsm_agent.core.reply_checks import MAX_NESTING, nests_deeper
from fsm_agent.models.replies import (
    MalformedReplyError,
    ProviderResponse,
    check_read,
    decoded_input,
    renamed_calls,
    reply_items,
    reply_text,
    token_count,
    tool_failed,
)
from fsm_agent.tools import JSONSchema

PROVIDER = "gemini"
"""``ProviderData.provider`` of the replies whose parts this adapter sends back verbatim."""

EMPTY_ALLOWED = ("refusal", "max_tokens")
"""The stop reasons under which a candidate without content says what happened: refused, or cut before any text."""

JSON_MIME_TYPE = "application/json"
"""The ``response_mime_type`` of JSON mode, which a response schema needs."""

OUTPUT_FIELDS = ("response_mime_type", "response_json_schema")
"""The ``GenerateContentConfig`` fields :func:`to_gemini_output` sets."""

MALFORMED_CALL = "MALFORMED_FUNCTION_CALL"
DERIVED_ID_PREFIX = "gemini-call-"
"""Ids the adapter made up for calls Gemini sent without one; they are never sent to Gemini."""

# How Gemini's finishMessage names the function of a malformed call, e.g. "print(default_api.add(a=2 b=3))".
_CALLED = re.compile(r"(?:default_api[.:]|call:)([A-Za-z_][\w-]*)")


def _derived(call_id: str) -> bool:
    return call_id.startswith(DERIVED_ID_PREFIX)


def _response_value(message: Message) -> dict[str, Any]:
    """A tool message as a ``functionResponse.response`` object: ``{"output": ...}`` or ``{"error": ...}``."""
    try:
        value: Any = json.loads(message.content)
    except ValueError:
        value = message.content
    if tool_failed(message):
        return {"error": value["error"] if isinstance(value, dict) else value}
    return {"output": value}


def _append(contents: list[dict[str, Any]], role: str, parts: list[dict[str, Any]]) -> None:
    # One content per role in a row: a turn's function responses must sit together, as many as its calls.
    if contents and contents[-1]["role"] == role:
        contents[-1]["parts"].extend(parts)
    elif parts:
        contents.append({"role": role, "parts": parts})


def _model_parts(message: Message) -> list[dict[str, Any]]:
    data = message.provider_data
    if data is not None and data.provider == PROVIDER:
        # Sent back verbatim, signatures and all; only the function calls' ids follow the engine's renames.
        kept = data.items()
        renamed_calls([part["functionCall"] for part in kept if "functionCall" in part], "id", message.tool_calls)
        return kept
    parts: list[dict[str, Any]] = [{"text": message.content}] if message.content else []
    for call in message.tool_calls:
        if call.raw_arguments is not None:
            # A functionCall's args must be an object; a call that never had one travels as text.
            parts.append({"text": f"[call to {call.name} with arguments that are not an object: {call.raw_arguments}]"})
            continue
        function_call: dict[str, Any] = {"name": call.name, "args": call.arguments}
        if not _derived(call.id):
            function_call["id"] = call.id
        parts.append({"functionCall": function_call})
    return parts


def to_gemini_contents(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """The conversation as Gemini's ``system_instruction`` text and wire-format ``contents`` (camelCase parts)."""
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    calls: dict[str, ToolCall] = {}
    for message in messages:
        if message.role == "system":
            system.append(message.content)
        elif message.role == "user":
            _append(contents, "user", [{"text": message.content}])
        elif message.role == "assistant":
            calls.update((call.id, call) for call in message.tool_calls)
            _append(contents, "model", _model_parts(message))
        elif message.role == "tool":
            call = calls.get(message.tool_call_id or "")
            if call is None:
                msg = f"tool message {message.tool_call_id!r} answers no earlier tool call; Gemini pairs them by name"
                raise ValueError(msg)
            if call.raw_arguments is not None:
                _append(contents, "user", [{"text": f"[result of {call.name}: {message.content}]"}])
                continue
            response: dict[str, Any] = {"name": call.name, "response": _response_value(message)}
            if not _derived(call.id):
                response["id"] = call.id
            _append(contents, "user", [{"functionResponse": response}])
        else:
            msg = f"unknown message role {message.role!r}; expected system, user, assistant or tool"
            raise ValueError(msg)
    return "\n\n".join(system), contents


def to_gemini_tools(schemas: list[JSONSchema]) -> list[dict[str, Any]]:
    """``ToolRegistry.schemas()`` as one Gemini tool of function declarations, with plain JSON Schema parameters."""
    if not schemas:
        return []
    declarations = [
        {"name": s["name"], "description": s["description"], "parameters_json_schema": s["parameters"]} for s in schemas
    ]
    return [{"function_declarations": declarations}]


def to_gemini_output(output: OutputSchema) -> dict[str, Any]:
    """``output`` as ``GenerateContentConfig`` fields: JSON mode, constrained by the schema as JSON Schema.

    ``response_json_schema`` takes JSON Schema as it is, which is what an
    ``OutputSchema`` holds (the tools go the same way, as
    ``parameters_json_schema``); ``response_schema`` would want Gemini's
    OpenAPI subset, and converting to it would lose what it lacks
    (``additionalProperties``, ``$ref``/``$defs``, ...).  Keywords Gemini
    does not support are ignored by it, and the agent checks the answer
    against the whole schema anyway.  The name, description and strict
    flag have no Gemini field; a description inside the schema goes along.
    """
    return {"response_mime_type": JSON_MIME_TYPE, "response_json_schema": output.schema}


def _wire(part: Any) -> dict[str, Any]:
    """A reply part as Gemini's JSON, the signature as standard base64, exactly the bytes it carried."""
    data: dict[str, Any] = part.model_dump(mode="json", by_alias=True, exclude_none=True)
    signature = getattr(part, "thought_signature", None)
    if isinstance(signature, bytes):
        data["thoughtSignature"] = base64.b64encode(signature).decode("ascii")
    return data


def _usage(usage: Any) -> Usage | None:
    # Gemini's JSON leaves out zero counts, so only the prompt count must be there; thoughts are billed as output.
    if usage is None:
        return None
    input_tokens = token_count(usage, "prompt_token_count") + token_count(
        usage, "tool_use_prompt_token_count", optional=True
    )
    thoughts = token_count(usage, "thoughts_token_count", optional=True)
    output_tokens = token_count(usage, "candidates_token_count", optional=True) + thoughts
    # The prompt count includes the tokens read from a cached content.
    cached = token_count(usage, "cached_content_token_count", optional=True)
    return Usage(input_tokens, output_tokens, cache_read_tokens=cached, reasoning_tokens=thoughts)


def _call_id(given: Any, key: str, index: int, field: str) -> str:
    if given is not None:
        return reply_text(given, field)
    return f"{DERIVED_ID_PREFIX}{key}-{index}"


def _response_key(response: Any) -> str:
    """What derived call ids are made from: the response id, else a digest of the whole reply."""
    response_id = getattr(response, "response_id", None)
    if isinstance(response_id, str) and response_id:
        return response_id
    dumped = json.dumps(response.model_dump(mode="json", exclude_none=True), sort_keys=True)
    return hashlib.sha256(dumped.encode()).hexdigest()[:16]


def _blocked(response: Any) -> ModelResponse:
    feedback = getattr(response, "prompt_feedback", None)
    reason = getattr(feedback, "block_reason", None)
    if reason is None:
        raise MalformedReplyError("candidates", "is empty and no promptFeedback.blockReason says why")
    explanation = reply_text(getattr(feedback, "block_reason_message", None), "promptFeedback", nullable=True)
    blocked = str(getattr(reason, "value", reason))
    text = explanation or f"the prompt was blocked: {blocked}"
    usage = _usage(getattr(response, "usage_metadata", None))
    return ProviderResponse(Message("assistant", text), "refusal", usage, finish_reason=blocked)


def from_gemini_response(response: Any, finish_reasons: Mapping[str, str]) -> ModelResponse:
    """The engine's view of a ``GenerateContentResponse`` (its first candidate); ``MalformedReplyError`` if junk.

    ``finish_reasons`` maps its finish reason (the adapter's, see
    :attr:`~fsm_agent.models.GeminiModel.finish_reasons`).  Text parts are
    the answer and thought parts its readable ``thinking``; ``functionCall``
    parts are tool calls.  Parts with a thought signature,
    or thought parts, make the reply keep all its parts as ``provider_data``.
    """
    candidates = reply_items(getattr(response, "candidates", None), "candidates")
    if not candidates:
        return _blocked(response)
    candidate = candidates[0]
    finish = getattr(candidate, "finish_reason", None)
    reason = reply_text(getattr(finish, "value", finish), "candidates[0].finishReason", nullable=True)
    content = getattr(candidate, "content", None)
    parts = reply_items(getattr(content, "parts", None), "candidates[0].content.parts")
    if not parts and reason != MALFORMED_CALL and finish_reasons.get(reason) not in EMPTY_ALLOWED:
        # Read as it is, it would end the run done with an empty answer (under STOP) although none came.
        said = f"finishReason {reason}" if reason else "no finishReason"
        raise MalformedReplyError("candidates[0].content", f"is empty ({said}): Gemini sent no text and no tool call")
    _check_nesting(parts)
    key = _response_key(response)
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    unread: list[str] = []
    for i, part in enumerate(parts):
        field = f"candidates[0].content.parts[{i}]"
        text = reply_text(getattr(part, "text", None), f"{field}.text", nullable=True)
        (thoughts if getattr(part, "thought", None) else texts).append(text)
        call = getattr(part, "function_call", None)
        if call is None and getattr(part, "text", None) is None:
            unread.extend(_unread(part, field))
        if call is not None:
            name = reply_text(getattr(call, "name", None), f"{field}.functionCall.name")
            call_id = _call_id(getattr(call, "id", None), key, len(calls), f"{field}.functionCall.id")
            args = getattr(call, "args", None)
            calls.append(decoded_input(call_id, name, {} if args is None else args))
    stop_reason = finish_reasons.get(reason, reason or "no finish reason")
    if reason == MALFORMED_CALL:
        message = reply_text(getattr(candidate, "finish_message", None), "candidates[0].finishMessage", nullable=True)
        named = _CALLED.search(message)
        raw = message or f"{MALFORMED_CALL}: Gemini could not produce a valid function call"
        name = named[1] if named else MALFORMED_CALL.lower()
        calls.append(ToolCall(f"{DERIVED_ID_PREFIX}{key}-{len(calls)}", name, raw_arguments=raw))
        stop_reason = "tool_use"
    elif stop_reason == "end_turn" and calls:
        stop_reason = "tool_use"
    kept = None
    if any(getattr(p, "thought_signature", None) is not None or getattr(p, "thought", None) for p in parts):
        kept = ProviderData(PROVIDER, json.dumps([_wire(p) for p in parts], ensure_ascii=False), "".join(thoughts))
    reply = Message("assistant", "".join(texts), calls, provider_data=kept)
    check_read("candidates[0].content.parts", unread, reply, stop_reason)
    usage = _usage(getattr(response, "usage_metadata", None))
    return ProviderResponse(reply, stop_reason, usage, finish_reason=reason or None)


def _check_nesting(parts: list[Any]) -> None:
    """Refuse function call arguments nested past the engine's limit, before anything walks them recursively.

    Dumping the reply (for its digest, or to keep signed parts) and building
    the next request both recurse through the arguments; the engine would
    refuse them anyway, so they are refused here once, by name.
    """
    for i, part in enumerate(parts):
        args = getattr(getattr(part, "function_call", None), "args", None)
        if nests_deeper(args, MAX_NESTING):
            field = f"candidates[0].content.parts[{i}].functionCall.args"
            raise MalformedReplyError(field, f"nests deeper than {MAX_NESTING} levels")


_CARRIERS = {"thought", "thoughtSignature"}
"""Fields of a part that only mark or sign it: a part of nothing else carries a signature, not content."""


def _unread(part: Any, field: str) -> list[str]:
    """What a part without text or a function call holds, for the error if the reply holds nothing else."""
    held = [name for name in part.model_dump(by_alias=True, exclude_none=True) if name not in _CARRIERS]
    if held:
        return [f"{field} with {', '.join(held)}"]
    # The SDK drops the fields it does not know, so a part of a newer kind arrives empty.
    marked = getattr(part, "thought", None) or getattr(part, "thought_signature", None) is not None
    return [] if marked else [f"{field} with nothing the SDK could read"]


def answer_texts(chunk: Any) -> list[Any]:
    """A streamed chunk's pieces of answer text; thought parts are thinking, not answer, so they are left out."""
    texts = []
    for candidate in (getattr(chunk, "candidates", None) or [])[:1]:
        for part in getattr(getattr(candidate, "content", None), "parts", None) or []:
            if not getattr(part, "thought", None):
                texts.append(getattr(part, "text", None))
    return texts


def _last(values: Sequence[Any]) -> Any:
    return next((value for value in reversed(values) if value is not None), None)


def assembled(types: Any, chunks: Sequence[Any]) -> Any:
    """One ``GenerateContentResponse`` from a stream's chunks: every part in arrival order, the last finish and usage.

    Parts are not merged: a thought signature may come on a part of its own
    (an empty text), and the parts must go back as they came.
    """
    candidates = [chunk.candidates[0] for chunk in chunks if getattr(chunk, "candidates", None)]
    parts = [part for c in candidates for part in (getattr(c.content, "parts", None) or []) if c.content is not None]
    merged = []
    if candidates:
        merged = [
            types.Candidate(
                content=types.Content(role="model", parts=parts),
                finish_reason=_last([c.finish_reason for c in candidates]),
                finish_message=_last([c.finish_message for c in candidates]),
            )
        ]
    return types.GenerateContentResponse(
        candidates=merged,
        usage_metadata=_last([chunk.usage_metadata for chunk in chunks]),
        prompt_feedback=_last([chunk.prompt_feedback for chunk in chunks]),
        response_id=next((chunk.response_id for chunk in chunks if chunk.response_id), None),
    )
