"""Streamed and unstreamed, one reply gives one record: each adapter over both wire forms of the same reply.

The recorded streams cover a few replies; here each recorded reply body is
written out as its provider's stream (Chat Completions chunks with a usage
chunk, Anthropic message events with thinking and signature deltas and
cumulative usage, Responses API events ending in ``response.completed``,
Gemini chunks) with usage breakdowns the recordings lack (cached and
reasoning tokens, cache writes), and the adapter's ``ModelResponse`` is
compared with the unstreamed one, on the sync and the async client.  The
text pieces handed on must add up to the reply's text.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from support.provider_server import ProviderServer, Reply, body

from fsm_agent import Message, ModelResponse
from fsm_agent.models import AnthropicModel, GeminiModel, OpenAIChatModel, OpenAIResponsesModel
from fsm_agent.models.provider import ProviderModel
from fsm_agent.testing import demo_registry

KEY = "sk-test-4f7c0d9e2b1a8c3f5e6d7a9b"
CONVERSATION = [Message("system", "Be brief."), Message("user", "What is (2+3)*4?")]


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _sse(events: list[dict[str, Any]], *, named: bool) -> str:
    lines = []
    for event in events:
        head = f"event: {event['type']}\n" if named else ""
        lines.append(f"{head}data: {json.dumps(event)}\n\n")
    return "".join(lines)


def openai_stream(completion: dict[str, Any]) -> str:
    """A Chat Completions body as the chunks the API streams: deltas, the finish, then the usage chunk."""
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"]}
    base["model"] = completion["model"]
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in _pieces(message.get("content") or "", 5)]
    chunks += [chunk({"refusal": piece}) for piece in _pieces(message.get("refusal") or "", 5)]
    for index, call in enumerate(message.get("tool_calls") or []):
        head = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**head, "function": {"name": call["function"]["name"], "arguments": ""}}]})
        )
        for piece in _pieces(call["function"]["arguments"], 4):
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if completion.get("usage") is not None:
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return _sse(chunks, named=False) + "data: [DONE]\n\n"


def anthropic_stream(message: dict[str, Any]) -> str:
    """A Messages API body as its events: blocks by deltas, the stop and the cumulative usage in message_delta."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            opened: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"], 6)]
        elif kind == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": piece} for piece in _pieces(block["thinking"], 9)]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            text = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in _pieces(text, 4)]
        else:
            opened = block
        events.append({"type": "content_block_start", "index": index, "content_block": opened})
        events += [{"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas]
        events.append({"type": "content_block_stop", "index": index})
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message.get("stop_sequence")}
    if message.get("stop_details") is not None:
        delta["stop_details"] = message["stop_details"]
    events.append({"type": "message_delta", "delta": delta, "usage": message["usage"]})
    events.append({"type": "message_stop"})
    return _sse(events, named=True)


def responses_stream(response: dict[str, Any]) -> str:
    """A Responses API body as its events: created, the text deltas of its messages, then the final event."""
    final = {"completed": "response.completed", "incomplete": "response.incomplete"}[response["status"]]
    created = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": created, "sequence_number": 0}]
    for index, item in enumerate(response["output"]):
        if item["type"] != "message":
            continue
        for part_index, part in enumerate(item["content"]):
            for piece in _pieces(part.get("text", ""), 5):
                events.append(
                    {
                        "type": "response.output_text.delta",
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": part_index,
                        "delta": piece,
                        "logprobs": [],
                        "sequence_number": len(events),
                    }
                )
    events.append({"type": final, "response": response, "sequence_number": len(events)})
    return _sse(events, named=True)


def gemini_stream(response: dict[str, Any]) -> str:
    """A Gemini body as one streamed chunk (how ``streamGenerateContent`` sends a short reply)."""
    return _sse([response], named=False)


def _openai(name: str) -> dict[str, Any]:
    data = copy.deepcopy(body("openai", name))
    if data.get("usage") is not None:
        data["usage"]["prompt_tokens_details"] = {"cached_tokens": 64, "audio_tokens": 0}
        data["usage"]["completion_tokens_details"] = {"reasoning_tokens": 11, "audio_tokens": 0}
    return data


def _anthropic(name: str) -> dict[str, Any]:
    data = copy.deepcopy(body("anthropic", name))
    data["usage"].update(cache_creation_input_tokens=30, cache_read_input_tokens=400)
    return data


def _responses(name: str) -> dict[str, Any]:
    data = copy.deepcopy(body("openai_responses", name))
    data["usage"]["input_tokens_details"] = {"cached_tokens": 96}
    return data


def _gemini(name: str) -> dict[str, Any]:
    data = copy.deepcopy(body("gemini", name))
    data["usageMetadata"]["cachedContentTokenCount"] = 40
    return data


Case = tuple[str, Callable[[str], ProviderModel], Callable[[str], dict[str, Any]], Callable[[dict[str, Any]], str]]

PROVIDERS: dict[str, Case] = {
    "openai": (
        "openai",
        lambda url: OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{url}/v1", max_retries=0),
        _openai,
        openai_stream,
    ),
    "anthropic": (
        "anthropic",
        lambda url: AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=url, max_retries=0),
        _anthropic,
        anthropic_stream,
    ),
    "openai_responses": (
        "openai_responses",
        lambda url: OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=f"{url}/v1", max_retries=0),
        _responses,
        responses_stream,
    ),
    "gemini": (
        "gemini",
        lambda url: GeminiModel("gemini-2.5-flash", api_key=f"AIza-{KEY}", base_url=url, max_retries=0),
        _gemini,
        gemini_stream,
    ),
}

REPLIES = {
    "openai": [
        "tool_call",
        "two_tool_calls",
        "final_answer",
        "truncated_answer",
        "truncated_tool_call",
        "refusal",
        "content_filter",
        "malformed_arguments",
    ],
    "anthropic": [
        "tool_use",
        "two_tool_uses",
        "final_answer",
        "thinking_tool_use",
        "thinking_second_tool",
        "thinking_final",
        "truncated_answer",
        "truncated_tool_use",
        "stop_sequence",
        "context_window",
        "refusal",
    ],
    "openai_responses": [
        "answer",
        "final_answer",
        "reasoning_call",
        "reasoning_second_call",
        "incomplete_max_output_tokens",
        "incomplete_content_filter",
        "refusal",
    ],
    "gemini": [
        "answer",
        "final_answer",
        "thought_call",
        "thought_second_call",
        "max_tokens",
        "safety",
        "malformed_call",
    ],
}
CASES = [(provider, name) for provider, names in REPLIES.items() for name in names]


def _both_ways(
    server: ProviderServer, provider: str, name: str, driver: str
) -> tuple[ModelResponse, ModelResponse, list[str]]:
    _, build, reply, stream = PROVIDERS[provider]
    data = reply(name)
    server.queue(data, Reply({}, sse=stream(data)))
    pieces: list[str] = []
    tools = demo_registry().schemas()
    model = build(server.url)
    if driver == "sync":
        with model:
            plain = model.complete(CONVERSATION, tools)
            streamed = model.complete_stream(CONVERSATION, tools, pieces.append)
        return plain, streamed, pieces

    async def calls() -> tuple[ModelResponse, ModelResponse]:
        async with model:
            plain = await model.acomplete(CONVERSATION, tools)
            streamed = await model.acomplete_stream(CONVERSATION, tools, pieces.append)
        return plain, streamed

    plain, streamed = asyncio.run(calls())
    return plain, streamed, pieces


def _subclasses(cls: type[ProviderModel]) -> set[type[ProviderModel]]:
    below = set(cls.__subclasses__())
    return below.union(*(_subclasses(sub) for sub in below))


def test_every_adapter_of_the_package_is_named_by_a_string_and_held_to_this_table() -> None:
    """A new ``ProviderModel`` is found here, not left untested: it must be in ``ADAPTERS`` and in ``PROVIDERS``.

    ``fsm_agent.models`` imports every adapter module, so every adapter class exists once it is imported.
    """
    from fsm_agent.models.named import ADAPTERS

    def ours(cls: type) -> bool:
        return cls.__module__.startswith("fsm_agent.models.")

    package = {  # the leaves: a base shared by two adapters (OpenAIClientModel) is no adapter itself
        cls  # (a test's own subclass of an adapter leaves it an adapter)
        for cls in _subclasses(ProviderModel)
        if ours(cls) and not any(ours(sub) for sub in cls.__subclasses__())
    }
    tabled = {type(build("http://127.0.0.1:9")) for _, build, _, _ in PROVIDERS.values()}
    assert set(ADAPTERS.values()) == package
    assert tabled == package


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize(("provider", "name"), CASES, ids=[f"{p}:{n}" for p, n in CASES])
def test_a_reply_streamed_gives_the_record_it_gives_unstreamed(
    provider_server: ProviderServer, provider: str, name: str, driver: str
) -> None:
    """Text, tool calls and ids, arguments, thinking, stop reason, finish signal and every usage count agree."""
    plain, streamed, pieces = _both_ways(provider_server, provider, name, driver)
    assert streamed == plain
    assert streamed.usage is not None
    if streamed.stop_reason != "refusal":
        assert "".join(pieces) == streamed.message.content
    # The streamed request carries the same system prompt, history and tool schemas; only the stream switch differs.
    unstreamed, streamed_request = provider_server.requests
    switches = ("stream", "stream_options")
    assert {k: v for k, v in streamed_request.json.items() if k not in switches} == unstreamed.json
    assert streamed_request.json.get("stream", True) is True


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_the_usage_breakdowns_arrive_streamed(provider_server: ProviderServer, provider: str) -> None:
    """Cached prompt tokens (and, where the provider reports them, reasoning tokens) survive the stream."""
    name = {"openai": "tool_call", "anthropic": "tool_use", "openai_responses": "reasoning_call"}.get(
        provider, "answer"
    )
    _, streamed, _ = _both_ways(provider_server, provider, name, "sync")
    usage = streamed.usage
    assert usage is not None
    expected_cached = {"openai": 64, "anthropic": 400, "openai_responses": 96, "gemini": 40}[provider]
    assert usage.cache_read_tokens == expected_cached
    if provider == "anthropic":
        assert usage.cache_write_tokens == 30
        assert usage.input_tokens == 410 + 30 + 400
    if provider == "openai":
        assert usage.reasoning_tokens == 11
    if provider == "openai_responses":
        assert usage.reasoning_tokens == 192
