"""The OpenAI Chat Completions adapter, through the official SDK over real HTTP to the loopback provider server."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from support.provider_server import FAST, QUESTION, ProviderServer, Reply, body, stop_of

from fsm_agent import Agent, Message, ToolCall, Usage
from fsm_agent.models import MalformedReplyError, OpenAIChatModel
from fsm_agent.models.openai_chat import from_openai_completion, to_openai_messages, to_openai_tools
from fsm_agent.records import STOP_REASONS as ENGINE_STOP_REASONS
from fsm_agent.testing import TOOL_THEN_ANSWER, assert_path, demo_registry

KEY = "sk-test-4f7c0d9e2b1a8c3f5e6d7a9b"


@pytest.fixture
def model(provider_server: ProviderServer) -> Iterator[OpenAIChatModel]:
    """An adapter whose SDK client talks to the loopback server."""
    with OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{provider_server.url}/v1", max_retries=2) as adapter:
        yield adapter


def _completion(name: str, finish_reason: str | None = None, **message: Any) -> dict[str, Any]:
    """A recorded body, optionally with its finish_reason or message fields replaced."""
    data = copy.deepcopy(body("openai", name))
    choice = data["choices"][0]
    if finish_reason is not None:
        choice["finish_reason"] = finish_reason
    choice["message"].update(message)
    return data


def test_a_tool_call_then_an_answer_runs_through_the_engine_and_sends_the_converted_history(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """The requested tool runs, its result goes back in Chat Completions form, and the next reply is the answer."""
    provider_server.queue(body("openai", "tool_call"), body("openai", "final_answer"))
    result = Agent(model, demo_registry(), "Be terse.").run(QUESTION)
    assert result.final == "(2+3)*4 = 20"
    assert_path(result, TOOL_THEN_ANSWER)
    first, second = provider_server.requests
    assert first.path == second.path == "/v1/chat/completions"
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert first.json["model"] == "gpt-4o-mini"
    assert first.json["messages"] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": QUESTION}]
    assert first.json["tools"][1] == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    }
    assert second.json["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_Ad1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_Ad1", "content": "5"},
    ]


def test_several_tool_calls_in_one_turn_all_run_and_are_answered_in_order(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """Two calls of one turn (one succeeding, one failing) both run, and both results go back after the text."""
    provider_server.queue(body("openai", "two_tool_calls"), body("openai", "final_answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert [s.detail for s in result.steps[:2]] == [
        'add({"a": 5, "b": 5}) -> 10',
        'fail({"reason": "quota exceeded"}) -> {"error": "quota exceeded"}',
    ]
    sent = provider_server.requests[1].json["messages"]
    assert sent[1]["content"] == "Adding, and checking the quota."
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["call_Ad2", "call_Fl1"]
    assert sent[2:] == [
        {"role": "tool", "tool_call_id": "call_Ad2", "content": "10"},
        {"role": "tool", "tool_call_id": "call_Fl1", "content": '{"error": "quota exceeded"}'},
    ]


def test_a_final_answer_without_tools_ends_the_run_done(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """finish_reason "stop" without tool calls is the final answer."""
    provider_server.queue(body("openai", "final_answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.ok
    assert result.final == "(2+3)*4 = 20"
    assert result.usage == Usage(140, 9)


def test_a_length_cut_answer_stops_with_max_tokens_and_keeps_the_partial_text(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """finish_reason "length" reaches CheckTruncation as max_tokens; the cut text is the result's final."""
    provider_server.queue(body("openai", "truncated_answer"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "max_tokens"
    assert stop.result.final == "Let me work this out step by step: first, 2+3 is"
    assert stop.result.trace[-1].source == "CheckTruncation"


def test_a_length_cut_tool_call_stops_with_max_tokens_before_anything_runs(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """Half a tool call under "length" is a max_tokens stop; the call is kept, raw arguments and all, never executed."""
    provider_server.queue(body("openai", "truncated_tool_call"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "max_tokens"
    assert stop.evidence["cut_tool_calls"] == 1
    assert stop.result.pending == (ToolCall("call_Cut1", "add", {}, raw_arguments='{"a": 2, "b'),)
    assert not [s for s in stop.result.steps if s.kind == "tool_call"]


def test_malformed_tool_arguments_become_a_failed_result_the_model_is_shown(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """Arguments that are not valid JSON fail the call with a message saying so, and the run goes on."""
    provider_server.queue(body("openai", "malformed_arguments"), body("openai", "final_answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.ok
    sent = provider_server.requests[1].json["messages"]
    # The model's own text goes back unchanged, so it can see what it wrote.
    assert sent[-2]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3,}'
    error = json.loads(sent[-1]["content"])["error"]
    assert "arguments for tool 'add' are not valid JSON" in error


@pytest.mark.parametrize("arguments", ["[2, 3]", '"2+3"', "7"])
def test_arguments_that_are_json_but_not_an_object_are_kept_raw(arguments: str) -> None:
    """A JSON list, string or number is not an argument object: the call keeps the text in raw_arguments."""
    from openai.types.chat import ChatCompletion

    data = _completion("tool_call")
    data["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = arguments
    response = from_openai_completion(ChatCompletion.model_validate(data))
    assert response.message.tool_calls == (ToolCall("call_Ad1", "add", {}, raw_arguments=arguments),)


def test_empty_arguments_mean_a_call_without_arguments() -> None:
    """Compatible servers send "" for a tool without parameters; that is an empty argument object, not an error."""
    from openai.types.chat import ChatCompletion

    data = _completion("tool_call")
    data["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = ""
    response = from_openai_completion(ChatCompletion.model_validate(data))
    assert response.message.tool_calls == (ToolCall("call_Ad1", "add", {}),)


def test_content_filter_stops_the_run_with_refusal(provider_server: ProviderServer, model: OpenAIChatModel) -> None:
    """finish_reason "content_filter" is the refusal stop, not an empty final answer."""
    provider_server.queue(body("openai", "content_filter"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "refusal"
    assert stop.result.final == ""


def test_a_refusal_message_stops_with_refusal_and_shows_the_refusal_text(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """A message whose refusal field is set is a refusal even under finish_reason "stop"; its text is kept."""
    provider_server.queue(body("openai", "refusal"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "refusal"
    assert stop.result.final == "I'm sorry, I can't help with that request."
    assert stop.evidence["content"] == stop.result.final


def test_the_mapping_only_produces_stop_reasons_the_engine_understands() -> None:
    """Every mapped value is in the engine's vocabulary, so no provider signal ends up as an accidental error."""
    assert set(OpenAIChatModel.finish_reasons.values()) <= set(ENGINE_STOP_REASONS)


@pytest.mark.parametrize(("finish_reason", "stop_reason"), sorted(OpenAIChatModel.finish_reasons.items()))
def test_every_finish_reason_maps_onto_the_engine_vocabulary(
    provider_server: ProviderServer, model: OpenAIChatModel, finish_reason: str, stop_reason: str
) -> None:
    """Each OpenAI finish_reason in the table arrives as the engine stop_reason the provider guide promises."""
    provider_server.queue(_completion("final_answer", finish_reason))
    assert model.complete([Message("user", QUESTION)], []).stop_reason == stop_reason


def test_stop_with_tool_calls_is_reported_as_tool_use(provider_server: ProviderServer, model: OpenAIChatModel) -> None:
    """Some compatible servers say "stop" next to tool calls; the response still says it wants tools."""
    provider_server.queue(_completion("tool_call", "stop"))
    response = model.complete([Message("user", QUESTION)], demo_registry().schemas())
    assert response.stop_reason == "tool_use"
    assert response.message.tool_calls[0].arguments == {"a": 2, "b": 3}


def test_an_unknown_finish_reason_stops_with_model_error_naming_it(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """A finish_reason outside the table is never taken for an answer: model_error, with the reply kept."""
    provider_server.queue(_completion("final_answer", "abort"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, ValueError)
    assert "unknown stop_reason 'abort'" in stop.evidence["error"]
    assert stop.result.messages[-1] == Message("assistant", "(2+3)*4 = 20")


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("tool_calls", 0, "function", "name"), ["add"], "tool_calls[0].function.name"),
        (("tool_calls", 0, "id"), 7, "tool_calls[0].id"),
        (("tool_calls", 0, "function", "arguments"), {"a": 2, "b": 3}, "tool_calls[0].function.arguments"),
        (("tool_calls",), "add", "tool_calls"),
        (("content",), ["(2+3)*4"], "content"),
    ],
    ids=["name-list", "id-number", "arguments-object", "tool_calls-text", "content-list"],
)
def test_a_malformed_message_is_a_model_error_naming_the_field(
    provider_server: ProviderServer, model: OpenAIChatModel, path: tuple[str | int, ...], value: Any, field: str
) -> None:
    """A tool call whose name is a list (or a call id, arguments or text of the wrong type) is refused, field named."""
    data = _completion("tool_call")
    target: Any = data["choices"][0]["message"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    provider_server.queue(data)
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert stop.__cause__.field == f"choices[0].message.{field}"


def test_a_finish_reason_that_is_not_a_string_is_a_model_error(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """A list where the finish_reason should be is refused by name, not looked up (it is unhashable)."""
    provider_server.queue(_completion("final_answer", ["stop"]))  # type: ignore[arg-type]
    stop = stop_of(Agent(model, demo_registry()))
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert stop.__cause__.field == "choices[0].finish_reason"


def test_a_null_message_is_a_model_error_naming_it(provider_server: ProviderServer, model: OpenAIChatModel) -> None:
    """``"message": null`` under finish_reason "stop" is no empty answer: model_error saying the message is missing."""
    data = _completion("final_answer")
    data["choices"][0]["message"] = None
    provider_server.queue(data)
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert str(stop.__cause__) == "malformed provider reply: choices[0].message is missing or null"


def test_usage_maps_prompt_and_completion_tokens(provider_server: ProviderServer, model: OpenAIChatModel) -> None:
    """usage.prompt_tokens/completion_tokens become Usage(input_tokens, output_tokens), summed over the run."""
    provider_server.queue(body("openai", "tool_call"), body("openai", "final_answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.usage == Usage(82 + 140, 17 + 9)


def test_a_response_without_usage_has_no_usage(provider_server: ProviderServer, model: OpenAIChatModel) -> None:
    """Compatible servers may omit usage; the response then carries None, which the engine counts as zero."""
    data = body("openai", "final_answer")
    del data["usage"]
    provider_server.queue(data)
    assert model.complete([Message("user", QUESTION)], []).usage is None


def test_a_429_is_retried_by_the_sdk_and_the_run_succeeds(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """A rate limit answer is retried (same request again) and the run never notices."""
    provider_server.queue(Reply(body("openai", "error_429"), 429, FAST), body("openai", "final_answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.final == "(2+3)*4 = 20"
    first, second = provider_server.requests
    assert first.json == second.json


def test_a_persistent_500_stops_with_model_error_and_the_provider_error_as_cause(
    provider_server: ProviderServer, model: OpenAIChatModel
) -> None:
    """After max_retries retries of a 500, the run stops with model_error and openai's exception as __cause__."""
    import openai

    provider_server.queue(*[Reply(body("openai", "error_500"), 500, FAST)] * 3)
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, openai.InternalServerError)
    assert stop.evidence["type"] == "InternalServerError"
    assert "The server had an error" in stop.evidence["error"]
    assert len(provider_server.requests) == 3


def test_max_retries_bounds_the_attempts(provider_server: ProviderServer) -> None:
    """max_retries=0 makes exactly one attempt."""
    import openai

    provider_server.queue(Reply(body("openai", "error_500"), 500, FAST))
    with OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{provider_server.url}/v1", max_retries=0) as model:
        stop = stop_of(Agent(model, demo_registry()))
    assert isinstance(stop.__cause__, openai.InternalServerError)
    assert len(provider_server.requests) == 1


def test_an_unreachable_server_stops_with_model_error(unused_port: int) -> None:
    """A refused connection is a connection error the SDK gives up on: model_error, cause APIConnectionError."""
    import openai

    with OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"http://127.0.0.1:{unused_port}/v1", max_retries=0) as m:
        stop = stop_of(Agent(m, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, openai.APIConnectionError)


def test_acomplete_uses_the_async_client(provider_server: ProviderServer) -> None:
    """The async path sends the same request through AsyncOpenAI and parses the same response."""
    provider_server.queue(body("openai", "tool_call"))
    model = OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{provider_server.url}/v1")

    async def go() -> Any:
        async with model:
            return await model.acomplete([Message("user", QUESTION)], demo_registry().schemas())

    response = asyncio.run(go())
    assert response.message.tool_calls == (ToolCall("call_Ad1", "add", {"a": 2, "b": 3}),)
    assert response.stop_reason == "tool_use"
    assert provider_server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert provider_server.requests[0].json["messages"] == [{"role": "user", "content": QUESTION}]


def test_params_go_into_every_request_and_no_tools_means_no_tools_key(
    provider_server: ProviderServer,
) -> None:
    """Extra params (temperature, ...) are sent as given; an empty registry sends no "tools" (the API rejects [])."""
    provider_server.queue(body("openai", "final_answer"))
    url = f"{provider_server.url}/v1"
    with OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=url, temperature=0, max_completion_tokens=64) as model:
        model.complete([Message("user", QUESTION)], [])
    sent = provider_server.requests[0].json
    assert sent["temperature"] == 0
    assert sent["max_completion_tokens"] == 64
    assert "tools" not in sent


def test_a_client_passed_in_is_used_as_configured_and_left_open(provider_server: ProviderServer) -> None:
    """The caller's client is used for requests and not closed by the adapter, which does not own it."""
    import openai

    provider_server.queue(body("openai", "final_answer"))
    client = openai.OpenAI(api_key=KEY, base_url=f"{provider_server.url}/v1", max_retries=0)
    with OpenAIChatModel("gpt-4o-mini", client) as model:
        model.complete([Message("user", QUESTION)], [])
    assert not client.is_closed()
    client.close()
    assert len(provider_server.requests) == 1


def test_conversion_covers_every_role_and_several_tool_calls() -> None:
    """System, user, assistant text with two calls (one with undecodable arguments) and tool results convert."""
    messages = [
        Message("system", "Be terse."),
        Message("user", QUESTION),
        Message(
            "assistant",
            "Two calls.",
            (ToolCall("c1", "add", {"a": 2, "b": 3}), ToolCall("c2", "echo", {}, raw_arguments='{"text": ')),
        ),
        Message("tool", "5", tool_call_id="c1"),
        Message("tool", '{"error": "bad JSON"}', tool_call_id="c2"),
        Message("assistant", "20"),
    ]
    assert to_openai_messages(messages) == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": "Two calls.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
                {"id": "c2", "type": "function", "function": {"name": "echo", "arguments": '{"text": '}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"error": "bad JSON"}'},
        {"role": "assistant", "content": "20"},
    ]


def test_tool_schemas_become_function_tools() -> None:
    """Each registry schema is wrapped as {"type": "function", "function": {...}} unchanged."""
    schemas = demo_registry().schemas()
    assert [t["function"] for t in to_openai_tools(schemas)] == schemas
    assert {t["type"] for t in to_openai_tools(schemas)} == {"function"}


@pytest.mark.parametrize(
    ("message", "problem"),
    [(Message("tool", "5"), "tool_call_id"), (Message("developer", "x"), "unknown message role 'developer'")],
)
def test_messages_the_api_cannot_take_are_refused_with_a_reason(message: Message, problem: str) -> None:
    """A tool result without its call id, or an unknown role, is a ValueError naming the problem."""
    with pytest.raises(ValueError, match=problem):
        to_openai_messages([message])


def test_settings_that_clash_are_refused_at_construction() -> None:
    """Params the adapter fills itself, or settings next to a ready client, are a TypeError before any run."""
    import openai

    with pytest.raises(TypeError, match="sets messages, tools itself"):
        OpenAIChatModel("gpt-4o-mini", api_key=KEY, messages=[], tools=[])
    client = openai.OpenAI(api_key=KEY, base_url="http://127.0.0.1:9/v1")
    with pytest.raises(TypeError, match="pass either client or max_retries"):
        OpenAIChatModel("gpt-4o-mini", client, max_retries=1)
    client.close()


def test_without_the_sdk_construction_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """With openai missing, building the adapter raises ImportError with the one-line install hint."""
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(ImportError) as info:
        OpenAIChatModel("gpt-4o-mini")
    assert str(info.value) == "the 'openai' package is not installed; install it with: pip install 'fsm-agent[openai]'"
