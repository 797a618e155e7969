"""The OpenAI Responses adapter, through the official SDK over real HTTP, against a server enforcing its rule."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.provider_rules import openai_reasoning
from support.provider_server import FAST, QUESTION, ProviderServer, Reply, body, stop_of

from fsm_agent import Agent, Message, ProviderData, ToolCall, Usage
from fsm_agent.cli.main import main
from fsm_agent.models import MalformedReplyError, OpenAIResponsesModel
from fsm_agent.models.openai_responses import to_responses_input
from fsm_agent.records import STOP_REASONS as ENGINE_STOP_REASONS
from fsm_agent.testing import demo_registry

KEY = "sk-proj-test-4f3e2d1c0b9a8f7e6d5c"
DIR = "openai_responses"
TURNS = ("reasoning_call", "reasoning_second_call", "final_answer")


@pytest.fixture
def server(provider_server: ProviderServer) -> ProviderServer:
    """The loopback server, refusing what the real API refuses when reasoning items are dropped or altered."""
    provider_server.rules.append(openai_reasoning)
    return provider_server


@pytest.fixture
def model(server: ProviderServer) -> Iterator[OpenAIResponsesModel]:
    """An adapter for a reasoning model, talking to the enforcing server."""
    with OpenAIResponsesModel(
        "o4-mini", api_key=KEY, base_url=server.url + "/v1", max_retries=2, reasoning={"effort": "low"}
    ) as adapter:
        yield adapter


def _with(name: str, **fields: Any) -> dict[str, Any]:
    data = copy.deepcopy(body(DIR, name))
    data.update(fields)
    return data


def test_a_reasoning_agent_completes_a_multi_tool_run_sending_reasoning_items_back_in_place(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    """Each later request carries every earlier output item as served, reasoning before its call, then the output."""
    server.queue(*(body(DIR, name) for name in TURNS))
    result = Agent(model, demo_registry(), "Be terse.").run(QUESTION)
    assert result.ok
    assert result.final == "(2+3)*4 = 20"
    first, _, last = server.requests
    assert first.path == "/v1/responses"
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert first.json["store"] is False
    assert first.json["include"] == ["reasoning.encrypted_content"]
    assert first.json["instructions"] == "Be terse."
    assert first.json["reasoning"] == {"effort": "low"}
    assert first.json["input"] == [{"role": "user", "content": QUESTION}]
    assert first.json["tools"][1] == {
        "type": "function",
        "name": "add",
        "description": "Add two numbers.",
        "parameters": demo_registry().schemas()[1]["parameters"],
        "strict": False,
    }
    assert last.json["input"] == [
        {"role": "user", "content": QUESTION},
        *body(DIR, "reasoning_call")["output"],
        {"type": "function_call_output", "call_id": "call_01Add", "output": "5"},
        *body(DIR, "reasoning_second_call")["output"],
        {"type": "function_call_output", "call_id": "call_02Echo", "output": '"5 times 4 is 20"'},
    ]
    assert result.messages[-1].provider_data is not None
    assert result.messages[-1].provider_data.thinking == "**Answering**"


def _first_reply(server: ProviderServer, model: OpenAIResponsesModel) -> list[Message]:
    server.queue(body(DIR, "reasoning_call"))
    asked = [Message("user", QUESTION)]
    reply = model.complete(asked, demo_registry().schemas()).message
    return [*asked, reply, Message("tool", "5", tool_call_id="call_01Add")]


def test_the_server_refuses_a_function_call_without_its_reasoning_item_as_the_real_api_does(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    """The call rebuilt from text and tool calls alone, as the Chat Completions adapter would, is a 400."""
    import openai

    conversation = _first_reply(server, model)
    conversation[1] = Message("assistant", "", conversation[1].tool_calls)
    with pytest.raises(openai.BadRequestError, match="without its required 'reasoning' item: 'rs_01Plan'"):
        model.complete(conversation, demo_registry().schemas())


def _changed(message: Message, change: Any) -> Message:
    data = message.provider_data
    assert data is not None
    items = data.items()
    change(items)
    kept = ProviderData(data.provider, json.dumps(items), data.thinking)
    return Message(message.role, message.content, message.tool_calls, provider_data=kept)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda items: items[0].update(encrypted_content=items[0]["encrypted_content"][2:]), "could not be verified"),
        (lambda items: items.reverse(), "without its required 'reasoning' item"),
    ],
    ids=["encrypted-content", "order"],
)
def test_the_server_refuses_altered_or_reordered_reasoning(
    server: ProviderServer, model: OpenAIResponsesModel, change: Any, error: str
) -> None:
    """Changed encrypted content, or the reasoning item after its call, is the API's 400 too."""
    import openai

    conversation = _first_reply(server, model)
    conversation[1] = _changed(conversation[1], change)
    with pytest.raises(openai.BadRequestError, match=error):
        model.complete(conversation, demo_registry().schemas())


def test_a_resume_from_a_snapshot_between_turns_sends_the_encrypted_reasoning_back_byte_for_byte(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    """The snapshot, as JSON text, holds the reasoning; a new adapter resuming it sends the items as served."""
    server.queue(*(body(DIR, name) for name in TURNS))
    agent = Agent(model, demo_registry())
    run = agent.start(QUESTION)
    while not (run.state == "AwaitModel" and run.steps):
        run.advance()
    saved = json.dumps(run.snapshot())
    assert body(DIR, "reasoning_call")["output"][0]["encrypted_content"] in saved
    with OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=server.url + "/v1") as fresh:
        result = Agent(fresh, demo_registry()).resume(saved).finish()
    assert result.ok
    assert server.requests[1].json["input"][1:3] == body(DIR, "reasoning_call")["output"]


@pytest.mark.parametrize(
    ("name", "stop_reason", "text"),
    [
        ("answer", "end_turn", "(2+3)*4 = 20"),
        ("reasoning_call", "tool_use", ""),
        ("incomplete_max_output_tokens", "max_tokens", "Let me work this out step by step: first, 2+3 is"),
        ("incomplete_content_filter", "refusal", "I can tell you that"),
        ("refusal", "refusal", "I'm sorry, I can't help with that."),
    ],
)
def test_every_status_maps_onto_the_engine_vocabulary(
    server: ProviderServer, model: OpenAIResponsesModel, name: str, stop_reason: str, text: str
) -> None:
    """completed (with or without calls), incomplete for length or filter, and a refusal part, as the guide says."""
    server.queue(body(DIR, name))
    response = model.complete([Message("user", QUESTION)], [])
    assert (response.stop_reason, response.message.content) == (stop_reason, text)


def test_the_mapping_only_produces_stop_reasons_the_engine_understands() -> None:
    """Every mapped value is in the engine's vocabulary."""
    assert set(OpenAIResponsesModel.finish_reasons.values()) <= set(ENGINE_STOP_REASONS)


def test_truncated_output_stops_the_run_with_max_tokens_and_keeps_the_partial_text(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    """status incomplete for max_output_tokens is the max_tokens stop; the cut text is the result's final."""
    server.queue(body(DIR, "incomplete_max_output_tokens"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "max_tokens"
    assert stop.result.final == "Let me work this out step by step: first, 2+3 is"


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        (_with("failed"), "unknown stop_reason 'failed'"),
        (_with("answer", status="incomplete", incomplete_details={"reason": "server_busy"}), "incomplete: server_busy"),
    ],
    ids=["failed", "unknown-incomplete-reason"],
)
def test_an_unknown_status_is_a_model_error_with_the_reply_kept(
    server: ProviderServer, model: OpenAIResponsesModel, reply: dict[str, Any], named: str
) -> None:
    """A status or incomplete reason outside the table is never taken for an answer."""
    server.queue(reply)
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert named in stop.evidence["error"]
    assert stop.result.messages[-1].role == "assistant"


def test_usage_counts_reasoning_tokens_as_output(server: ProviderServer, model: OpenAIResponsesModel) -> None:
    """input_tokens is the input; output_tokens, which includes the reasoning tokens, is the output; the run's
    usage keeps the reasoning part."""
    server.queue(*(body(DIR, name) for name in TURNS))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.usage == Usage(120 + 260 + 330, 210 + 140 + 40, reasoning_tokens=192 + 120 + 24)


@pytest.mark.parametrize(
    ("reply", "field"),
    [
        (_with("answer", output="(2+3)*4 = 20"), "output"),
        (_with("answer", usage={"input_tokens": 5}), "usage.output_tokens"),
        (_with("answer", output=[{"type": "function_call", "call_id": "c1", "name": 7, "arguments": "{}"}]), None),
    ],
    ids=["output-text", "usage-half", "call-name-number"],
)
def test_a_malformed_reply_is_a_model_error_naming_the_field(
    server: ProviderServer, model: OpenAIResponsesModel, reply: dict[str, Any], field: str | None
) -> None:
    """Output that is not a list, usage half there, or a call name that is not a string is refused by name."""
    server.queue(reply)
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert stop.__cause__.field == (field or "output[0].name")


def test_a_reply_of_only_items_the_adapter_does_not_read_is_a_model_error_saying_what_arrived(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    """A completed response holding only an unknown item (or message part) is no empty answer."""
    message = copy.deepcopy(body(DIR, "answer")["output"][0])
    message["content"] = [{"type": "output_hologram", "data": "x"}]
    server.queue(_with("answer", output=[{"type": "hologram", "id": "h_1"}, message]))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert str(stop.__cause__) == (
        "malformed provider reply: output holds no text or tool call, only what this adapter does not read: "
        "output[0] of type 'hologram', output[1].content[0] of type 'output_hologram'"
    )


def test_a_429_is_retried_and_a_persistent_500_stops_with_the_provider_error_as_cause(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    """The SDK retries a rate limit with the same request; three 500s end in model_error, cause kept."""
    import openai

    server.queue(Reply(body("openai", "error_429"), 429, FAST), body(DIR, "answer"))
    assert Agent(model, demo_registry()).run(QUESTION).ok
    assert server.requests[0].json == server.requests[1].json
    server.queue(*[Reply(body("openai", "error_500"), 500, FAST)] * 3)
    stop = stop_of(Agent(model, demo_registry()))
    assert isinstance(stop.__cause__, openai.InternalServerError)
    assert len(server.requests) == 5


def test_acomplete_uses_the_async_client(server: ProviderServer) -> None:
    """The async path sends the same request through AsyncOpenAI and keeps the reasoning the same way."""
    server.queue(body(DIR, "reasoning_call"))
    model = OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=server.url + "/v1")

    async def go() -> Any:
        async with model:
            return await model.acomplete([Message("user", QUESTION)], demo_registry().schemas())

    response = asyncio.run(go())
    assert response.stop_reason == "tool_use"
    assert response.message.provider_data is not None
    assert response.message.provider_data.items() == body(DIR, "reasoning_call")["output"]
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"


def test_store_and_include_are_left_as_given() -> None:
    """store=True asks for no encrypted content; an include list of one's own keeps its entries."""
    stored = OpenAIResponsesModel("o4-mini", api_key=KEY, store=True)
    assert "include" not in stored.params
    mixed = OpenAIResponsesModel("o4-mini", api_key=KEY, include=["message.output_text.logprobs"])
    assert mixed.params["include"] == ["message.output_text.logprobs", "reasoning.encrypted_content"]
    with pytest.raises(TypeError, match="sets input itself"):
        OpenAIResponsesModel("o4-mini", api_key=KEY, input=[])


def test_conversion_without_provider_data_pairs_calls_and_outputs_by_call_id() -> None:
    """Messages from another provider become message, function_call and function_call_output items."""
    messages = [
        Message("system", "Be terse."),
        Message("user", QUESTION),
        Message("assistant", "Adding.", (ToolCall("t1", "add", {"a": 2}), ToolCall("t2", "add", raw_arguments="{"))),
        Message("tool", "2", tool_call_id="t1"),
        Message("assistant", "2", provider_data=ProviderData("anthropic", '[{"type": "thinking"}]')),
    ]
    instructions, items = to_responses_input(messages)
    assert instructions == "Be terse."
    assert items == [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "Adding."},
        {"type": "function_call", "call_id": "t1", "name": "add", "arguments": '{"a": 2}'},
        {"type": "function_call", "call_id": "t2", "name": "add", "arguments": "{"},
        {"type": "function_call_output", "call_id": "t1", "output": "2"},
        {"role": "assistant", "content": "2"},
    ]


def test_the_run_command_takes_openai_responses(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--model openai-responses:NAME`` uses this adapter with OPENAI_API_KEY and prints the answer."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.queue(body(DIR, "answer"))
    url = server.url + "/v1"
    assert main(["run", QUESTION, "--model", "openai-responses:o4-mini", "--base-url", url, "--quiet"]) == 0
    assert capsys.readouterr().out == "(2+3)*4 = 20\n"
    assert server.requests[0].path == "/v1/responses"
