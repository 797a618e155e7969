"""Anthropic extended thinking: thinking blocks kept and sent back in place, against a server that enforces the rule."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.provider_rules import anthropic_thinking
from support.provider_server import QUESTION, ProviderServer, body, stop_of

from fsm_agent import Agent, CallEvent, Message, ModelResponse, ProviderData, RunResult, SqliteStore, ToolCall
from fsm_agent.models import AnthropicModel
from fsm_agent.models.anthropic_messages import from_anthropic_message, to_anthropic_messages
from fsm_agent.models.openai_chat import to_openai_messages
from fsm_agent.testing import FakeModel, demo_registry

KEY = "sk-ant-test-9b8a7c6d5e4f3a2b1c0d"
THINKING = {"type": "enabled", "budget_tokens": 2048}
TURNS = ("thinking_tool_use", "thinking_second_tool", "thinking_final")


@pytest.fixture
def server(provider_server: ProviderServer) -> ProviderServer:
    """The loopback server, refusing what the real API refuses when thinking blocks are dropped or altered."""
    provider_server.rules.append(anthropic_thinking)
    return provider_server


@pytest.fixture
def model(server: ProviderServer) -> Iterator[AnthropicModel]:
    """An adapter with extended thinking on, talking to the enforcing server."""
    with AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=server.url, max_retries=0, thinking=THINKING) as m:
        yield m


def _first_reply(server: ProviderServer, model: AnthropicModel) -> list[Message]:
    """The conversation after the first reply (thinking, text, a tool use) and its tool result."""
    server.queue(body("anthropic", "thinking_tool_use"))
    asked = [Message("user", QUESTION)]
    reply = model.complete(asked, demo_registry().schemas()).message
    return [*asked, reply, Message("tool", "5", tool_call_id="toolu_11Add")]


def test_a_thinking_agent_completes_a_multi_tool_run_sending_every_block_back_in_place(
    server: ProviderServer, model: AnthropicModel
) -> None:
    """Two tool turns and an answer: each later request carries the earlier turns' blocks exactly as served."""
    server.queue(*(body("anthropic", name) for name in TURNS))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.ok
    assert result.final == "(2+3)*4 = 20"
    assert [s.detail.split("(")[0] for s in result.steps if s.kind == "tool_call"] == ["add", "echo"]
    last = server.requests[-1].json["messages"]
    assert last[1]["content"] == body("anthropic", "thinking_tool_use")["content"]
    assert last[3]["content"] == body("anthropic", "thinking_second_tool")["content"]
    assert all(r.json["thinking"] == THINKING for r in server.requests)


def test_the_server_refuses_a_tool_turn_without_its_thinking_block_as_the_real_api_does(
    server: ProviderServer, model: AnthropicModel
) -> None:
    """What the adapter sent before it kept thinking blocks (text and tool use only) is a 400 naming the rule."""
    import anthropic

    conversation = _first_reply(server, model)
    stripped = conversation[1]
    conversation[1] = Message("assistant", stripped.content, stripped.tool_calls)
    with pytest.raises(anthropic.BadRequestError) as info:
        model.complete(conversation, demo_registry().schemas())
    assert info.value.status_code == 400
    assert "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `text`" in str(info.value)


def _altered(message: Message, change: Any) -> Message:
    data = message.provider_data
    assert data is not None
    blocks = data.items()
    change(blocks)
    return Message(
        message.role,
        message.content,
        message.tool_calls,
        provider_data=ProviderData(data.provider, json.dumps(blocks), data.thinking),
    )


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda blocks: blocks[0].update(signature=blocks[0]["signature"][:-4] + "AAA="), "Invalid `signature`"),
        (lambda blocks: blocks[0].update(thinking="I changed my mind."), "Invalid `signature`"),
        (lambda blocks: blocks.reverse(), "Expected `thinking` or `redacted_thinking`, but found `tool_use`"),
    ],
    ids=["signature", "thinking-text", "order"],
)
def test_the_server_refuses_an_altered_or_reordered_thinking_block(
    server: ProviderServer, model: AnthropicModel, change: Any, error: str
) -> None:
    """A changed signature or thinking text, or the blocks in another order, is the API's 400 too."""
    import anthropic

    conversation = _first_reply(server, model)
    conversation[1] = _altered(conversation[1], change)
    with pytest.raises(anthropic.BadRequestError, match=error):
        model.complete(conversation, demo_registry().schemas())


def test_the_thinking_text_reaches_hooks_and_never_the_answer(server: ProviderServer, model: AnthropicModel) -> None:
    """after_model sees the thinking in provider_data; message content and the final answer hold only the text."""
    server.queue(*(body("anthropic", name) for name in TURNS))
    agent = Agent(model, demo_registry())
    seen: list[str] = []

    @agent.on("after_model")
    def keep(event: CallEvent) -> None:
        data = None if event.response is None else event.response.message.provider_data
        seen.append("" if data is None else data.thinking)

    result = agent.run(QUESTION)
    assert seen == [
        "The user wants (2+3)*4. First 2+3 with the add tool, then times 4.",
        "",  # redacted thinking has no readable text
        "Both steps are done: 5 times 4 is 20.",
    ]
    assert result.final == "(2+3)*4 = 20"
    assert "The user wants" not in json.dumps([m.content for m in result.messages])


def test_a_resume_from_a_snapshot_between_turns_sends_the_blocks_back_byte_for_byte(
    server: ProviderServer, model: AnthropicModel, tmp_path: Path
) -> None:
    """Stopped after the first tool ran, saved to SQLite and resumed by a new adapter: the blocks come back intact."""
    server.queue(*(body("anthropic", name) for name in TURNS))
    store = SqliteStore(tmp_path / "runs.db")
    agent = Agent(model, demo_registry())
    run = agent.start(QUESTION, store=store, run_id="thinking")
    while not (run.state == "AwaitModel" and run.steps):
        run.advance()
    saved = json.dumps(store.load("thinking"))
    signature = body("anthropic", "thinking_tool_use")["content"][0]["signature"]
    assert json.dumps(signature)[1:-1] in saved
    with AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=server.url, thinking=THINKING) as fresh:
        result = Agent(fresh, demo_registry()).resume(json.loads(saved)).finish()
    store.close()
    assert result.ok
    assert server.requests[1].json["messages"][1]["content"] == body("anthropic", "thinking_tool_use")["content"]


def test_the_json_lines_log_keeps_the_blocks_of_every_reply(
    server: ProviderServer, model: AnthropicModel, tmp_path: Path
) -> None:
    """Each replied event in the log carries provider_data, from which the served blocks read back exactly."""
    server.queue(*(body("anthropic", name) for name in TURNS))
    Agent(model, demo_registry()).run(QUESTION, log=tmp_path / "run.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text(encoding="utf-8").splitlines()]
    kept = [line["response"]["provider_data"] for line in lines if "provider_data" in line.get("response", {})]
    assert [ProviderData(**data).items() for data in kept] == [body("anthropic", name)["content"] for name in TURNS]


def test_other_adapters_ignore_anthropic_blocks_and_anthropic_ignores_foreign_ones() -> None:
    """A conversation can switch providers: provider_data from elsewhere is not sent, the text and calls are."""
    import anthropic

    reply = from_anthropic_message(anthropic.types.Message.model_validate(body("anthropic", "thinking_tool_use")))
    assert reply.message.provider_data is not None
    chat = to_openai_messages([reply.message])
    assert chat == [
        {
            "role": "assistant",
            "content": "I'll add the first two numbers.",
            "tool_calls": [
                {"id": "toolu_11Add", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
            ],
        }
    ]
    foreign = Message("assistant", "hi", (ToolCall("c1", "add", {"a": 1}),), provider_data=ProviderData("gemini", "[]"))
    _, turns = to_anthropic_messages([foreign])
    assert turns[0]["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 1}},
    ]


def test_the_guards_do_not_look_inside_provider_data() -> None:
    """The same call twice is a repeated action even when each turn's thinking differs: no guard reads it."""

    def turn(thought: str) -> ModelResponse:
        kept = ProviderData("anthropic", json.dumps([{"type": "thinking", "thinking": thought}]), thought)
        return ModelResponse(Message("assistant", "", (ToolCall("t1", "add", {"a": 2, "b": 3}),), provider_data=kept))

    first, second = turn("first I add"), turn("let me add again")
    stop = stop_of(Agent(FakeModel(first, second), demo_registry()))
    assert stop.reason == "repeated_action"
    assert stop.result.messages[-1].provider_data == second.message.provider_data


def test_provider_data_survives_the_result_round_trip_and_keeps_the_record_immutable() -> None:
    """to_json/from_json give back an equal message; items() hands out a copy, so the payload cannot change."""
    import anthropic

    reply = from_anthropic_message(anthropic.types.Message.model_validate(body("anthropic", "thinking_final")))
    data = reply.message.provider_data
    assert data is not None
    items = data.items()
    items[0]["signature"] = "forged"
    assert data.items() == copy.deepcopy(body("anthropic", "thinking_final"))["content"]
    result = RunResult([reply.message], [], reply.message.content)
    assert RunResult.from_json(result.to_json()) == result
