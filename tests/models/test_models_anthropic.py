"""The Anthropic Messages adapter, through the official SDK over real HTTP to the loopback provider server."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from support.provider_server import FAST, QUESTION, ProviderServer, Reply, body, stop_of

from fsm_agent import Agent, Message, ToolCall, ToolRegistry, Usage
from fsm_agent.models import AnthropicModel, MalformedReplyError
from fsm_agent.models.anthropic_messages import (
    from_anthropic_message,
    to_anthropic_messages,
    to_anthropic_tools,
)
from fsm_agent.records import STOP_REASONS as ENGINE_STOP_REASONS
from fsm_agent.testing import TOOL_THEN_ANSWER, assert_path, demo_registry

KEY = "sk-ant-test-9b8a7c6d5e4f3a2b1c0d"


@pytest.fixture
def model(provider_server: ProviderServer) -> Iterator[AnthropicModel]:
    """An adapter whose SDK client talks to the loopback server."""
    with AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=provider_server.url, max_retries=2) as adapter:
        yield adapter


def _message(name: str, **fields: Any) -> dict[str, Any]:
    """A recorded body with top-level fields replaced."""
    data = copy.deepcopy(body("anthropic", name))
    data.update(fields)
    return data


def test_a_tool_use_then_an_answer_runs_through_the_engine_and_sends_the_converted_history(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """The tool runs, the system prompt goes into "system", and the result returns as a tool_result block."""
    provider_server.queue(body("anthropic", "tool_use"), body("anthropic", "final_answer"))
    result = Agent(model, demo_registry(), "Be terse.").run(QUESTION)
    assert result.final == "(2+3)*4 = 20"
    assert_path(result, TOOL_THEN_ANSWER)
    first, second = provider_server.requests
    assert first.path == second.path == "/v1/messages"
    assert first.headers["x-api-key"] == KEY
    assert first.json["model"] == "claude-sonnet-4-5"
    assert first.json["max_tokens"] == 4096
    assert first.json["system"] == "Be terse."
    assert first.json["messages"] == [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]
    assert first.json["tools"][1] == {
        "name": "add",
        "description": "Add two numbers.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    }
    assert second.json["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "I'll add the first two numbers."},
                {"type": "tool_use", "id": "toolu_01Add", "name": "add", "input": {"a": 2, "b": 3}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01Add", "content": "5"}]},
    ]


def test_several_tool_uses_are_answered_in_one_user_turn_with_is_error_on_the_failed_one(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """Two results of one turn share one user message; the failed tool's block says is_error, the other does not."""
    provider_server.queue(body("anthropic", "two_tool_uses"), body("anthropic", "final_answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.ok
    assert provider_server.requests[1].json["messages"][2:] == [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_02Add", "content": "10"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_03Fail",
                    "content": '{"error": "quota exceeded"}',
                    "is_error": True,
                },
            ],
        }
    ]


def test_a_final_answer_ends_the_run_done(provider_server: ProviderServer, model: AnthropicModel) -> None:
    """stop_reason "end_turn" with text only is the final answer."""
    provider_server.queue(body("anthropic", "final_answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.ok
    assert result.final == "(2+3)*4 = 20"


def test_a_stop_sequence_is_a_natural_finish(provider_server: ProviderServer, model: AnthropicModel) -> None:
    """stop_reason "stop_sequence" maps to stop_sequence, which ends the run Done with the text."""
    provider_server.queue(body("anthropic", "stop_sequence"))
    assert model.complete([Message("user", QUESTION)], []).stop_reason == "stop_sequence"
    provider_server.queue(body("anthropic", "stop_sequence"))
    assert Agent(model, demo_registry()).run(QUESTION).final == "The answer is 20"


def test_max_tokens_stops_the_run_and_keeps_the_partial_text(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """stop_reason "max_tokens" reaches CheckTruncation as max_tokens; the cut text is the result's final."""
    provider_server.queue(body("anthropic", "truncated_answer"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "max_tokens"
    assert stop.result.final == "Let me work this out step by step: first, 2+3 is"


def test_max_tokens_inside_a_tool_use_stops_before_the_cut_call_runs(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """A tool_use cut by max_tokens is a max_tokens stop; the half call stays pending and never runs."""
    provider_server.queue(body("anthropic", "truncated_tool_use"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "max_tokens"
    assert stop.result.final == "I'll add them."
    assert stop.result.pending == (ToolCall("toolu_04Cut", "add", {"a": 2}),)
    assert stop.evidence["cut_tool_calls"] == 1


def test_a_context_window_overflow_is_a_truncation(provider_server: ProviderServer, model: AnthropicModel) -> None:
    """stop_reason "model_context_window_exceeded" is cut-off output too: max_tokens."""
    provider_server.queue(body("anthropic", "context_window"))
    assert stop_of(Agent(model, demo_registry())).reason == "max_tokens"


def test_pause_turn_stops_as_unfinished_and_drops_server_tool_blocks(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """pause_turn is an unfinished turn, never an answer: max_tokens, with the text kept and no tool call made up."""
    provider_server.queue(body("anthropic", "pause_turn"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "max_tokens"
    assert stop.result.final == "Let me search for that."
    assert stop.result.pending == ()


def test_a_refusal_stops_with_refusal_and_shows_the_explanation(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """stop_reason "refusal" is the refusal stop; without text, the provider's explanation is what the user sees."""
    provider_server.queue(body("anthropic", "refusal"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "refusal"
    assert stop.result.final == "This request could enable malware development."


def test_the_mapping_only_produces_stop_reasons_the_engine_understands() -> None:
    """Every mapped value is in the engine's vocabulary, so no provider signal ends up as an accidental error."""
    assert set(AnthropicModel.finish_reasons.values()) <= set(ENGINE_STOP_REASONS)


@pytest.mark.parametrize(("provider_reason", "stop_reason"), sorted(AnthropicModel.finish_reasons.items()))
def test_every_stop_reason_maps_onto_the_engine_vocabulary(
    provider_server: ProviderServer, model: AnthropicModel, provider_reason: str, stop_reason: str
) -> None:
    """Each Anthropic stop_reason in the table arrives as the engine stop_reason the provider guide promises."""
    provider_server.queue(_message("final_answer", stop_reason=provider_reason))
    assert model.complete([Message("user", QUESTION)], []).stop_reason == stop_reason


def test_an_unknown_stop_reason_stops_with_model_error_naming_it(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """A stop_reason outside the table is never taken for an answer: model_error, with the reply kept."""
    provider_server.queue(_message("final_answer", stop_reason="compaction"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert "unknown stop_reason 'compaction'" in stop.evidence["error"]
    assert stop.result.messages[-1] == Message("assistant", "(2+3)*4 = 20")


def test_a_non_object_tool_input_becomes_a_failed_result_the_model_is_shown(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """A tool_use whose input is not an object fails the call with a message saying so, and the run goes on."""
    bad = copy.deepcopy(body("anthropic", "tool_use"))
    bad["content"][1]["input"] = [2, 3]
    provider_server.queue(bad, body("anthropic", "final_answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.ok
    block = provider_server.requests[1].json["messages"][-1]["content"][0]
    assert block["is_error"] is True
    assert "not a JSON object: '[2, 3]'" in json.loads(block["content"])["error"]


@pytest.mark.parametrize(
    ("index", "key", "value", "field"),
    [(1, "name", ["add"], "content[1].name"), (1, "id", 7, "content[1].id"), (0, "text", None, "content[0].text")],
    ids=["name-list", "id-number", "text-null"],
)
def test_a_malformed_block_is_a_model_error_naming_the_field(
    provider_server: ProviderServer, model: AnthropicModel, index: int, key: str, value: Any, field: str
) -> None:
    """A tool_use whose name is a list (or whose id, or a text, is not a string) is refused, the field named."""
    data = copy.deepcopy(body("anthropic", "tool_use"))
    data["content"][index][key] = value
    provider_server.queue(data)
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert stop.__cause__.field == field


def test_content_that_is_not_a_list_of_blocks_is_a_model_error(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """Text where the blocks should be is refused rather than read character by character."""
    provider_server.queue(_message("final_answer", content="(2+3)*4 = 20"))
    stop = stop_of(Agent(model, demo_registry()))
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert str(stop.__cause__) == "malformed provider reply: content must be a list, got '(2+3)*4 = 20'"


def test_a_reply_of_only_blocks_the_adapter_does_not_read_is_a_model_error_saying_what_arrived(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """An end_turn holding only an unknown block is no empty answer; beside text, such a block is dropped."""
    hologram = {"type": "hologram", "data": {"x": 1}}
    provider_server.queue(_message("final_answer", content=[hologram]))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert str(stop.__cause__) == (
        "malformed provider reply: content holds no text or tool call, "
        "only what this adapter does not read: content[0] of type 'hologram'"
    )
    provider_server.queue(_message("final_answer", content=[hologram, {"type": "text", "text": "20"}]))
    assert Agent(model, demo_registry()).run(QUESTION).final == "20"


def test_a_stop_reason_that_is_not_a_string_is_a_model_error(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """A list where the stop_reason should be is refused by name, not looked up (it is unhashable)."""
    provider_server.queue(_message("final_answer", stop_reason=["end_turn"]))
    stop = stop_of(Agent(model, demo_registry()))
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert stop.__cause__.field == "stop_reason"


def test_a_malformed_cache_count_is_a_model_error_naming_it(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """The cache counts may be absent or null (zero), but one that is there must be an integer >= 0."""
    data = copy.deepcopy(body("anthropic", "final_answer"))
    data["usage"].update(cache_creation_input_tokens=None, cache_read_input_tokens=-3)
    provider_server.queue(data)
    stop = stop_of(Agent(model, demo_registry()))
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert stop.__cause__.field == "usage.cache_read_input_tokens"


def test_usage_counts_cached_prompt_tokens_as_input(provider_server: ProviderServer, model: AnthropicModel) -> None:
    """input_tokens plus cache creation and cache read tokens are the input; output_tokens the output; the run's
    usage keeps the cached parts."""
    provider_server.queue(body("anthropic", "tool_use"), body("anthropic", "final_answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.usage == Usage(410 + (50 + 30 + 400), 72 + 12, cache_read_tokens=400, cache_write_tokens=30)


def test_a_429_is_retried_by_the_sdk_and_the_run_succeeds(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """A rate limit answer is retried with the same request and the run never notices."""
    provider_server.queue(Reply(body("anthropic", "error_429"), 429, FAST), body("anthropic", "final_answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.ok
    first, second = provider_server.requests
    assert first.json == second.json


def test_an_overloaded_529_is_retried(provider_server: ProviderServer, model: AnthropicModel) -> None:
    """Anthropic's 529 overloaded_error is transient too."""
    provider_server.queue(Reply(body("anthropic", "error_529"), 529, FAST), body("anthropic", "final_answer"))
    assert Agent(model, demo_registry()).run(QUESTION).ok
    assert len(provider_server.requests) == 2


def test_a_persistent_500_stops_with_model_error_and_the_provider_error_as_cause(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """After max_retries retries of a 500, the run stops with model_error and anthropic's exception as __cause__."""
    import anthropic

    provider_server.queue(*[Reply(body("anthropic", "error_500"), 500, FAST)] * 3)
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, anthropic.InternalServerError)
    assert "Internal server error" in stop.evidence["error"]
    assert len(provider_server.requests) == 3


def test_acomplete_uses_the_async_client(provider_server: ProviderServer) -> None:
    """The async path sends the same request through AsyncAnthropic and parses the same response."""
    provider_server.queue(body("anthropic", "tool_use"))
    model = AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=provider_server.url)

    async def go() -> Any:
        async with model:
            return await model.acomplete([Message("user", QUESTION)], demo_registry().schemas())

    response = asyncio.run(go())
    assert response.message == Message(
        "assistant", "I'll add the first two numbers.", (ToolCall("toolu_01Add", "add", {"a": 2, "b": 3}),)
    )
    assert response.usage == Usage(410, 72)
    assert provider_server.requests[0].headers["x-api-key"] == KEY


def test_max_tokens_and_params_go_into_every_request(provider_server: ProviderServer) -> None:
    """max_tokens and extra params are sent as given; no system prompt and no tools leave their keys out."""
    provider_server.queue(body("anthropic", "final_answer"))
    with AnthropicModel("claude-x", api_key=KEY, base_url=provider_server.url, max_tokens=256, temperature=0) as model:
        model.complete([Message("user", QUESTION)], [])
    sent = provider_server.requests[0].json
    assert (sent["max_tokens"], sent["temperature"]) == (256, 0)
    assert "system" not in sent
    assert "tools" not in sent


def test_conversion_merges_systems_and_consecutive_results_and_marks_failures() -> None:
    """Systems join into one text; text plus calls become blocks; consecutive results share one user turn."""
    messages = [
        Message("system", "Be terse."),
        Message("system", "Use tools."),
        Message("user", QUESTION),
        Message("assistant", "", (ToolCall("t1", "add", {"a": 2, "b": 3}), ToolCall("t2", "fail", {}))),
        Message("tool", "5", tool_call_id="t1"),
        Message("tool", '{"error": "always fails"}', tool_call_id="t2"),
        Message("user", "And times 4?"),
    ]
    system, turns = to_anthropic_messages(messages)
    assert system == "Be terse.\n\nUse tools."
    assert turns == [
        {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2, "b": 3}},
                {"type": "tool_use", "id": "t2", "name": "fail", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "5"},
                {"type": "tool_result", "tool_use_id": "t2", "content": '{"error": "always fails"}', "is_error": True},
                {"type": "text", "text": "And times 4?"},
            ],
        },
    ]


@pytest.mark.parametrize("content", ['{"result": "error: none"}', '"error"', '["error"]', "not json", '{"errors": 1}'])
def test_only_a_top_level_error_key_marks_a_result_as_failed(content: str) -> None:
    """A success that merely mentions "error" is not flagged: the check is structural."""
    _, turns = to_anthropic_messages([Message("tool", content, tool_call_id="t1")])
    assert "is_error" not in turns[0]["content"][0]


def _capped_registry(cap: int) -> ToolRegistry:
    """Two tools with long output under a cap of ``cap`` characters: one raises, one succeeds."""
    registry = ToolRegistry(max_output_chars=cap)

    @registry.register
    def explode(size: int) -> str:
        """Fail with a long message."""
        raise RuntimeError("boom " * size)

    @registry.register
    def report(size: int) -> dict[str, str]:
        """Succeed with a long report that mentions errors."""
        return {"report": "no error " * size}

    return registry


def test_a_long_failed_result_cut_by_the_cap_is_still_sent_as_an_error(
    provider_server: ProviderServer, model: AnthropicModel
) -> None:
    """The cap cuts the failure's JSON mid-string; its block still says is_error, and the cut success's does not."""
    uses = [
        {"type": "tool_use", "id": "toolu_05Boom", "name": "explode", "input": {"size": 200}},
        {"type": "tool_use", "id": "toolu_06Long", "name": "report", "input": {"size": 200}},
    ]
    provider_server.queue(_message("two_tool_uses", content=uses), body("anthropic", "final_answer"))
    result = Agent(model, _capped_registry(60)).run(QUESTION)
    assert result.ok
    failed, succeeded = provider_server.requests[1].json["messages"][-1]["content"]
    assert failed["is_error"] is True
    assert failed["content"].startswith('{"error": "tool \'explode\' raised RuntimeError: boom boom')
    assert failed["content"].endswith("\n[truncated: 989 of 1049 characters cut, max_output_chars=60]")
    assert "is_error" not in succeeded
    assert succeeded["content"].endswith("max_output_chars=60]")


def test_a_cut_result_is_a_failure_exactly_when_its_error_key_survived_the_cut() -> None:
    """At every cap, a cut failure is flagged once '{"error"' is whole in what is left; a cut success never is."""
    wrong = []
    for cap in range(1, 80):
        registry = _capped_registry(cap)
        for name, failed in (("explode", cap >= len('{"error"')), ("report", False)):
            content = registry.call(ToolCall("t1", name, {"size": 20}))
            _, turns = to_anthropic_messages([Message("tool", content, tool_call_id="t1")])
            if turns[0]["content"][0].get("is_error", False) != failed:
                wrong.append((cap, name, content))
    assert wrong == []


def test_tool_schemas_become_input_schemas() -> None:
    """Each registry schema's parameters become input_schema, name and description unchanged."""
    schemas = demo_registry().schemas()
    assert to_anthropic_tools(schemas) == [
        {"name": s["name"], "description": s["description"], "input_schema": s["parameters"]} for s in schemas
    ]


def test_text_blocks_join_and_thinking_is_kept_apart_from_the_answer() -> None:
    """Several text blocks are one message text; a thinking block is kept in provider_data, never in the text."""
    from anthropic.types import Message as AnthropicMessage

    data = _message(
        "final_answer",
        content=[
            {"type": "thinking", "thinking": "2+3=5, times 4", "signature": "sig"},
            {"type": "text", "text": "(2+3)*4 "},
            {"type": "text", "text": "= 20"},
        ],
    )
    response = from_anthropic_message(AnthropicMessage.model_validate(data))
    assert response.message.content == "(2+3)*4 = 20"
    assert response.message.provider_data is not None
    assert response.message.provider_data.thinking == "2+3=5, times 4"
    assert response.message.provider_data.items() == data["content"]


def test_settings_that_clash_are_refused_at_construction() -> None:
    """Params the adapter fills itself, a bad max_tokens, or settings next to a ready client are refused early."""
    import anthropic

    with pytest.raises(TypeError, match="sets system itself"):
        AnthropicModel("claude-x", api_key=KEY, system="x")
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1"):
        AnthropicModel("claude-x", api_key=KEY, max_tokens=0)
    client = anthropic.Anthropic(api_key=KEY, base_url="http://127.0.0.1:9")
    with pytest.raises(TypeError, match="pass either client or base_url"):
        AnthropicModel("claude-x", client, base_url="http://127.0.0.1:9")
    client.close()


def test_without_the_sdk_construction_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """With anthropic missing, building the adapter raises ImportError with the one-line install hint."""
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(ImportError, match=r"pip install 'fsm-agent\[anthropic\]'$"):
        AnthropicModel("claude-x")
