"""Half an emoji (a lone surrogate) through each adapter: the record keeps it exactly, the wire gets valid UTF-8."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from support.provider_server import QUESTION, ProviderServer, body

from fsm_agent import Agent, Message, RunResult
from fsm_agent.models import AnthropicModel, GeminiModel, OpenAIChatModel, OpenAIResponsesModel
from fsm_agent.models.provider import ProviderModel
from fsm_agent.testing import demo_registry

HALF = "\ud83d"  # the first half of U+1F600, as a provider's JSON escape "\ud83d" decodes
TEXT = f"Echoing half a smile: {HALF}"
KEY = "sk-test-4f7c0d9e2b1a8c3f5e6d7a9b"
SURROGATE = re.compile("[\ud800-\udfff]")


def _openai(text: str, arguments: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(body("openai", "tool_call"))
    message = data["choices"][0]["message"]
    message["content"] = text
    message["tool_calls"][0]["function"] = {"name": "echo", "arguments": json.dumps(arguments)}
    return data


def _responses(text: str, arguments: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(body("openai_responses", "answer"))
    data["output"][0]["content"][0]["text"] = text
    call = {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1", "name": "echo"}
    data["output"].append({**call, "arguments": json.dumps(arguments)})
    return data


def _anthropic(text: str, arguments: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(body("anthropic", "tool_use"))
    data["content"] = [
        {"type": "text", "text": text},
        {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": arguments},
    ]
    return data


def _gemini(text: str, arguments: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(body("gemini", "answer"))
    parts = [{"text": text}, {"functionCall": {"id": "call-1", "name": "echo", "args": arguments}}]
    data["candidates"][0]["content"]["parts"] = parts
    return data


@dataclass(frozen=True)
class Adapter:
    """One adapter: how to build it for the loopback server, its tool turn, and the name of its answer body."""

    name: str
    build: Callable[[str], ProviderModel]
    tool_turn: Callable[[str, dict[str, Any]], dict[str, Any]]
    answer: str


ADAPTERS = [
    Adapter(
        "openai",
        lambda url: OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{url}/v1"),
        _openai,
        "final_answer",
    ),
    Adapter(
        "openai_responses",
        lambda url: OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=f"{url}/v1"),
        _responses,
        "answer",
    ),
    Adapter(
        "anthropic",
        lambda url: AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=url),
        _anthropic,
        "final_answer",
    ),
    Adapter(
        "gemini",
        lambda url: GeminiModel("gemini-2.5-flash", api_key=f"AIza-{KEY}", base_url=url),
        _gemini,
        "answer",
    ),
]


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda adapter: adapter.name)
def test_a_lone_surrogate_in_text_arguments_and_tool_output_is_kept_exactly_and_sent_as_u_fffd(
    provider_server: ProviderServer, adapter: Adapter
) -> None:
    """The run goes on past the reply: its record keeps the surrogate, the next request carries U+FFFD for it."""
    provider_server.queue(adapter.tool_turn(TEXT, {"text": HALF}), body(adapter.name, adapter.answer))
    with adapter.build(provider_server.url) as model:
        result = Agent(model, demo_registry()).run(QUESTION)
    assert result.ok
    reply, output = result.messages[1], result.messages[2]
    assert reply.content == TEXT
    assert reply.tool_calls[0].arguments == {"text": HALF}
    assert HALF in output.content
    sent = json.dumps(provider_server.requests[1].json, ensure_ascii=False)
    assert SURROGATE.search(sent) is None
    assert sent.count("\ufffd") == 3  # the reply's text, the call's arguments and the tool's output


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda adapter: adapter.name)
def test_a_surrogate_pair_split_in_two_code_points_goes_out_as_the_character_it_encodes(
    provider_server: ProviderServer, adapter: Adapter
) -> None:
    """Two halves that do make a pair (as Python text can hold them) are joined on the wire, not replaced."""
    provider_server.queue(body(adapter.name, adapter.answer))
    with adapter.build(provider_server.url) as model:
        model.complete([Message("user", "\ud83d\ude00")], [])
    sent = json.dumps(provider_server.requests[0].json, ensure_ascii=False)
    assert "\U0001f600" in sent
    assert "\ufffd" not in sent


def test_run_result_to_json_is_text_utf_8_can_carry_and_reads_back_exactly() -> None:
    """A lone surrogate in the result becomes a JSON escape, so the text encodes; from_json gives the same result."""
    result = RunResult(messages=(), steps=(), final=TEXT, evidence={"note": HALF})
    text = result.to_json(indent=2)
    assert text.encode("utf-8")
    assert "\\ud83d" in text
    assert RunResult.from_json(text) == result
    assert "é" in RunResult((), (), "café").to_json()  # other text stays readable, not escaped
