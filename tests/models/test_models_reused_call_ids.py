"""Call ids a provider reuses, as each adapter sends the renamed calls back (docs/concepts/exactly-once.md).

The engine renames a tool call whose id the conversation already holds
(``call_0`` becomes ``call_0-2``), "in the history the model is sent back
too", so each tool result answers its own call.  These tests run each
adapter over the loopback provider server with two tool turns that use the
same call id, and check the request after them: every result's id must name
exactly one call of the assistant turn before it, as every provider
requires.  Replies kept verbatim as ``provider_data`` (thinking blocks,
reasoning items, signed parts) are where the renamed id has to reach too.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from support.provider_server import QUESTION, ProviderServer, body

from fsm_agent import Agent, RunResult
from fsm_agent.models import AnthropicModel, GeminiModel, OpenAIChatModel, OpenAIResponsesModel
from fsm_agent.models.provider import ProviderModel
from fsm_agent.testing import demo_registry

KEY = "sk-test-4f7c0d9e2b1a8c3f5e6d7a9b"
DRIVERS = ["sync", "async"]


def _run(model: ProviderModel, driver: str) -> RunResult:
    agent = Agent(model, demo_registry())
    return agent.run(QUESTION) if driver == "sync" else asyncio.run(agent.arun(QUESTION))


def _asked_ids(result: RunResult) -> list[str]:
    return [call.id for message in result.messages for call in message.tool_calls]


def _answered_ids(result: RunResult) -> list[str | None]:
    return [message.tool_call_id for message in result.messages if message.role == "tool"]


# --- OpenAI Chat Completions: no provider_data, the calls are rebuilt from the record ------------------------------


def _chat_turn(call_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(body("openai", "tool_call"))
    call = data["choices"][0]["message"]["tool_calls"][0]
    call["id"] = call_id
    call["function"]["arguments"] = json.dumps(arguments)
    return data


@pytest.mark.parametrize("driver", DRIVERS)
def test_chat_sends_a_reused_call_id_back_renamed_on_both_the_call_and_its_result(
    provider_server: ProviderServer, driver: str
) -> None:
    """``call_0`` twice: the second call goes back as ``call_0-2``, and its tool message answers ``call_0-2``."""
    provider_server.queue(
        _chat_turn("call_0", {"a": 2, "b": 3}), _chat_turn("call_0", {"a": 5, "b": 4}), body("openai", "final_answer")
    )
    model = OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{provider_server.url}/v1", max_retries=0)
    result = _run(model, driver)
    assert result.ok
    assert _asked_ids(result) == ["call_0", "call_0-2"] == _answered_ids(result)
    sent = provider_server.requests[2].json["messages"]
    calls = [c["id"] for m in sent if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    answers = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert calls == answers == ["call_0", "call_0-2"]
    assert [m["content"] for m in sent if m["role"] == "tool"] == ["5", "9"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_chat_renames_an_id_repeated_inside_one_reply(provider_server: ProviderServer, driver: str) -> None:
    """Two calls of one reply under one id: both run, each answered under its own id on the wire."""
    data = copy.deepcopy(body("openai", "two_tool_calls"))
    for call in data["choices"][0]["message"]["tool_calls"]:
        call["id"] = "call_0"
    provider_server.queue(data, body("openai", "final_answer"))
    model = OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{provider_server.url}/v1", max_retries=0)
    result = _run(model, driver)
    assert result.ok
    sent = provider_server.requests[1].json["messages"]
    calls = [c["id"] for m in sent if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    answers = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert calls == answers == ["call_0", "call_0-2"]


# --- adapters that send a reply back verbatim (provider_data) ------------------------------------------------------


def _responses_turns() -> list[dict[str, Any]]:
    first = copy.deepcopy(body("openai_responses", "reasoning_call"))
    second = copy.deepcopy(first)
    second["id"] = "resp_01b"
    second["output"][0]["id"] = "rs_01Second"
    second["output"][1]["id"] = "fc_01Second"
    second["output"][1]["arguments"] = json.dumps({"a": 5, "b": 4})
    return [first, second, body("openai_responses", "final_answer")]


def _responses_pairs(request: dict[str, Any]) -> tuple[list[str], list[str]]:
    items = request["input"]
    calls = [item["call_id"] for item in items if item.get("type") == "function_call"]
    outputs = [item["call_id"] for item in items if item.get("type") == "function_call_output"]
    return calls, outputs


def _anthropic_turns() -> list[dict[str, Any]]:
    first = copy.deepcopy(body("anthropic", "thinking_tool_use"))
    second = copy.deepcopy(first)
    second["id"] = "msg_11Second"
    second["content"][0]["signature"] = "U2Vjb25kIHNpZ25hdHVyZQ=="
    second["content"][2]["input"] = {"a": 5, "b": 4}
    return [first, second, body("anthropic", "thinking_final")]


def _anthropic_pairs(request: dict[str, Any]) -> tuple[list[str], list[str]]:
    blocks = [block for message in request["messages"] for block in message["content"]]
    calls = [block["id"] for block in blocks if block["type"] == "tool_use"]
    results = [block["tool_use_id"] for block in blocks if block["type"] == "tool_result"]
    return calls, results


def _gemini_turns() -> list[dict[str, Any]]:
    first = copy.deepcopy(body("gemini", "thought_call"))
    first["candidates"][0]["content"]["parts"][1]["functionCall"]["id"] = "call-1"
    second = copy.deepcopy(first)
    second["responseId"] = "gem-resp-01b"
    second["candidates"][0]["content"]["parts"][1]["functionCall"]["args"] = {"a": 5, "b": 4}
    return [first, second, body("gemini", "final_answer")]


def _gemini_pairs(request: dict[str, Any]) -> tuple[list[str], list[str]]:
    parts = [part for content in request["contents"] for part in content["parts"]]
    calls = [part["functionCall"]["id"] for part in parts if "functionCall" in part]
    results = [part["functionResponse"]["id"] for part in parts if "functionResponse" in part]
    return calls, results


VERBATIM: dict[str, tuple[Callable[[str], ProviderModel], Callable[[], list[dict[str, Any]]], Callable[..., Any]]] = {
    "openai_responses": (
        lambda url: OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=f"{url}/v1", max_retries=0),
        _responses_turns,
        _responses_pairs,
    ),
    "anthropic": (
        lambda url: AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=url, max_retries=0),
        _anthropic_turns,
        _anthropic_pairs,
    ),
    "gemini": (
        lambda url: GeminiModel("gemini-2.5-flash", api_key=f"AIza-{KEY}", base_url=url, max_retries=0),
        _gemini_turns,
        _gemini_pairs,
    ),
}


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("provider", list(VERBATIM))
def test_a_reused_call_id_in_a_reply_kept_verbatim_is_renamed_on_the_wire_too(
    provider_server: ProviderServer, provider: str, driver: str
) -> None:
    """Each result sent answers a call sent under the same id; no call id is sent twice."""
    build, turns, pairs = VERBATIM[provider]
    provider_server.queue(*turns())
    result = _run(build(provider_server.url), driver)
    assert result.ok
    first_id = _asked_ids(result)[0]
    assert _asked_ids(result) == [first_id, f"{first_id}-2"] == _answered_ids(result)
    calls, results = pairs(provider_server.requests[2].json)
    assert calls == results == [first_id, f"{first_id}-2"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_gemini_calls_without_ids_stay_without_ids_when_their_derived_ids_are_renamed(
    provider_server: ProviderServer, driver: str
) -> None:
    """Two signed replies under one response id, their calls without ids: derived ids clash, and none is sent."""
    first = copy.deepcopy(body("gemini", "thought_call"))
    second = copy.deepcopy(first)
    second["candidates"][0]["content"]["parts"][1]["functionCall"]["args"] = {"a": 5, "b": 4}
    provider_server.queue(first, second, body("gemini", "final_answer"))
    result = _run(VERBATIM["gemini"][0](provider_server.url), driver)
    assert result.ok
    first_id = _asked_ids(result)[0]
    assert first_id.startswith("gemini-call-")
    assert _asked_ids(result) == [first_id, f"{first_id}-2"] == _answered_ids(result)
    parts = [part for content in provider_server.requests[2].json["contents"] for part in content["parts"]]
    assert [part["functionCall"] for part in parts if "functionCall" in part] == [
        {"name": "add", "args": {"a": 2, "b": 3}},
        {"name": "add", "args": {"a": 5, "b": 4}},
    ]
    assert [sorted(part["functionResponse"]) for part in parts if "functionResponse" in part] == [
        ["name", "response"]
    ] * 2


@pytest.mark.parametrize("provider", list(VERBATIM))
def test_only_the_renamed_ids_change_in_the_reply_sent_back(provider_server: ProviderServer, provider: str) -> None:
    """The second reply goes back as it came (thinking, signatures, encrypted reasoning) but for its call's id."""
    build, turns, _ = VERBATIM[provider]
    replies = turns()
    provider_server.queue(*replies)
    result = _run(build(provider_server.url), "sync")
    assert result.ok
    first_id = _asked_ids(result)[0]
    request = provider_server.requests[2].json
    assert json.dumps(request).count(f'"{first_id}-2"') == 2  # the call and its result
    undone = _objects(json.loads(json.dumps(request).replace(f'"{first_id}-2"', f'"{first_id}"')))
    kept = result.messages[3].provider_data
    assert kept is not None
    # Every item of the kept reply, unchanged, is in the request once the rename is undone.
    assert all(item in undone for item in kept.items())


def _objects(value: Any) -> list[dict[str, Any]]:
    """Every JSON object in ``value``, nested ones included.

    A Gemini signature is the same bytes in either base64 alphabet (the SDK sends it URL-safe), so it is compared
    in the standard one.
    """
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        if isinstance(value.get("thoughtSignature"), str):
            value["thoughtSignature"] = value["thoughtSignature"].replace("-", "+").replace("_", "/")
        found.append(value)
        value = list(value.values())
    if isinstance(value, list):
        for each in value:
            found.extend(_objects(each))
    return found
