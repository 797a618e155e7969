"""The Anthropic Messages adapter over the official ``anthropic`` SDK.

System messages go into the ``system`` parameter, tool calls and results
become ``tool_use`` / ``tool_result`` content blocks (a failed result carries
``is_error``), and consecutive tool results share one user turn, as the API
expects.  The provider's facts (how ``stop_reason`` maps onto the engine's,
which 400 is a context overflow, ...) sit at the top of
:class:`AnthropicModel`.  Retries of transient errors (429, 529 overloaded,
5xx, connection errors) are the SDK's own, bounded by ``max_retries``.  A typed
agent's answer schema is asked for with structured outputs (JSON outputs,
``output_config.format``), the schema adapted to Claude's rules by
:func:`to_claude_schema`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from fsm_agent import Message, ModelResponse, OutputSchema, ProviderData, ToolCall, Usage
from fsm_agent.models.adapter_side import StreamReader
from fsm_agent.models.anthropic_schema import to_anthropic_output
from fsm_agent.models.provider import ProviderModel
from fsm_agent.models.replies import (
    MalformedReplyError,
    ProviderResponse,
    check_body,
    check_read,
    decoded_input,
    renamed_calls,
    reply_items,
    reply_text,
    token_count,
    tool_failed,
    wire_safe,
)
from fsm_agent.tools import JSONSchema

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message as AnthropicMessage

DEFAULT_MAX_TOKENS = 4096

PROVIDER = "anthropic"
"""``ProviderData.provider`` of the replies this adapter keeps thinking blocks for."""

_THINKING = {"thinking": ("thinking", "signature"), "redacted_thinking": ("data",)}
"""The opaque block types and their string fields, which the API verifies when they come back."""


def _append(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    # Consecutive messages of one role become one turn: the API wants user and assistant turns to alternate.
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": blocks})


def _assistant_blocks(message: Message) -> list[dict[str, Any]]:
    """An assistant message's content blocks: the reply's own blocks, verbatim, when it carried thinking.

    With extended thinking on, the API wants each assistant turn's
    ``thinking`` and ``redacted_thinking`` blocks back unchanged (signature
    included) and in their place, before the text and tool uses they led to;
    rebuilding the turn from the text and calls would drop them.  Only the
    ``tool_use`` ids follow the engine's renames (:func:`renamed_calls`).
    """
    data = message.provider_data
    if data is not None and data.provider == PROVIDER:
        kept = data.items()
        renamed_calls([block for block in kept if block.get("type") == "tool_use"], "id", message.tool_calls)
        return kept
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    blocks.extend(
        {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments} for call in message.tool_calls
    )
    return blocks


def to_anthropic_messages(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """The conversation as the Messages API's ``system`` text and ``messages`` turns of content blocks."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            system.append(message.content)
        elif message.role == "user":
            _append(turns, "user", [{"type": "text", "text": message.content}])
        elif message.role == "assistant":
            blocks = _assistant_blocks(message)
            # The API rejects empty content; an empty assistant message carries nothing to send.
            if blocks:
                _append(turns, "assistant", blocks)
        elif message.role == "tool":
            if message.tool_call_id is None:
                msg = "a tool message needs the tool_call_id of the call it answers"
                raise ValueError(msg)
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
            block["content"] = message.content
            if tool_failed(message):
                block["is_error"] = True
            _append(turns, "user", [block])
        else:
            msg = f"unknown message role {message.role!r}; expected system, user, assistant or tool"
            raise ValueError(msg)
    return "\n\n".join(system), turns


def to_anthropic_tools(schemas: list[JSONSchema]) -> list[dict[str, Any]]:
    """``ToolRegistry.schemas()`` as Messages API client tools."""
    return [{"name": s["name"], "description": s["description"], "input_schema": s["parameters"]} for s in schemas]


# Claude's structured outputs take a subset of JSON Schema ("JSON Schema limitations" in
# https://platform.claude.com/docs/en/build-with-claude/structured-outputs): each object must set
# additionalProperties to false, and some keywords are refused with a 400.
def _usage(usage: Any) -> Usage | None:
    # No usage at all counts as zero, as for OpenAI; one that is there must be whole.
    if usage is None:
        return None
    # Cached prompt tokens are billed and processed like input, and OpenAI's prompt_tokens counts them too.
    written = token_count(usage, "cache_creation_input_tokens", optional=True)
    read = token_count(usage, "cache_read_input_tokens", optional=True)
    input_tokens = token_count(usage, "input_tokens") + written + read
    return Usage(input_tokens, token_count(usage, "output_tokens"), cache_read_tokens=read, cache_write_tokens=written)


def from_anthropic_message(message: AnthropicMessage) -> ModelResponse:
    """The engine's view of a Messages API response; ``MalformedReplyError`` if it is junk.

    Text blocks are joined; ``tool_use`` blocks become tool calls; server
    tool blocks are not part of the engine's conversation and are dropped.
    A reply with ``thinking`` or ``redacted_thinking`` blocks keeps all its
    blocks, in order and as received, as ``provider_data`` (the thinking
    text readable there, never in the answer), so the next request can send
    them back.  A refusal without text gets the provider's explanation as
    its text, so the user sees why.
    """
    check_body(message)
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    unread: list[str] = []
    blocks = reply_items(getattr(message, "content", None), "content")
    for i, block in enumerate(blocks):
        kind = getattr(block, "type", None)
        if kind in _THINKING:
            fields = [reply_text(getattr(block, name, None), f"content[{i}].{name}") for name in _THINKING[kind]]
            if kind == "thinking":
                thoughts.append(fields[0])
        elif kind == "text":
            texts.append(reply_text(getattr(block, "text", None), f"content[{i}].text"))
        elif kind == "tool_use":
            call_id = reply_text(getattr(block, "id", None), f"content[{i}].id")
            name = reply_text(getattr(block, "name", None), f"content[{i}].name")
            calls.append(decoded_input(call_id, name, getattr(block, "input", None)))
        else:
            unread.append(f"content[{i}] of type {kind!r}")
    # An unknown value goes through unchanged: the engine stops on it with model_error and keeps the reply.
    raw = getattr(message, "stop_reason", None)
    reason = reply_text(raw, "stop_reason", nullable=True)
    stop_reason = AnthropicModel.finish_reasons.get(reason, str(raw))
    text = "".join(texts)
    details = getattr(message, "stop_details", None)
    if stop_reason == "refusal" and not text and details is not None:
        text = reply_text(getattr(details, "explanation", None), "stop_details.explanation", nullable=True)
    kept = None
    if any(getattr(block, "type", None) in _THINKING for block in blocks):
        # to_dict keeps exactly the fields the JSON had, under their wire names.
        payload = json.dumps([block.to_dict(mode="json") for block in blocks], ensure_ascii=False)
        kept = ProviderData(PROVIDER, payload, "\n\n".join(thoughts))
    reply = Message("assistant", text, calls, provider_data=kept)
    check_read("content", unread, reply, stop_reason)
    usage = _usage(getattr(message, "usage", None))
    return ProviderResponse(reply, stop_reason, usage, finish_reason=reason or None)


class AnthropicModel(ProviderModel):
    """A :class:`~fsm_agent.Model` over the official ``anthropic`` SDK's Messages API.

    Without ``client`` one is built from ``api_key`` (default: the
    ``ANTHROPIC_API_KEY`` environment variable), ``base_url``, ``max_retries``
    (default 2, the SDK's: 429, 529, 5xx and connection errors are retried
    with exponential backoff) and ``timeout`` (seconds, default the SDK's).
    A ``client`` you pass is used as configured and never closed here;
    ``async_client`` likewise, else ``acomplete`` builds one with the sync
    client's settings.  ``max_tokens`` is required by the API and defaults to
    4096 (above about 21,000 the SDK refuses non-streaming calls unless a
    ``timeout`` is given); ``params`` go into every request unchanged (``temperature``, ...).
    Called with ``output=`` (a typed agent), the request asks for that
    schema natively with structured outputs,
    ``output_config={"format": {"type": "json_schema", "schema": ...}}``
    (the schema adapted by :func:`to_claude_schema`), merged into an
    ``output_config`` param (``{"effort": "low"}`` stays); one that sets a
    ``format`` of its own, or is not a dict, is then refused with
    ``ValueError``.  The JSON answer arrives as an ordinary text block; it
    combines with tools and with extended thinking, which the format does
    not constrain.  Without the ``anthropic`` package this raises
    ``ImportError`` saying how to install it.  How the key and ``base_url`` are checked and kept out of
    errors, and which replies are refused as malformed, is in
    :mod:`fsm_agent.models.redaction` and :mod:`fsm_agent.models.replies`.
    """

    sdk_package = "anthropic"
    sdk_extra = "anthropic"
    credentials: ClassVar[Mapping[str, str]] = {"api_key": "ANTHROPIC_API_KEY", "auth_token": "ANTHROPIC_AUTH_TOKEN"}
    base_url_variable = "ANTHROPIC_BASE_URL"
    reserved_params = ("model", "messages", "tools", "system", "max_tokens")
    request_method = ("anthropic.resources.messages", "Messages.create")
    output_field = "output_config.format"
    finish_reasons: ClassVar[Mapping[str, str]] = {
        "end_turn": "end_turn",
        "tool_use": "tool_use",
        "stop_sequence": "stop_sequence",
        "max_tokens": "max_tokens",
        "model_context_window_exceeded": "max_tokens",
        # A server tool's loop (web search, code execution) paused mid-turn: the reply is unfinished.
        "pause_turn": "max_tokens",
        "refusal": "refusal",
    }
    """Anthropic ``stop_reason`` -> engine ``stop_reason``.

    ``pause_turn`` maps to ``max_tokens``: it means the turn is incomplete (a
    server-side tool loop hit its iteration limit) and must not be taken for an
    answer, so the run stops at ``CheckTruncation`` with the partial text kept.
    Resuming it would need the server-tool blocks sent back verbatim, which this
    adapter does not keep; it offers only the registry's client tools, so a
    pause can only come from server tools added through ``params``.  A refusal
    without text gets the provider's explanation (``stop_details``) as its text.
    """
    # The 400s of an input too long for the window: "prompt is too long: 208310 tokens > 200000 maximum", and
    # "input length and `max_tokens` exceed context limit: 178959 + 64000 > 200000, ..." (no room left for max_tokens).
    overflow_pattern = (
        r"^(?:prompt is too long|input length and \S+ exceed context limit): (\d+)(?: tokens)? (?:\+ \d+ )?> (\d+)"
    )

    client: anthropic.Anthropic

    def __init__(
        self,
        model: str,
        client: anthropic.Anthropic | None = None,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        async_client: anthropic.AsyncAnthropic | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        **params: Any,
    ) -> None:
        sdk = self._load_sdk(params)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            msg = f"max_tokens must be an integer >= 1, got {max_tokens!r}"
            raise ValueError(msg)
        super().__init__(
            sdk, client, async_client, api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout
        )
        self.model = model
        self.max_tokens = max_tokens
        self.params = params

    def build_request(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> dict[str, Any]:
        """The keyword arguments of ``messages.create``: model, max_tokens, system, messages, tools, params, format."""
        system, turns = to_anthropic_messages(messages)
        request: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": turns}
        if system:
            request["system"] = system
        if tools:
            request["tools"] = to_anthropic_tools(tools)
        request.update(self.params)
        if output is not None:
            config = request.get("output_config") or {}
            if not isinstance(config, dict) or config.get("format") is not None:
                raise self._output_clash(output)
            # A new dict: the params' own output_config is sent again, unchanged, by the next untyped call.
            request["output_config"] = {**config, "format": to_anthropic_output(output)}
        return wire_safe(request)

    def parse(self, response: Any) -> ModelResponse:
        """The engine's view of one Messages API ``Message``."""
        return from_anthropic_message(response)

    def _send(self, client: Any, request: dict[str, Any]) -> Any:
        return client.messages.create(**request)

    async def _asend(self, client: Any, request: dict[str, Any]) -> Any:
        return await client.messages.create(**request)

    # Streamed through the SDK's messages.stream, which adds the events up to the final Message itself.
    def _open_stream(self, client: Any, request: dict[str, Any]) -> Any:
        return client.messages.stream(**request)

    async def _aopen_stream(self, client: Any, request: dict[str, Any]) -> Any:
        return client.messages.stream(**request)

    def _stream_reader(self) -> StreamReader:
        return _MessageEvents()

    def _invalid_request(self, exc: Exception) -> Any:
        """The message of a 400 ``invalid_request_error`` (a reply cut at the window is no error)."""
        body = exc.body if isinstance(exc, self._sdk.BadRequestError) else None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and error.get("type") == "invalid_request_error":
            return error.get("message")
        return None

    def _new_client(self, options: dict[str, Any]) -> Any:
        # The SDK builds a client without a key and refuses only the first request: refused here instead.
        if not (options.get("api_key") or options.get("auth_token") or self._headers):
            msg = "AnthropicModel has no key: set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN), or pass api_key=..."
            raise ValueError(msg)
        return self._sdk.Anthropic(**options)

    def _new_async_client(self) -> Any:
        client = self.client
        return self._sdk.AsyncAnthropic(
            api_key=client.api_key,
            auth_token=client.auth_token,
            base_url=client.base_url,
            max_retries=client.max_retries,
            timeout=client.timeout,
            default_headers=self._headers or None,
        )


class _MessageEvents(StreamReader):
    """The events of the SDK's ``MessageStream``: text deltas handed on, the final ``Message`` the stream's own."""

    def __init__(self) -> None:
        self._started = False

    def read(self, event: Any) -> Iterable[Any]:
        # The SDK's stream raises on any event before message_start, so one read means the message has begun.
        self._started = True
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            return (event.delta.text,)
        return ()

    def response(self, stream: Any) -> Any:
        # Without an event the SDK's snapshot is unset, and says so only with a bare AssertionError.
        if not self._started:
            raise MalformedReplyError("stream", "ended without a message_start event")
        return stream.current_message_snapshot
