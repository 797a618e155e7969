"""Native structured output: each adapter asks its provider for a typed agent's schema, through the real SDK over HTTP.

A call with ``output=`` must put the provider's own structured-output field
in the request (Chat Completions ``response_format``, Responses
``text.format``, Gemini ``responseMimeType`` + ``responseJsonSchema``,
Anthropic ``output_config.format``), a call without it none of them; the JSON
answer comes back as the reply's text, whether whole or streamed.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from support.provider_server import QUESTION, ProviderServer, Reply, body, streamed

from fsm_agent import Agent, Message, ModelResponse, OutputSchema, RunResult
from fsm_agent.models import AnthropicModel, GeminiModel, OpenAIChatModel, OpenAIResponsesModel
from fsm_agent.testing import demo_registry, edges

KEY = "sk-test-7c1e9a3b5d2f4e6a8b0c"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"value": {"type": "integer"}, "steps": {"type": "array", "items": {"type": "string"}}},
    "required": ["value", "steps"],
    "additionalProperties": False,
}
OUTPUT = OutputSchema("Calculation", SCHEMA, "The worked answer.", strict=True)
ANSWER = '{"value": 20, "steps": ["2+3 = 5", "5*4 = 20"]}'
RECORDED = "(2+3)*4 = 20"
"""The answer text of the recorded replies, which these tests turn into ``ANSWER``."""


@dataclass(frozen=True)
class Provider:
    """One adapter: how to build it, its recorded replies, and where its structured-output field sits."""

    name: str
    build: Callable[[str, dict[str, Any]], Any]
    answer: str
    pieces: tuple[str, ...]
    """The text deltas of the recorded ``stream_final_answer``, in order."""
    native: Callable[[dict[str, Any]], dict[str, Any]]
    """The structured-output fields of a request body (empty when it has none)."""
    expected: Callable[[OutputSchema], dict[str, Any]]


def _chat(url: str, params: dict[str, Any]) -> OpenAIChatModel:
    return OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{url}/v1", max_retries=0, **params)


def _responses(url: str, params: dict[str, Any]) -> OpenAIResponsesModel:
    return OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=f"{url}/v1", max_retries=0, **params)


def _gemini(url: str, params: dict[str, Any]) -> GeminiModel:
    return GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=url, max_retries=0, **params)


def _anthropic(url: str, params: dict[str, Any]) -> AnthropicModel:
    return AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=url, max_retries=0, **params)


def _fields(sent: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: sent[name] for name in names if name in sent}


def _generation_fields(sent: dict[str, Any]) -> dict[str, Any]:
    return _fields(sent.get("generationConfig", {}), "responseMimeType", "responseJsonSchema", "responseSchema")


def _chat_expected(output: OutputSchema) -> dict[str, Any]:
    json_schema = {"name": output.name, "schema": output.schema, "strict": output.strict}
    return {
        "response_format": {"type": "json_schema", "json_schema": {**json_schema, "description": output.description}}
    }


def _responses_expected(output: OutputSchema) -> dict[str, Any]:
    text_format = {"type": "json_schema", "name": output.name, "schema": output.schema, "strict": output.strict}
    return {"text": {"format": {**text_format, "description": output.description}}}


PROVIDERS = [
    Provider(
        "openai",
        _chat,
        "final_answer",
        ("(2+3)*4 ", "= ", "20"),
        lambda sent: _fields(sent, "response_format"),
        _chat_expected,
    ),
    Provider(
        "openai_responses",
        _responses,
        "answer",
        ("(2+3)", "*4 ", "= 20"),
        lambda sent: _fields(sent, "text"),
        _responses_expected,
    ),
    Provider(
        "gemini",
        _gemini,
        "answer",
        ("(2+3)", "*4 = 20"),
        _generation_fields,
        lambda output: {"responseMimeType": "application/json", "responseJsonSchema": output.schema},
    ),
    Provider(
        "anthropic",
        _anthropic,
        "final_answer",
        ("(2+3)*4 ", "= ", "20"),
        lambda sent: _fields(sent, "output_config"),
        lambda output: {"output_config": {"format": {"type": "json_schema", "schema": output.schema}}},
    ),
]
BY_NAME = {provider.name: provider for provider in PROVIDERS}
CALLS = ["complete", "acomplete", "complete_stream", "acomplete_stream"]


def _answering(text: str, originals: tuple[str, ...], answer: str = ANSWER) -> str:
    """``text`` (a reply's JSON or SSE) saying ``answer``: the recorded answer and its deltas replaced, in one pass."""
    size = -(-len(answer) // len(originals))
    replacements = {json.dumps(RECORDED): json.dumps(answer)}
    replacements.update(
        (json.dumps(old), json.dumps(answer[i * size : (i + 1) * size])) for i, old in enumerate(originals)
    )
    pattern = re.compile("|".join(re.escape(old) for old in replacements))
    answered, count = pattern.subn(lambda match: replacements[match.group()], text)
    assert count >= len(originals), "the recorded reply no longer holds the text these tests replace"
    return answered


def _reply(provider: Provider, call: str, answer: str = ANSWER) -> Reply:
    """The recorded final answer of ``provider``, whole or streamed as ``call`` needs, saying ``answer``."""
    if call.endswith("stream"):
        recorded = streamed(provider.name, "stream_final_answer")
        return Reply({}, sse=_answering(recorded.sse or "", provider.pieces, answer))
    return Reply(json.loads(_answering(json.dumps(body(provider.name, provider.answer)), (RECORDED,), answer)))


def _call(model: Any, call: str, *, keep: bool = False, **output: Any) -> tuple[ModelResponse, list[str]]:
    """``model``'s ``call`` on the question with the demo tools, and the text pieces a stream handed on.

    The model is closed afterwards, unless ``keep`` asks to call it again (a sync call only).
    """
    messages, tools = [Message("user", QUESTION)], demo_registry().schemas()
    pieces: list[str] = []
    if call in ("complete", "complete_stream"):
        try:
            if call == "complete":
                return model.complete(messages, tools, **output), pieces
            return model.complete_stream(messages, tools, pieces.append, **output), pieces
        finally:
            if not keep:
                model.close()

    async def go() -> ModelResponse:
        async with model:
            if call == "acomplete":
                response: ModelResponse = await model.acomplete(messages, tools, **output)
            else:
                response = await model.acomplete_stream(messages, tools, pieces.append, **output)
            return response

    return asyncio.run(go()), pieces


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_a_typed_call_sends_the_native_schema_field_and_the_json_answer_is_the_content(
    provider_server: ProviderServer, provider: Provider, call: str
) -> None:
    """With output=, the provider's own structured-output field carries the schema; its JSON text is the reply."""
    provider_server.queue(_reply(provider, call))
    response, pieces = _call(provider.build(provider_server.url, {}), call, output=OUTPUT)
    (sent,) = provider_server.bodies()
    assert provider.native(sent) == provider.expected(OUTPUT)
    assert sent.get("tools"), "the schema goes along with the tools, not instead of them"
    assert response.message.content == ANSWER
    assert response.stop_reason == "end_turn"
    if call.endswith("stream"):
        assert len(pieces) == len(provider.pieces)
        assert "".join(pieces) == ANSWER


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_an_untyped_call_sends_no_structured_output_field_even_after_a_typed_one(
    provider_server: ProviderServer, provider: Provider, call: str
) -> None:
    """Without output=, the request holds none of the fields a schema adds, though the same model just sent one."""
    provider_server.queue(_reply(provider, "complete"), _reply(provider, call))
    model = provider.build(provider_server.url, {})
    _call(model, "complete", keep=True, output=OUTPUT)
    _call(model, call)
    typed, untyped = provider_server.bodies()
    assert provider.native(typed) == provider.expected(OUTPUT)
    assert provider.native(untyped) == {}


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_output_none_sends_the_same_request_as_no_output(provider_server: ProviderServer, provider: Provider) -> None:
    """output=None means a plain-text answer: the body is the one sent without the keyword."""
    provider_server.queue(_reply(provider, "complete"), _reply(provider, "complete"))
    _call(provider.build(provider_server.url, {}), "complete")
    _call(provider.build(provider_server.url, {}), "complete", output=None)
    without, with_none = provider_server.bodies()
    assert with_none == without
    assert provider.native(with_none) == {}


@pytest.mark.parametrize("provider", ["openai", "openai_responses"])
def test_openai_sends_strict_as_the_schema_says_and_no_empty_description(
    provider_server: ProviderServer, provider: str
) -> None:
    """A schema that misses strict mode's rules goes with strict false, and with no description key if it has none."""
    loose = OutputSchema("Loose", {"type": "object", "properties": {"note": {"type": "string"}}})
    provider_server.queue(_reply(BY_NAME[provider], "complete"))
    _call(BY_NAME[provider].build(provider_server.url, {}), "complete", output=loose)
    (sent,) = provider_server.bodies()
    fields = {"name": "Loose", "schema": loose.schema, "strict": False}
    if provider == "openai":
        assert sent["response_format"] == {"type": "json_schema", "json_schema": fields}
    else:
        assert sent["text"] == {"format": {"type": "json_schema", **fields}}


def test_responses_merges_the_schema_into_a_text_param_and_keeps_its_verbosity(
    provider_server: ProviderServer,
) -> None:
    """text={"verbosity": ...} from params gains the format on a typed call and is sent unchanged on an untyped one."""
    provider = BY_NAME["openai_responses"]
    provider_server.queue(_reply(provider, "complete"), _reply(provider, "complete"))
    model = provider.build(provider_server.url, {"text": {"verbosity": "low"}})
    _call(model, "complete", keep=True, output=OUTPUT)
    _call(model, "complete")
    typed, untyped = provider_server.bodies()
    assert typed["text"] == {"verbosity": "low", **_responses_expected(OUTPUT)["text"]}
    assert untyped["text"] == {"verbosity": "low"}
    assert model.params["text"] == {"verbosity": "low"}


def test_anthropic_merges_the_format_into_an_output_config_param_and_keeps_its_effort(
    provider_server: ProviderServer,
) -> None:
    """output_config={"effort": ...} from params gains the format on a typed call and is sent unchanged otherwise."""
    provider = BY_NAME["anthropic"]
    provider_server.queue(_reply(provider, "complete_stream"), _reply(provider, "complete"))
    model = provider.build(provider_server.url, {"output_config": {"effort": "low"}})
    _call(model, "complete_stream", keep=True, output=OUTPUT)
    _call(model, "complete")
    typed, untyped = provider_server.bodies()
    assert typed["output_config"] == {"effort": "low", "format": {"type": "json_schema", "schema": SCHEMA}}
    assert untyped["output_config"] == {"effort": "low"}


def test_anthropic_sends_the_format_alongside_tools_and_extended_thinking(provider_server: ProviderServer) -> None:
    """The documented combination: JSON outputs constrain the answer only, so thinking and tools stay in the request."""
    provider = BY_NAME["anthropic"]
    provider_server.queue(_reply(provider, "complete"))
    thinking = {"type": "enabled", "budget_tokens": 1024}
    response, _ = _call(provider.build(provider_server.url, {"thinking": thinking}), "complete", output=OUTPUT)
    (sent,) = provider_server.bodies()
    assert sent["thinking"] == thinking
    assert [tool["name"] for tool in sent["tools"]] == [s["name"] for s in demo_registry().schemas()]
    assert sent["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    assert response.message.content == ANSWER


def test_gemini_accepts_a_json_mime_type_param_alongside_the_schema(provider_server: ProviderServer) -> None:
    """response_mime_type="application/json" in params is the JSON mode the schema needs anyway, not a clash."""
    provider = BY_NAME["gemini"]
    provider_server.queue(_reply(provider, "complete"))
    _call(provider.build(provider_server.url, {"response_mime_type": "application/json"}), "complete", output=OUTPUT)
    (sent,) = provider_server.bodies()
    assert _generation_fields(sent) == {"responseMimeType": "application/json", "responseJsonSchema": SCHEMA}


CLASHES = [
    ("openai", {"response_format": {"type": "json_object"}}, "response_format"),
    ("openai_responses", {"text": {"format": {"type": "json_object"}}}, "text.format"),
    ("gemini", {"response_schema": {"type": "OBJECT"}}, "response_schema"),
    ("gemini", {"response_json_schema": {"type": "object"}}, "response_json_schema"),
    ("gemini", {"response_mime_type": "text/x.enum"}, "response_mime_type"),
    ("anthropic", {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}, "output_config.format"),
]


@pytest.mark.parametrize(("provider", "params", "named"), CLASHES, ids=[clash[2] for clash in CLASHES])
def test_a_param_that_sets_the_schema_field_itself_is_refused_on_a_typed_call_and_sent_on_an_untyped_one(
    provider_server: ProviderServer, provider: str, params: dict[str, Any], named: str
) -> None:
    """Params asking for their own answer format clash with output=: ValueError naming both, nothing sent."""
    model = BY_NAME[provider].build(provider_server.url, params)
    with pytest.raises(ValueError, match=rf"params set {re.escape(named)}\b.*output type 'Calculation'"):
        _call(model, "complete", keep=True, output=OUTPUT)
    assert provider_server.requests == []
    provider_server.queue(_reply(BY_NAME[provider], "complete"))
    _call(model, "complete")
    (sent,) = provider_server.bodies()
    assert BY_NAME[provider].native(sent), "without output= the param goes to the provider as given"


def test_anthropic_sends_a_copy_of_the_schema_adapted_to_claudes_rules(provider_server: ProviderServer) -> None:
    """In the copy sent, objects are closed and refused limits become description text; the caller's schema stays."""
    schema = {
        "type": "object",
        "description": "A measured answer.",
        "properties": {
            "minimum": {"type": "integer", "minimum": 0, "maximum": 10},
            "label": {"type": "string", "maxLength": 40, "format": "password"},
            "link": {"type": "string", "format": "uri"},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "minItems": 1},
            "pair": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "either": {"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}}, {"type": "null"}]},
        },
        "required": ["minimum", "label"],
        "$defs": {"Tag": {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}}}},
    }
    before = copy.deepcopy(schema)
    provider_server.queue(_reply(BY_NAME["anthropic"], "complete"))
    _call(BY_NAME["anthropic"].build(provider_server.url, {}), "complete", output=OutputSchema("Measured", schema))
    (sent,) = provider_server.bodies()
    assert sent["output_config"]["format"]["schema"] == {
        "type": "object",
        "description": "A measured answer.",
        "properties": {
            "minimum": {"type": "integer", "description": "{minimum: 0, maximum: 10}"},
            "label": {"type": "string", "description": '{maxLength: 40, format: "password"}'},
            "link": {"type": "string", "format": "uri"},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "minItems": 1},
            "pair": {"type": "array", "items": {"type": "number"}, "description": "{minItems: 2, maxItems: 2}"},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "either": {
                "anyOf": [
                    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
                    {"type": "null"},
                ]
            },
        },
        "required": ["minimum", "label"],
        "$defs": {
            "Tag": {
                "type": "object",
                "properties": {"name": {"type": "string", "description": "{minLength: 1}"}},
                "additionalProperties": False,
            }
        },
        "additionalProperties": False,
    }
    assert schema == before


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_a_typed_agent_sends_an_invalid_answer_back_through_each_adapter_and_returns_the_valid_one(
    provider_server: ProviderServer, provider: Provider, driver: str
) -> None:
    """An answer missing a field goes back with the error (one retry, two requests, both with the schema)."""
    provider_server.queue(_reply(provider, "complete", '{"value": 20}'), _reply(provider, "complete"))
    model = provider.build(provider_server.url, {})
    typed = {**SCHEMA, "description": OUTPUT.description}
    agent = Agent(model, demo_registry(), output_type=typed)

    async def arun() -> RunResult:
        async with model:
            return await agent.arun(QUESTION)

    result = agent.run(QUESTION) if driver == "sync" else asyncio.run(arun())
    assert result.output == json.loads(ANSWER)
    assert "Dispatch->AwaitModel[output_invalid]" in edges(result)
    first, second = provider_server.bodies()
    request = OutputSchema("output", typed, OUTPUT.description, strict=True)
    assert provider.native(first) == provider.native(second) == provider.expected(request)
    assert "'steps' is a required property" in json.dumps(second)
    assert "'steps' is a required property" not in json.dumps(first)
