"""The OpenAI Responses API adapter over the official ``openai`` SDK, with reasoning items round-tripped.

The Responses API is a list of items both ways: system messages become
``instructions``, user and assistant text become message items, tool calls
and results become ``function_call`` / ``function_call_output`` items paired
by ``call_id``.  A reasoning model's reply holds ``reasoning`` items that must
come back with the function calls they precede, or the API answers 400
("... was provided without its required 'reasoning' item"); the adapter keeps
such a reply's output items as they arrived (``ProviderData``) and sends them
back verbatim.  Requests default to ``store=False``: the run's snapshot holds
the whole conversation, so nothing has to be kept at OpenAI, and the
reasoning then travels encrypted (``include=["reasoning.encrypted_content"]``
is added).  The mapping of ``status`` onto the engine's ``stop_reason`` is
``OpenAIResponsesModel.finish_reasons`` plus the rules in :func:`from_response`.  Retries of
transient errors are the SDK's own, bounded by ``max_retries``.  A typed
agent's answer schema is asked for with Structured Outputs, a ``json_schema``
format in the ``text`` parameter (:func:`to_responses_format`).  The
context-length error (code ``context_length_exceeded``) is a
:class:`~fsm_agent.ContextOverflowError` in each of the forms it arrives in:
a 400, an ``error`` event in a stream, or a ``failed`` response whose
``error`` carries that code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from fsm_agent import Message, ModelResponse, OutputSchema, ProviderData, ToolCall, Usage
from fsm_agent.models.adapter_side import StreamReader
from fsm_agent.models.openai_client import OpenAIClientModel, context_overflow
from fsm_agent.models.replies import (
    MalformedReplyError,
    ProviderResponse,
    check_body,
    check_read,
    decode_arguments,
    detail_count,
    encode_arguments,
    renamed_calls,
    reply_items,
    reply_text,
    token_count,
    wire_safe,
)
from fsm_agent.tools import JSONSchema

PROVIDER = "openai-responses"
"""``ProviderData.provider`` of the replies whose output items this adapter sends back verbatim."""

ENCRYPTED_REASONING = "reasoning.encrypted_content"


def to_responses_input(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """The conversation as the Responses API's ``instructions`` text and ``input`` items."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            instructions.append(message.content)
        elif message.role == "user":
            items.append({"role": "user", "content": message.content})
        elif message.role == "assistant":
            data = message.provider_data
            if data is not None and data.provider == PROVIDER:
                # Reasoning items must come back unchanged, each before the items it led to; only the
                # function calls' call_id follow the engine's renames of reused ids.
                kept = data.items()
                calls = [item for item in kept if item.get("type") == "function_call"]
                renamed_calls(calls, "call_id", message.tool_calls)
                items.extend(kept)
                continue
            if message.content:
                items.append({"role": "assistant", "content": message.content})
            items.extend(
                {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": encode_arguments(c)}
                for c in message.tool_calls
            )
        elif message.role == "tool":
            if message.tool_call_id is None:
                msg = "a tool message needs the tool_call_id of the call it answers"
                raise ValueError(msg)
            items.append({"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content})
        else:
            msg = f"unknown message role {message.role!r}; expected system, user, assistant or tool"
            raise ValueError(msg)
    return "\n\n".join(instructions), items


def to_responses_tools(schemas: list[JSONSchema]) -> list[dict[str, Any]]:
    """``ToolRegistry.schemas()`` as Responses API function tools.

    ``strict`` is off: strict mode wants every property required, and a tool
    parameter with a default is optional.
    """
    return [
        {
            "type": "function",
            "name": s["name"],
            "description": s["description"],
            "parameters": s["parameters"],
            "strict": False,
        }
        for s in schemas
    ]


def to_responses_format(output: OutputSchema) -> dict[str, Any]:
    """``output`` as the Responses API's ``text.format`` (Structured Outputs: ``json_schema``).

    The fields sit flat in the format (not under ``json_schema`` as in Chat
    Completions); ``strict`` is the schema's own flag, and the description
    goes along when there is one.
    """
    text_format: dict[str, Any] = {
        "type": "json_schema",
        "name": output.name,
        "schema": output.schema,
        "strict": output.strict,
    }
    if output.description:
        text_format["description"] = output.description
    return text_format


def _usage(usage: Any) -> Usage | None:
    # output_tokens already includes the reasoning tokens (output_tokens_details is a breakdown of it).
    if usage is None:
        return None
    return Usage(
        token_count(usage, "input_tokens"),
        token_count(usage, "output_tokens"),
        cache_read_tokens=detail_count(usage, "input_tokens_details", "cached_tokens"),
        reasoning_tokens=detail_count(usage, "output_tokens_details", "reasoning_tokens"),
    )


def _stop_reason(response: Any, has_calls: bool) -> tuple[str, str | None]:
    """The engine's stop reason, and the provider's own: the status, or why it is incomplete."""
    status = reply_text(getattr(response, "status", None), "status", nullable=True)
    if status == "completed":
        return ("tool_use" if has_calls else "end_turn"), status
    if status == "incomplete":
        details = getattr(response, "incomplete_details", None)
        reason = reply_text(getattr(details, "reason", None), "incomplete_details.reason", nullable=True)
        stop_reason = OpenAIResponsesModel.finish_reasons.get(reason, f"incomplete: {reason or 'no reason given'}")
        return stop_reason, reason or status
    return status or "no status", status or None


def _overflowed(response: Any) -> None:
    """Raise ``ContextOverflowError`` for a ``failed`` response whose error is the context-length one.

    The Responses API may report it in-band, as a ``response.failed`` stream
    event (the response's ``error``: ``{"code": "context_length_exceeded",
    "message": "Your input exceeds the context window of this model. ..."}``)
    rather than as a 400; no SDK exception exists then, so it has no cause.
    Any other failed response goes on to be a ``model_error`` naming ``failed``.
    """
    if getattr(response, "status", None) != "failed":
        return
    error = getattr(response, "error", None)
    overflow = context_overflow(getattr(error, "code", None), getattr(error, "message", None))
    if overflow is not None:
        raise overflow


def from_response(response: Any) -> ModelResponse:
    """The engine's view of a Responses API response; ``MalformedReplyError`` if it is junk.

    ``output_text`` parts are the text, ``function_call`` items the tool
    calls; other items (built-in tools) are not part of the engine's
    conversation.  A reply with ``reasoning`` items keeps all its output
    items, in order and as received, as ``provider_data``; their summaries
    are its readable ``thinking``, never the answer.  A refusal part makes
    the reply a refusal, with the refusal as its text if it has none.
    """
    check_body(response)
    _overflowed(response)
    texts: list[str] = []
    refusals: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    unread: list[str] = []
    items = reply_items(getattr(response, "output", None), "output")
    for i, item in enumerate(items):
        kind = getattr(item, "type", None)
        if kind == "reasoning":
            for j, part in enumerate(reply_items(getattr(item, "summary", None), f"output[{i}].summary")):
                thoughts.append(reply_text(getattr(part, "text", None), f"output[{i}].summary[{j}].text"))
        elif kind == "message":
            for j, part in enumerate(reply_items(getattr(item, "content", None), f"output[{i}].content")):
                field = f"output[{i}].content[{j}]"
                part_kind = getattr(part, "type", None)
                if part_kind == "output_text":
                    texts.append(reply_text(getattr(part, "text", None), f"{field}.text"))
                elif part_kind == "refusal":
                    refusals.append(reply_text(getattr(part, "refusal", None), f"{field}.refusal"))
                else:
                    unread.append(f"{field} of type {part_kind!r}")
        elif kind == "function_call":
            call_id = reply_text(getattr(item, "call_id", None), f"output[{i}].call_id")
            name = reply_text(getattr(item, "name", None), f"output[{i}].name")
            arguments = reply_text(getattr(item, "arguments", None), f"output[{i}].arguments", nullable=True)
            calls.append(decode_arguments(call_id, name, arguments))
        else:
            unread.append(f"output[{i}] of type {kind!r}")
    stop_reason, finish_reason = _stop_reason(response, bool(calls))
    text = "".join(texts)
    if refusals:
        stop_reason = "refusal"
        text = text or "".join(refusals)
    kept = None
    if any(getattr(item, "type", None) == "reasoning" for item in items):
        # to_dict keeps exactly the fields the JSON had; output items are valid input items as they are.
        payload = json.dumps([item.to_dict(mode="json") for item in items], ensure_ascii=False)
        kept = ProviderData(PROVIDER, payload, "\n\n".join(thoughts))
    reply = Message("assistant", text, calls, provider_data=kept)
    check_read("output", unread, reply, stop_reason)
    usage = _usage(getattr(response, "usage", None))
    return ProviderResponse(reply, stop_reason, usage, finish_reason=finish_reason)


class OpenAIResponsesModel(OpenAIClientModel):
    """A :class:`~fsm_agent.Model` over the official ``openai`` SDK's Responses API.

    Client settings are :class:`~fsm_agent.models.openai_client.OpenAIClientModel`'s
    (``api_key`` or ``OPENAI_API_KEY``, ``base_url`` or ``OPENAI_BASE_URL``,
    ``max_retries`` default 2, ``timeout``; a ``client`` or ``async_client``
    passed in is used as configured and never closed here).  ``params`` go
    into every request unchanged (``reasoning={"effort": "low"}``,
    ``max_output_tokens``, ...); ``store`` defaults to ``False``, and with
    ``store=False`` the encrypted reasoning is requested so it can be sent
    back.  Called with ``output=`` (a typed agent), the request asks for that
    schema natively with ``text={"format": {"type": "json_schema", ...}}``,
    merged into a ``text`` param (``{"verbosity": "low"}`` stays); a
    ``text`` param that sets a ``format`` of its own, or is not a dict, is
    then refused with ``ValueError``.  The JSON answer comes back as the
    reply's text.  Without the ``openai`` package this raises
    ``ImportError`` saying how to install it.
    """

    reserved_params = ("model", "input", "tools", "instructions")
    request_method = ("openai.resources.responses", "Responses.create")
    output_field = "text.format"
    finish_reasons: ClassVar[Mapping[str, str]] = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}
    """``incomplete_details.reason`` of a response with ``status == "incomplete"`` -> engine ``stop_reason``.

    A ``completed`` response is ``end_turn``, or ``tool_use`` when it holds
    function calls; a ``refusal`` content part makes it ``refusal`` whatever the
    status.  Any other status (``failed``, ``cancelled``, ``in_progress``, ...)
    or incomplete reason is passed on, as ``incomplete: <reason>`` for the latter.
    """

    @staticmethod
    def _request_params(params: dict[str, Any]) -> dict[str, Any]:
        """``store=False`` unless given, and then the encrypted reasoning asked for, so it can be sent back."""
        params = {"store": False, **params}
        if params["store"] is False:
            include = list(params.get("include") or [])
            params["include"] = include if ENCRYPTED_REASONING in include else [*include, ENCRYPTED_REASONING]
        return params

    def build_request(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> dict[str, Any]:
        """The keyword arguments of ``responses.create``: model, instructions (if any), input, tools, params, text."""
        instructions, items = to_responses_input(messages)
        request: dict[str, Any] = {"model": self.model, "input": items}
        if instructions:
            request["instructions"] = instructions
        if tools:
            request["tools"] = to_responses_tools(tools)
        request.update(self.params)
        if output is not None:
            text = request.get("text") or {}
            if not isinstance(text, dict) or "format" in text:
                raise self._output_clash(output)
            # A new dict: the params' own text dict is sent again, unchanged, by the next untyped call.
            request["text"] = {**text, "format": to_responses_format(output)}
        return wire_safe(request)

    def parse(self, response: Any) -> ModelResponse:
        """The engine's view of one Responses API ``Response``."""
        return from_response(response)

    def _send(self, client: Any, request: dict[str, Any]) -> Any:
        return client.responses.create(**request)

    async def _asend(self, client: Any, request: dict[str, Any]) -> Any:
        return await client.responses.create(**request)

    # Streamed as events, the last of which (completed, incomplete or failed) carries the whole response.
    def _open_stream(self, client: Any, request: dict[str, Any]) -> Any:
        return client.responses.create(**request, stream=True)

    async def _aopen_stream(self, client: Any, request: dict[str, Any]) -> Any:
        return await client.responses.create(**request, stream=True)

    def _stream_reader(self) -> StreamReader:
        return _ResponseEvents(self._sdk)


_FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


class _ResponseEvents(StreamReader):
    """Responses API stream events: text deltas handed on, the whole response (reasoning items too) from the last."""

    def __init__(self, sdk: Any) -> None:
        self._sdk = sdk
        self._final: Any = None
        self._error: dict[str, Any] | None = None

    def read(self, event: Any) -> Iterable[Any]:
        """A text delta's text; an ``error`` event is the stream's end, a model error (see ``response``).

        That event's documented shape is flat (``{"type": "error", "code": ...,
        "message": ..., "param": ...}``); one that nests an ``error`` object the
        SDK raises itself, as ``APIError``.  With the context-length code it
        raises ``ContextOverflowError`` here; any other is kept, and nothing
        the stream sends after it counts.
        """
        if self._error is not None:
            return ()
        kind = getattr(event, "type", None)
        if kind == "error":
            code, message = getattr(event, "code", None), getattr(event, "message", None)
            overflow = context_overflow(code, message)
            if overflow is not None:
                raise overflow
            self._error = {"code": code, "message": message, "param": getattr(event, "param", None)}
        elif kind == "response.output_text.delta":
            return (getattr(event, "delta", None),)
        elif kind in _FINAL_EVENTS:
            self._final = event.response
        return ()

    def response(self, stream: Any) -> Any:
        """The final event's response; after an ``error`` event, the SDK's ``APIError`` with its code and message.

        As the SDK raises the nested form: the same exception type, the
        provider's message as its text and the event's fields as its ``body``
        (so ``code`` and ``param``).  It came inside a 200 stream, after the
        SDK's retries of the request, so it is not retried, as that one is not.
        """
        if self._error is not None:
            message = self._error["message"]
            if not isinstance(message, str) or not message:
                message = "An error occurred during streaming"
            raise self._sdk.APIError(message, stream.response.request, body=self._error)
        if self._final is None:
            raise MalformedReplyError("stream", f"ended without any of {', '.join(_FINAL_EVENTS)}")
        return self._final
