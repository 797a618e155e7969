"""The OpenAI Chat Completions adapter, for OpenAI and the OpenAI-compatible servers (Ollama, vLLM, llama.cpp).

Messages and tool schemas are converted to the Chat Completions wire format
and each response back to a :class:`~fsm_agent.records.ModelResponse`.  The
mapping of ``finish_reason`` onto the engine's ``stop_reason`` is the table
``FINISH_REASONS``, so the README, the tests and the adapter read one table.
Retries of transient errors (429, 5xx, connection errors) are the SDK's own,
with its exponential backoff, bounded by ``max_retries``.  A typed agent's
answer schema is asked for with Structured Outputs, ``response_format``
of type ``json_schema`` (:func:`to_openai_response_format`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fsm_agent import Message, ModelResponse, OutputSchema, ToolCall, Usage
from fsm_agent.models.openai_client import OpenAIClientModel
from fsm_agent.models.provider import output_clash
from fsm_agent.models.replies import (
    MalformedReplyError,
    ProviderResponse,
    check_body,
    decode_arguments,
    encode_arguments,
    reply_items,
    reply_text,
    token_count,
    wire_safe,
)
from fsm_agent.tools import JSONSchema

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

FINISH_REASONS: dict[str, str] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    # The deprecated predecessor of tool_calls; never requested here, but older servers may still send it.
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}
"""OpenAI ``finish_reason`` -> engine ``stop_reason``.

Two refinements apply on top: ``stop`` with tool calls in the message becomes
``tool_use`` (some compatible servers report ``stop`` there), and a message
whose ``refusal`` field is set is a ``refusal`` whatever the finish reason.
Any other finish reason is passed on unchanged, so the engine stops the run
with ``model_error`` naming it (the reply kept) instead of taking an unknown
signal for an answer.
"""


def to_openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation as Chat Completions ``messages``."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role in ("system", "user"):
            out.append({"role": message.role, "content": message.content})
        elif message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                # The API wants null rather than "" next to tool calls.
                entry["content"] = message.content or None
                entry["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": encode_arguments(c)}}
                    for c in message.tool_calls
                ]
            out.append(entry)
        elif message.role == "tool":
            if message.tool_call_id is None:
                msg = "a tool message needs the tool_call_id of the call it answers"
                raise ValueError(msg)
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content})
        else:
            msg = f"unknown message role {message.role!r}; expected system, user, assistant or tool"
            raise ValueError(msg)
    return out


def to_openai_tools(schemas: list[JSONSchema]) -> list[dict[str, Any]]:
    """``ToolRegistry.schemas()`` as Chat Completions function tools."""
    return [
        {
            "type": "function",
            "function": {"name": s["name"], "description": s["description"], "parameters": s["parameters"]},
        }
        for s in schemas
    ]


def to_openai_response_format(output: OutputSchema) -> dict[str, Any]:
    """``output`` as a Chat Completions ``response_format`` (Structured Outputs: ``json_schema``).

    ``strict`` is the schema's own flag: strict decoding is asked for only
    when the schema meets its rules, since OpenAI refuses a strict schema
    that does not; the description goes along when there is one.
    """
    json_schema: dict[str, Any] = {"name": output.name, "schema": output.schema, "strict": output.strict}
    if output.description:
        json_schema["description"] = output.description
    return {"type": "json_schema", "json_schema": json_schema}


def _tool_call(call: Any, field: str) -> ToolCall:
    # Read by attribute rather than by SDK class: the class names changed between openai 1.x and 2.x.
    call_id = reply_text(getattr(call, "id", None), f"{field}.id")
    function = getattr(call, "function", None)
    if function is not None:
        name = reply_text(getattr(function, "name", None), f"{field}.function.name")
        arguments = reply_text(getattr(function, "arguments", None), f"{field}.function.arguments", nullable=True)
        return decode_arguments(call_id, name, arguments)
    custom = getattr(call, "custom", None)
    if custom is None:
        raise MalformedReplyError(field, "has neither a function nor a custom tool")
    name = reply_text(getattr(custom, "name", None), f"{field}.custom.name")
    raw = reply_text(getattr(custom, "input", None), f"{field}.custom.input")
    return ToolCall(call_id, name, {}, raw_arguments=raw)


def _usage(usage: Any) -> Usage | None:
    # No usage at all is allowed (compatible servers omit it); one that is there must be whole.
    if usage is None:
        return None
    return Usage(token_count(usage, "prompt_tokens"), token_count(usage, "completion_tokens"))


def from_openai_completion(completion: ChatCompletion) -> ModelResponse:
    """The engine's view of a Chat Completions response (its first choice); ``MalformedReplyError`` if it is junk."""
    check_body(completion)
    choices = reply_items(getattr(completion, "choices", None), "choices")
    if not choices:
        raise MalformedReplyError("choices", "is missing or empty")
    choice = choices[0]
    message = getattr(choice, "message", None)
    if message is None:
        # Read as a message, null would pass for an empty answer.
        raise MalformedReplyError("choices[0].message", "is missing or null")
    finish_reason = getattr(choice, "finish_reason", None)
    # An unknown value goes through unchanged: the engine stops on it with model_error and keeps the reply.
    reason = reply_text(finish_reason, "choices[0].finish_reason", nullable=True)
    stop_reason = FINISH_REASONS.get(reason, str(finish_reason))
    field = "choices[0].message"
    raw_calls = reply_items(getattr(message, "tool_calls", None), f"{field}.tool_calls")
    calls = tuple(_tool_call(call, f"{field}.tool_calls[{i}]") for i, call in enumerate(raw_calls))
    text = reply_text(getattr(message, "content", None), f"{field}.content", nullable=True)
    refusal = reply_text(getattr(message, "refusal", None), f"{field}.refusal", nullable=True)
    if refusal:
        stop_reason = "refusal"
        text = text or refusal
    elif stop_reason == "end_turn" and calls:
        stop_reason = "tool_use"
    usage = _usage(getattr(completion, "usage", None))
    return ProviderResponse(Message("assistant", text, calls), stop_reason, usage, finish_reason=reason or None)


def _stream_state() -> Any:
    from openai.lib.streaming.chat import ChatCompletionStreamState  # imported here: the SDK is optional

    return ChatCompletionStreamState()


def _hand_on(events: Any, on_text: Callable[[str], None]) -> None:
    for event in events:
        if event.type == "content.delta" and event.delta:
            on_text(event.delta)


class OpenAIChatModel(OpenAIClientModel):
    """A :class:`~fsm_agent.Model` over the official ``openai`` SDK's Chat Completions API.

    Client settings are :class:`~fsm_agent.models.openai_client.OpenAIClientModel`'s;
    point ``base_url`` at ``http://localhost:11434/v1`` for Ollama and the
    like.  ``params`` go into every request unchanged (``temperature``,
    ``max_completion_tokens``, ...).  Called with ``output=`` (a typed
    agent), the request asks for that schema natively with
    ``response_format={"type": "json_schema", ...}``, and the JSON answer
    comes back as the message's content; a ``response_format`` in
    ``params`` is then refused with ``ValueError``, since the request can
    carry only one (without ``output`` it is sent as given).  Whether a
    compatible server honours ``json_schema`` is up to it; the agent
    checks the answer either way.  How the key and ``base_url`` are checked
    and kept out of errors, and which replies are refused as malformed, is in
    :mod:`fsm_agent.models.redaction` and :mod:`fsm_agent.models.replies`.
    """

    _RESERVED = ("model", "messages", "tools")

    def build_request(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create``: model, messages, tools (if any), params, format."""
        request: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages)}
        if tools:
            # An empty tools list is rejected by the API; no tools means leaving the key out.
            request["tools"] = to_openai_tools(tools)
        request.update(self.params)
        if output is not None:
            if "response_format" in self.params:
                raise output_clash(type(self).__name__, ["response_format"], output, "response_format")
            request["response_format"] = to_openai_response_format(output)
        return wire_safe(request)

    def parse(self, response: Any) -> ModelResponse:
        """The engine's view of one ``ChatCompletion``."""
        return from_openai_completion(response)

    def _send(self, request: dict[str, Any]) -> Any:
        return self.client.chat.completions.create(**request)

    async def _asend(self, client: Any, request: dict[str, Any]) -> Any:
        return await client.chat.completions.create(**request)

    # --- streaming: the same request and reply, the text handed on as it arrives --------------------------

    def complete_stream(
        self,
        messages: Sequence[Message],
        tools: list[JSONSchema],
        on_text: Callable[[str], None],
        *,
        output: OutputSchema | None = None,
    ) -> ModelResponse:
        """``complete`` over a streamed response: ``on_text`` gets each piece of the reply's text as it arrives.

        The SDK's own accumulator (``ChatCompletionStreamState``) rebuilds the
        whole completion from the chunks and ``parse`` reads it as it reads an
        unstreamed one, so a cut, refused or tool-calling reply means the same.
        """

        def work() -> ModelResponse:
            state = _stream_state()
            with self.client.chat.completions.create(**self._stream_request(messages, tools, output)) as chunks:
                for chunk in chunks:
                    _hand_on(state.handle_chunk(chunk), on_text)
            return self.parse(state.current_completion_snapshot)

        return self._guarded(work)

    async def acomplete_stream(
        self,
        messages: Sequence[Message],
        tools: list[JSONSchema],
        on_text: Callable[[str], None],
        *,
        output: OutputSchema | None = None,
    ) -> ModelResponse:
        """``complete_stream`` over the SDK's async client, for the async driver."""

        async def work(client: Any) -> ModelResponse:
            state = _stream_state()
            request = self._stream_request(messages, tools, output)
            async with await client.chat.completions.create(**request) as chunks:
                async for chunk in chunks:
                    _hand_on(state.handle_chunk(chunk), on_text)
            return self.parse(state.current_completion_snapshot)

        return await self._aguarded(work)

    def _stream_request(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None
    ) -> dict[str, Any]:
        request = self.build_request(messages, tools, output)
        request["stream"] = True
        # Without it a streamed reply carries no usage, and token_budget would count it as zero.
        request.setdefault("stream_options", {"include_usage": True})
        return request
