"""The Gemini adapter, through the official google-genai SDK over real HTTP, against a server enforcing its rule."""

from __future__ import annotations

import asyncio
import base64
import copy
import email.utils
import json
import logging
import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from support.provider_rules import gemini_thought_signatures
from support.provider_server import QUESTION, ProviderServer, Reply, body, stop_of, streamed

from fsm_agent import Agent, AgentLoopError, Message, ProviderData, ToolCall, Usage
from fsm_agent.cli.main import main
from fsm_agent.core.reply_checks import MAX_NESTING
from fsm_agent.models import GeminiModel, MalformedReplyError
from fsm_agent.models.gemini_wire import DERIVED_ID_PREFIX, to_gemini_contents
from fsm_agent.models.redaction import REDACTED
from fsm_agent.records import STOP_REASONS as ENGINE_STOP_REASONS
from fsm_agent.testing import demo_registry

if TYPE_CHECKING:
    from google import genai

CANARY = "LEAKCANARY"
KEY = f"AIza-{CANARY}-5e4d3c2b1a0f9e8d"
TURNS = ("thought_call", "thought_second_call", "final_answer")
THINKING = {"thinking_config": {"include_thoughts": True, "thinking_budget": 1024}}


@pytest.fixture
def server(provider_server: ProviderServer) -> ProviderServer:
    """The loopback server, refusing a function call whose thought signature is missing or altered."""
    provider_server.rules.append(gemini_thought_signatures)
    return provider_server


def _client(url: str, key: str = KEY, attempts: int = 1) -> genai.Client:
    """A client with millisecond retries, so retry tests do not wait the SDK's default second."""
    from google import genai
    from google.genai import types

    retry = types.HttpRetryOptions(attempts=attempts, initial_delay=0.001, max_delay=0.002, jitter=0)
    return genai.Client(api_key=key, http_options=types.HttpOptions(base_url=url, retry_options=retry))


@pytest.fixture
def model(server: ProviderServer) -> Iterator[GeminiModel]:
    """An adapter with thinking on, talking to the enforcing server."""
    with GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url, max_retries=0, **THINKING) as adapter:
        yield adapter


def _with(name: str, **fields: Any) -> dict[str, Any]:
    data = copy.deepcopy(body("gemini", name))
    data["candidates"][0].update(fields)
    return data


def test_a_thinking_agent_completes_a_multi_tool_run_sending_signed_parts_back_in_place(
    server: ProviderServer, model: GeminiModel
) -> None:
    """Two tool turns and an answer; each later request carries the model turns' parts with their signatures."""
    server.queue(*(body("gemini", name) for name in TURNS))
    result = Agent(model, demo_registry(), "Be terse.").run(QUESTION)
    assert result.ok
    assert result.final == "(2+3)*4 = 20"
    first, _, last = server.requests
    assert first.path.endswith("/models/gemini-2.5-flash:generateContent")  # v1 or v1beta, as the SDK chooses
    assert first.headers["x-goog-api-key"] == KEY
    assert first.json["systemInstruction"] == {"parts": [{"text": "Be terse."}], "role": "user"}
    # The SDK spells nested config keys its own way (snake_case in 3.x); the values are what matter here.
    assert sorted(first.json["generationConfig"]["thinkingConfig"].values()) == [True, 1024]
    declaration = first.json["tools"][0]["functionDeclarations"][1]
    assert declaration["name"] == "add"
    assert declaration["parameters_json_schema"] == demo_registry().schemas()[1]["parameters"]
    contents = last.json["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user", "model", "user"]
    sent = contents[1]["parts"][1]
    served = body("gemini", "thought_call")["candidates"][0]["content"]["parts"][1]
    assert sent["functionCall"] == served["functionCall"]
    assert base64.urlsafe_b64decode(sent["thoughtSignature"]) == base64.b64decode(served["thoughtSignature"])
    assert contents[2]["parts"] == [{"functionResponse": {"name": "add", "response": {"output": 5}}}]
    assert contents[4]["parts"] == [
        {"functionResponse": {"id": "echo-call-7", "name": "echo", "response": {"output": "5 times 4 is 20"}}}
    ]


def test_calls_without_ids_get_stable_derived_ids_that_are_never_sent(
    server: ProviderServer, model: GeminiModel
) -> None:
    """Gemini's id is kept where it gave one; otherwise the id comes from the response id and position."""
    server.queue(*(body("gemini", name) for name in TURNS))
    result = Agent(model, demo_registry()).run(QUESTION)
    calls = [call for m in result.messages for call in m.tool_calls]
    assert [c.id for c in calls] == [f"{DERIVED_ID_PREFIX}gem-resp-01-0", "echo-call-7"]
    assert "gem-resp-01" not in json.dumps(server.requests[-1].json)


def _first_reply(server: ProviderServer, model: GeminiModel) -> list[Message]:
    server.queue(body("gemini", "thought_call"))
    asked = [Message("user", QUESTION)]
    reply = model.complete(asked, demo_registry().schemas()).message
    return [*asked, reply, Message("tool", "5", tool_call_id=reply.tool_calls[0].id)]


def test_the_server_refuses_a_function_call_without_its_thought_signature_as_the_real_api_does(
    server: ProviderServer, model: GeminiModel
) -> None:
    """The call rebuilt without the signed parts is Gemini's 400 INVALID_ARGUMENT naming the missing signature."""
    from google.genai import errors as genai_errors

    conversation = _first_reply(server, model)
    conversation[1] = Message("assistant", "", conversation[1].tool_calls)
    with pytest.raises(genai_errors.ClientError, match="missing a thought_signature") as info:
        model.complete(conversation, demo_registry().schemas())
    assert info.value.code == 400


def test_the_server_refuses_an_altered_thought_signature(server: ProviderServer, model: GeminiModel) -> None:
    """A signature whose bytes changed is refused too."""
    from google.genai import errors as genai_errors

    conversation = _first_reply(server, model)
    data = conversation[1].provider_data
    assert data is not None
    parts = data.items()
    parts[1]["thoughtSignature"] = base64.b64encode(b"forged signature").decode()
    forged = ProviderData(data.provider, json.dumps(parts), data.thinking)
    conversation[1] = Message("assistant", "", conversation[1].tool_calls, provider_data=forged)
    with pytest.raises(genai_errors.ClientError, match="Corrupted thought signature"):
        model.complete(conversation, demo_registry().schemas())


def test_thought_parts_are_thinking_never_the_answer(server: ProviderServer, model: GeminiModel) -> None:
    """A thought part's text is provider_data's thinking; the message text holds no thought."""
    conversation = _first_reply(server, model)
    data = conversation[1].provider_data
    assert data is not None
    assert data.thinking == "**Adding first**\n\nI'll add 2 and 3, then multiply by 4."
    assert conversation[1].content == ""


def test_a_resume_from_a_snapshot_between_turns_sends_the_signature_back_byte_for_byte(
    server: ProviderServer, model: GeminiModel
) -> None:
    """The snapshot text holds the signature as served; a new adapter resuming it sends the same bytes."""
    server.queue(*(body("gemini", name) for name in TURNS))
    run = Agent(model, demo_registry()).start(QUESTION)
    while not (run.state == "AwaitModel" and run.steps):
        run.advance()
    saved = json.dumps(run.snapshot())
    served = body("gemini", "thought_call")["candidates"][0]["content"]["parts"][1]["thoughtSignature"]
    assert served in saved
    with GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url) as fresh:
        result = Agent(fresh, demo_registry()).resume(saved).finish()
    assert result.ok
    sent = server.requests[1].json["contents"][1]["parts"][1]["thoughtSignature"]
    assert base64.urlsafe_b64decode(sent) == base64.b64decode(served)


@pytest.mark.parametrize(("finish", "stop_reason"), sorted(GeminiModel.finish_reasons.items()))
def test_every_finish_reason_maps_onto_the_engine_vocabulary(
    server: ProviderServer, model: GeminiModel, finish: str, stop_reason: str
) -> None:
    """Each finishReason in the table arrives as the engine stop_reason the provider guide promises."""
    server.queue(_with("answer", finishReason=finish))
    assert model.complete([Message("user", QUESTION)], []).stop_reason == stop_reason
    assert stop_reason in ENGINE_STOP_REASONS


@pytest.mark.parametrize(
    ("name", "reason", "final"),
    [
        ("max_tokens", "max_tokens", "Let me work this out step by step: first, 2+3 is"),
        ("safety", "refusal", ""),
        ("blocked_prompt", "refusal", "the prompt was blocked: PROHIBITED_CONTENT"),
    ],
)
def test_truncation_safety_and_a_blocked_prompt_stop_the_run(
    server: ProviderServer, model: GeminiModel, name: str, reason: str, final: str
) -> None:
    """MAX_TOKENS keeps the cut text; SAFETY and a prompt blocked before any candidate are refusals."""
    server.queue(body("gemini", name))
    stop = stop_of(Agent(model, demo_registry()))
    assert (stop.reason, stop.result.final) == (reason, final)


def test_a_malformed_function_call_is_a_tool_failure_the_model_corrects(
    server: ProviderServer, model: GeminiModel
) -> None:
    """MALFORMED_FUNCTION_CALL fails as a tool call; the model is told why, as text, and answers next turn.

    The SDK does not pass Gemini's finishMessage on, so the call is named
    after the finish reason; the failure counts toward tool_failures.
    """
    server.queue(body("gemini", "malformed_call"), body("gemini", "answer"))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.ok
    call = result.messages[1].tool_calls[0]
    assert call.name == "malformed_function_call"
    assert call.raw_arguments == "MALFORMED_FUNCTION_CALL: Gemini could not produce a valid function call"
    assert json.loads(result.messages[2].content)["error"].startswith("unknown tool 'malformed_function_call'")
    model_turn, told = server.requests[1].json["contents"][1:]
    assert model_turn["parts"] == [
        {"text": f"[call to malformed_function_call with arguments that are not an object: {call.raw_arguments}]"}
    ]
    assert told["parts"][0]["text"].startswith("[result of malformed_function_call: ")


def test_an_unknown_finish_reason_is_a_model_error_with_the_reply_kept(
    server: ProviderServer, model: GeminiModel
) -> None:
    """A finishReason outside the table (here OTHER) is never taken for an answer."""
    server.queue(_with("answer", finishReason="OTHER"))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert "unknown stop_reason 'OTHER'" in stop.evidence["error"]
    assert stop.result.messages[-1] == Message("assistant", "(2+3)*4 = 20")


def test_usage_counts_thoughts_as_output_and_absent_counts_as_zero(server: ProviderServer, model: GeminiModel) -> None:
    """promptTokenCount is the input; candidates plus thoughts the output (the thoughts its reasoning part);
    Gemini leaves zero counts out."""
    server.queue(*(body("gemini", name) for name in TURNS))
    result = Agent(model, demo_registry()).run(QUESTION)
    assert result.usage == Usage(80 + 140 + 170, (15 + 120) + (12 + 60) + 9, reasoning_tokens=120 + 60)


@pytest.mark.parametrize(
    ("reply", "field"),
    [
        ({**body("gemini", "answer"), "usageMetadata": {"promptTokenCount": -1}}, "usage.prompt_token_count"),
        (_with("answer", content={"role": "model", "parts": [{"functionCall": {"args": {}}}]}), None),
        ({"usageMetadata": {"promptTokenCount": 3}}, "candidates"),
    ],
    ids=["negative-count", "call-without-name", "no-candidates"],
)
def test_a_malformed_reply_is_a_model_error_naming_the_field(
    server: ProviderServer, model: GeminiModel, reply: dict[str, Any], field: str | None
) -> None:
    """A negative count, a function call without a name, or no candidate and no reason why is refused by name."""
    server.queue(reply)
    stop = stop_of(Agent(model, demo_registry()))
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert stop.__cause__.field == (field or "candidates[0].content.parts[0].functionCall.name")


def test_a_reply_of_only_parts_the_adapter_does_not_read_is_a_model_error_saying_what_arrived(
    server: ProviderServer, model: GeminiModel
) -> None:
    """A STOP holding only an image, or a part the SDK could not read at all, is no empty answer."""
    image = {"inlineData": {"mimeType": "image/png", "data": "aGVsbG8="}}
    server.queue(_with("answer", content={"role": "model", "parts": [image, {"hologram": {"x": 1}}]}))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert str(stop.__cause__) == (
        "malformed provider reply: candidates[0].content.parts holds no text or tool call, only what this adapter "
        "does not read: candidates[0].content.parts[0] with inlineData, "
        "candidates[0].content.parts[1] with nothing the SDK could read"
    )


EMPTY = "malformed provider reply: candidates[0].content is empty"


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (body("gemini", "empty_content"), "(finishReason STOP)"),
        (_with("answer", content=None), "(finishReason STOP)"),
        (_with("answer", content={"role": "model", "parts": []}), "(finishReason STOP)"),
        (_with("answer", content=None, finishReason="OTHER"), "(finishReason OTHER)"),
        ({"candidates": [{}], "usageMetadata": {"promptTokenCount": 3}}, "(no finishReason)"),
    ],
    ids=["role-only", "content-null", "no-parts", "other-no-content", "empty-candidate"],
)
def test_a_candidate_without_content_is_a_model_error_naming_its_finish_reason(
    server: ProviderServer, model: GeminiModel, reply: dict[str, Any], why: str
) -> None:
    """No content, or content without parts, is no empty answer: the run stops model_error saying so and why."""
    server.queue(reply)
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert stop.__cause__.field == "candidates[0].content"
    assert str(stop.__cause__).startswith(f"{EMPTY} {why}")


@pytest.mark.parametrize("streaming", [False, True], ids=["unstreamed", "streamed"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_reply_without_content_stops_model_error_on_both_drivers_streamed_or_not(
    server: ProviderServer, driver: str, streaming: bool
) -> None:
    """The recorded empty reply, unstreamed and as a stream, ends model_error through run and arun alike."""
    server.queue(streamed("gemini", "stream_empty_content") if streaming else body("gemini", "empty_content"))
    model = GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url, max_retries=0)
    agent = Agent(model, demo_registry())
    if streaming:
        agent.on("text", lambda delta: None)  # a text listener makes the drivers stream

    async def go() -> None:
        async with model:
            await agent.arun(QUESTION)

    def sync() -> None:
        with model:
            agent.run(QUESTION)

    with pytest.raises(AgentLoopError) as info:
        sync() if driver == "sync" else asyncio.run(go())
    assert info.value.reason == "model_error"
    assert str(info.value.__cause__).startswith(f"{EMPTY} (finishReason STOP)")
    assert server.requests[0].path.endswith(":streamGenerateContent?alt=sse" if streaming else ":generateContent")


def test_an_html_page_answered_with_200_is_a_model_error_showing_what_arrived(
    server: ProviderServer, model: GeminiModel
) -> None:
    """A proxy's page with status 200 is refused as text, not reported as the SDK's bare JSON error."""
    page = "<!DOCTYPE html><html><body>Bad gateway</body></html>"
    server.queue(Reply({}, html=page))
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert str(stop.__cause__) == f"malformed provider reply: response body is not JSON: {page!r}"


def test_a_429_is_retried_and_a_persistent_500_stops_with_the_provider_error_as_cause(server: ProviderServer) -> None:
    """With a client allowing three attempts, a 429 is retried; three 500s end in model_error, the SDK's error kept."""
    from google.genai import errors as genai_errors

    client = _client(server.url, attempts=3)
    model = GeminiModel("gemini-2.5-flash", client)
    server.queue(Reply(body("gemini", "error_429"), 429), body("gemini", "answer"))
    assert Agent(model, demo_registry()).run(QUESTION).ok
    assert server.requests[0].json == server.requests[1].json
    server.queue(*[Reply(body("gemini", "error_500"), 500)] * 3)
    stop = stop_of(Agent(model, demo_registry()))
    assert isinstance(stop.__cause__, genai_errors.ServerError)
    assert len(server.requests) == 5
    client.close()


def _recorded(model: GeminiModel, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits of ``model``'s retries, recorded instead of waited (sync and async alike)."""
    slept: list[float] = []

    async def asleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(model, "_pause", slept.append)
    monkeypatch.setattr(model, "_apause", asleep)
    return slept


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_retries_wait_as_long_as_retry_after_asks_on_a_429_and_a_503(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch, driver: str
) -> None:
    """Retry-After: 30 on a 429, then an HTTP date two minutes away on a 503: the waits are the server's."""
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    server.queue(
        Reply(body("gemini", "error_429"), 429, {"retry-after": "30"}),
        Reply(body("gemini", "error_503"), 503, {"retry-after": later}),
        body("gemini", "answer"),
    )
    with GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url) as model:
        slept = _recorded(model, monkeypatch)
        agent = Agent(model, demo_registry())
        result = agent.run(QUESTION) if driver == "sync" else asyncio.run(agent.arun(QUESTION))
    assert result.ok
    assert len(server.requests) == 3
    assert slept[0] == 30
    assert 110 < slept[1] <= 120  # the date is whole seconds, read a moment after it was written


def test_a_retry_after_past_two_minutes_is_not_waited_and_no_header_keeps_the_backoff(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An hour's Retry-After ends the call at once (model_error, resumable); a 429 without one is still retried."""
    from google.genai import errors as genai_errors

    server.queue(Reply(body("gemini", "error_429"), 429, {"retry-after": "3600"}))
    with GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url) as model:
        slept = _recorded(model, monkeypatch)
        stop = stop_of(Agent(model, demo_registry()))
        assert isinstance(stop.__cause__, genai_errors.ClientError)
        assert (len(server.requests), slept) == (1, [])
        server.queue(Reply(body("gemini", "error_429"), 429), body("gemini", "answer"))
        assert Agent(model, demo_registry()).run(QUESTION).ok
    assert len(slept) == 1


def test_a_retry_after_longer_than_the_run_has_left_ends_at_the_deadline_without_a_retry(
    server: ProviderServer,
) -> None:
    """The wait is cut by the run's timeout (the async driver cancels it): timeout, one request, no retry after."""
    server.queue(Reply(body("gemini", "error_429"), 429, {"retry-after": "30"}), body("gemini", "answer"))
    with GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url) as model:
        agent = Agent(model, demo_registry(), timeout=0.2)
        with pytest.raises(AgentLoopError) as info:
            asyncio.run(agent.arun(QUESTION))
    assert info.value.reason == "timeout"
    assert len(server.requests) == 1


@pytest.mark.parametrize("response_id", [True, False], ids=["with-response-id", "without-response-id"])
def test_arguments_nested_700_deep_are_a_model_error_naming_the_field(
    server: ProviderServer, model: GeminiModel, response_id: bool
) -> None:
    """Valid JSON nested far past the engine's limit is refused once, by name, before anything walks it."""
    args: dict[str, Any] = {"a": 1}
    for _ in range(700):
        args = {"x": args}
    part = {"functionCall": {"name": "echo", "args": args}, "thoughtSignature": "c2lnbmVk"}
    data = _with("answer", content={"role": "model", "parts": [part]})
    if not response_id:
        del data["responseId"]
    server.queue(data)
    stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert stop.__cause__.field == "candidates[0].content.parts[0].functionCall.args"
    assert str(stop.__cause__).endswith(f"nests deeper than {MAX_NESTING} levels")


def test_acomplete_uses_the_async_side_of_the_client(server: ProviderServer) -> None:
    """The async path sends the same request through client.aio and keeps the signed parts the same way."""
    server.queue(body("gemini", "thought_call"))
    model = GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url)

    async def go() -> Any:
        async with model:
            return await model.acomplete([Message("user", QUESTION)], demo_registry().schemas())

    response = asyncio.run(go())
    assert response.message.tool_calls == (ToolCall(f"{DERIVED_ID_PREFIX}gem-resp-01-0", "add", {"a": 2, "b": 3}),)
    assert response.message.provider_data is not None
    assert server.requests[0].headers["x-goog-api-key"] == KEY


def test_a_key_echoed_by_a_401_and_a_key_with_a_newline_are_kept_out_of_everything(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """GEMINI_API_KEY with its newline is stripped and sent; a 401 quoting it leaves no trace in the error chain."""
    from google.genai import errors as genai_errors

    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", f"{KEY}\n")
    message = f"API key not valid: {KEY}"
    server.queue(Reply({"error": {"code": 401, "message": message, "status": "UNAUTHENTICATED"}}, 401))
    with GeminiModel("gemini-2.5-flash", base_url=server.url, max_retries=0) as model, caplog.at_level(logging.DEBUG):
        stop = stop_of(Agent(model, demo_registry()))
    assert server.requests[0].headers["x-goog-api-key"] == KEY
    assert isinstance(stop.__cause__, genai_errors.ClientError)
    shown = "".join(traceback.format_exception(stop)) + stop.result.to_json() + caplog.text
    assert CANARY not in shown
    assert f"API key not valid: {REDACTED}" in str(stop.__cause__)


def test_a_password_in_base_url_becomes_basic_auth_and_an_unreachable_server_is_named(unused_port: int) -> None:
    """user:password@ leaves the URL (repr shows it redacted); a refused connection names the URL it tried."""
    url = f"http://u:{CANARY}-pw@127.0.0.1:{unused_port}"
    with GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=url, max_retries=0) as m:
        assert m.base_url == f"http://127.0.0.1:{unused_port}"
        stop = stop_of(Agent(m, demo_registry()))
    assert stop.reason == "model_error"
    assert str(stop.__cause__).startswith(f"Connection error: cannot reach http://127.0.0.1:{unused_port}")
    assert CANARY not in "".join(traceback.format_exception(stop)) + repr(m)


def test_settings_are_checked_at_construction() -> None:
    """Reserved params, a misspelt config field and a key no header can carry are refused before any call."""
    with pytest.raises(TypeError, match="sets tools itself"):
        GeminiModel("gemini-2.5-flash", api_key=KEY, tools=[])
    with pytest.raises(ValueError, match="temprature"):
        GeminiModel("gemini-2.5-flash", api_key=KEY, temprature=0)
    with pytest.raises(ValueError, match="api_key has SPACE at position 4") as info:
        GeminiModel("gemini-2.5-flash", api_key=f"{KEY[:4]} {KEY[4:]}")
    assert CANARY not in str(info.value)


def test_conversion_pairs_results_by_name_and_sends_undecodable_calls_as_text() -> None:
    """Results of one turn share a user content; a call whose arguments never decoded travels as text both ways."""
    messages = [
        Message("system", "Be terse."),
        Message("user", QUESTION),
        Message("assistant", "", (ToolCall("c1", "add", {"a": 2}), ToolCall("c2", "add", raw_arguments="{"))),
        Message("tool", '{"error": "bad"}', tool_call_id="c1"),
        Message("tool", "not json", tool_call_id="c2"),
    ]
    system, contents = to_gemini_contents(messages)
    assert system == "Be terse."
    assert contents[1:] == [
        {
            "role": "model",
            "parts": [
                {"functionCall": {"name": "add", "args": {"a": 2}, "id": "c1"}},
                {"text": "[call to add with arguments that are not an object: {]"},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "add", "response": {"error": "bad"}, "id": "c1"}},
                {"text": "[result of add: not json]"},
            ],
        },
    ]


def test_the_run_command_takes_gemini_and_the_key_from_gemini_api_key(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--model gemini:NAME`` reads GOOGLE_API_KEY, else GEMINI_API_KEY as the SDK does, and prints the answer."""
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    server.queue(body("gemini", "answer"))
    assert main(["run", QUESTION, "--model", "gemini:gemini-2.5-flash", "--base-url", server.url, "--quiet"]) == 0
    assert capsys.readouterr().out == "(2+3)*4 = 20\n"
    assert server.requests[0].headers["x-goog-api-key"] == KEY
