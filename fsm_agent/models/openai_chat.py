"""The OpenAI Chat Completions adapter, for OpenAI and the OpenAI-compatible servers (Ollama, vLLM, llama.cpp).

Messages and tool schemas are converted to the Chat Completions wire format
and each response back to a :class:`~fsm_agent.records.ModelResponse`.  The
mapping of ``finish_reason`` onto the engine's ``stop_reason`` is the table
``OpenAIChatModel.finish_reasons``, at the top of the class with the
provider's other facts, so the README, the tests and the adapter read one table.
Retries of transient errors (429, 5xx, connection errors) are the SDK's own,
with its exponential backoff, bounded by ``max_retries``.  A typed agent's
answer schema is asked for with Structured Outputs, ``response_format``
of type ``json_schema`` (:func:`to_openai_response_format`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from fsm_agent import Message, ModelResponse, OutputSchema, ToolCall, Usage
from fsm_agent.models.adapter_side import StreamReader
from fsm_agent.models.openai_client import OpenAIClientModel
from fsm_agent.models.replies import (
    MalformedReplyError,
    ProviderResponse,
    check_body,
    decode_arguments,
    detail_count,
    encode_arguments,
    reply_items,
    reply_text,
    token_count,
    wire_safe,
)
from fsm_agent.tools import JSONSchema

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion


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
    # prompt_tokens counts the cached ones and completion_tokens the reasoning ones (the details break them down).
    return Usage(
        token_count(usage, "prompt_tokens"),
        token_count(usage, "completion_tokens"),
        cache_read_tokens=detail_count(usage, "prompt_tokens_details", "cached_tokens"),
        reasoning_tokens=detail_count(usage, "completion_tokens_details", "reasoning_tokens"),
    )


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
    stop_reason = OpenAIChatModel.finish_reasons.get(reason, str(finish_reason))
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

    reserved_params = ("model", "messages", "tools")
    request_method = ("openai.resources.chat.completions", "Completions.create")
    output_field = "response_format"
    finish_reasons: ClassVar[Mapping[str, str]] = {
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
    """

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
                raise self._output_clash(output)
            request["response_format"] = to_openai_response_format(output)
        return wire_safe(request)

    def parse(self, response: Any) -> ModelResponse:
        """The engine's view of one ``ChatCompletion``."""
        return from_openai_completion(response)

    def _send(self, client: Any, request: dict[str, Any]) -> Any:
        return client.chat.completions.create(**request)

    async def _asend(self, client: Any, request: dict[str, Any]) -> Any:
        return await client.chat.completions.create(**request)

    # Streamed as chunks, which the SDK's own accumulator adds up to the whole completion.
    def _open_stream(self, client: Any, request: dict[str, Any]) -> Any:
        return client.chat.completions.create(**_streamed(request))

    async def _aopen_stream(self, client: Any, request: dict[str, Any]) -> Any:
        return await client.chat.completions.create(**_streamed(request))

    def _stream_reader(self) -> StreamReader:
        return _Chunks()


def _streamed(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` streamed, with the usage in the stream unless the params ask otherwise.

    Without it a streamed reply carries no usage, and ``token_budget`` would count it as zero.
    """
    return {"stream_options": {"include_usage": True}, **request, "stream": True}


class _Chunks(StreamReader):
    """Chat Completions chunks, added up by the SDK's ``ChatCompletionStreamState``; content deltas handed on."""

    def __init__(self) -> None:
        from openai.lib.streaming.chat import ChatCompletionStreamState  # imported here: the SDK is optional

        self._state = ChatCompletionStreamState()
        self._read = False

    def read(self, event: Any) -> Iterable[Any]:
        self._read = True
        return [each.delta for each in self._state.handle_chunk(event) if each.type == "content.delta"]

    def response(self, stream: Any) -> Any:
        # Without a chunk the accumulator has no completion, and says so only with a bare AssertionError.
        if not self._read:
            raise MalformedReplyError("stream", "ended without any chat.completion.chunk")
        return self._state.current_completion_snapshot
