"""Each adapter's context-length error becomes ``ContextOverflowError``, through the official SDKs over real HTTP.

The canned bodies in ``tests/support/provider_bodies/<provider>/`` are the providers' own answers, as reported
from their APIs (the numbers are those of the reports):

- OpenAI Chat Completions, ``openai/error_context_length.json``: HTTP 400, ``error.code``
  ``context_length_exceeded``, "This model's maximum context length is N tokens. However, your messages
  resulted in M tokens. ..." (crewAIInc/crewAI-examples#121, chathub-dev/chathub#126, and
  webtimemachine/wtm2#579, whose 128000 and 204308 these are).  Other wordings: the legacy "you requested
  N tokens (M in the messages, K in the completion)" (mckaywrigley/chatbot-ui#102), and "Input tokens
  exceed the configured limit of 272000 tokens. Your messages resulted in 3148588 tokens." (coder's
  aibridge fixture ``fixtures/openai/chatcompletions/non_stream_error.txtar``).
- OpenAI Responses API, ``openai_responses/``: the same error object with "Your input exceeds the context
  window of this model. Please adjust your input and try again." and ``param`` "input", which arrives as a
  400 (``error_context_length.json``, james-6-23/codex2api#415), as an ``error`` event nesting it in a
  stream (``stream_error_context_length.sse``, verbatim from dyad-sh/dyad#1672), as the flat
  ``ResponseErrorEvent`` of the API reference (``stream_error_event_context_length.sse``: type, code,
  message, param, sequence_number), or as a ``response.failed`` event whose ``response.error`` has that
  code (``stream_failed_context_length.sse``, from openai/codex#4675's recorded stream).
- Anthropic, ``anthropic/error_context_length.json``: HTTP 400 ``invalid_request_error`` "prompt is too
  long: 208310 tokens > 200000 maximum" (anthropics/claude-code#12186; earendil-works/pi#102), and
  ``error_context_limit_max_tokens.json``: "input length and `max_tokens` exceed context limit: 178959 +
  64000 > 200000, ..." (docker/docker-agent#569, anthropics/claude-code#228).
- OpenAI-compatible servers, through the Chat Completions adapter: vLLM's 400
  (``openai/error_context_length_vllm.json``: type ``BadRequestError``, code 400, its current wording "This model's
  maximum context length is N tokens. However, you requested K output tokens and your prompt contains at least M
  input tokens, ... (parameter=input_tokens, value=M)"; the other wordings its versions used are read in
  ``test_compatible_context_messages_give_the_input_length_and_the_window``), and llama.cpp's server
  (``openai/error_context_length_llamacpp.json``: type ``exceed_context_size_error`` with ``n_prompt_tokens`` and
  ``n_ctx``).
- Gemini, ``gemini/error_context_length.json``: HTTP 400 ``INVALID_ARGUMENT`` "The input token count
  (1200293) exceeds the maximum number of tokens allowed (1048576)." (google-gemini/gemini-cli#6678, #4231).

The other 400s, which must stay as they were: OpenAI's ``invalid_function_parameters`` (github/github-mcp-server#1548,
anomalyco/opencode#441), vLLM's "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to
be set", llama.cpp's "tools param requires --jinja flag", Anthropic's "tools.N.custom.input_schema: JSON schema is
invalid." (anthropics/claude-code#9605) and Gemini's "Function calling with a response mime type: 'application/json'
is unsupported" (quoted in the Gemini adapter's docstring).
"""

from __future__ import annotations

import asyncio
import copy
import json
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from support.provider_server import QUESTION, ProviderServer, Reply, body, stop_of, streamed
from support.sdk import sdk_attribute

from fsm_agent import Agent, AgentLoopError, ContextOverflowError, Message
from fsm_agent.models import AnthropicModel, GeminiModel, OpenAIChatModel, OpenAIResponsesModel
from fsm_agent.models.openai_client import compatible_overflow
from fsm_agent.models.openai_client import context_overflow as openai_overflow
from fsm_agent.models.provider import ProviderModel
from fsm_agent.models.redaction import REDACTED
from fsm_agent.testing import demo_registry

CANARY = "LEAKCANARY"
KEY = f"sk-test-{CANARY}-4f7c0d9e2b1a8c3f"
WINDOW = "Your input exceeds the context window of this model. Please adjust your input and try again."


@dataclass(frozen=True)
class Provider:
    """An adapter, its provider's context-length answer and what the adapter must make of it."""

    name: str
    build: Callable[[str], ProviderModel]
    """The adapter talking to the loopback server at this URL, with ``KEY``."""
    folder: str
    message: str
    tokens: int | None
    limit: int | None
    cause_path: str
    """The SDK's exception for the 400, which becomes the overflow's ``__cause__`` (as module:name)."""
    other_path: str
    """What another 400 of the provider's (``other_body``) raised, and still raises (as module:name)."""
    other_body: str
    overflow_body: str = "error_context_length"

    @property
    def cause(self) -> type[BaseException]:
        """The SDK's exception for the 400, imported now."""
        cause: type[BaseException] = sdk_attribute(self.cause_path)
        return cause

    @property
    def other(self) -> type[BaseException]:
        """The SDK's exception for another 400, imported now."""
        other: type[BaseException] = sdk_attribute(self.other_path)
        return other

    def overflow(self, suffix: str = "") -> Reply:
        """The provider's context-length 400, its message extended by ``suffix``."""
        data = copy.deepcopy(body(self.folder, self.overflow_body))
        data["error"]["message"] += suffix
        return Reply(data, 400)

    def another_400(self) -> Reply:
        return Reply(body(self.folder, self.other_body), 400)


def compatible(name: str, overflow: str, tokens: int, limit: int, other: str) -> Provider:
    """An OpenAI-compatible server behind the Chat Completions adapter, its 400s recorded in ``openai/``."""
    return Provider(
        name,
        lambda url: OpenAIChatModel("local-model", api_key=KEY, base_url=f"{url}/v1", max_retries=0),
        "openai",
        body("openai", overflow)["error"]["message"],
        tokens,
        limit,
        "openai:BadRequestError",
        "openai:BadRequestError",
        other,
        overflow,
    )


PROVIDERS = [
    Provider(
        "openai-chat",
        lambda url: OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{url}/v1", max_retries=0),
        "openai",
        body("openai", "error_context_length")["error"]["message"],
        204308,
        128000,
        "openai:BadRequestError",
        "openai:BadRequestError",
        "error_invalid_tool_schema",
    ),
    compatible("vllm", "error_context_length_vllm", 32769, 32768, "error_vllm_tool_choice"),
    compatible("llama.cpp", "error_context_length_llamacpp", 13392, 8192, "error_llamacpp_tools_jinja"),
    Provider(
        "openai-responses",
        lambda url: OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=f"{url}/v1", max_retries=0),
        "openai_responses",
        WINDOW,
        None,
        None,
        "openai:BadRequestError",
        "openai:BadRequestError",
        "error_invalid_tool_schema",
    ),
    Provider(
        "anthropic",
        lambda url: AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=url, max_retries=0),
        "anthropic",
        "prompt is too long: 208310 tokens > 200000 maximum",
        208310,
        200000,
        "anthropic:BadRequestError",
        "anthropic:BadRequestError",
        "error_invalid_tool_schema",
    ),
    Provider(
        "gemini",
        lambda url: GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=url, max_retries=0),
        "gemini",
        "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).",
        1200293,
        1048576,
        "google.genai.errors:ClientError",
        "google.genai.errors:ClientError",
        "error_json_mode_with_tools",
    ),
]
CALLS = ["complete", "acomplete", "complete_stream", "acomplete_stream"]
BY_NAME = {p.name: p for p in PROVIDERS}


def _raised(model: ProviderModel, call: str) -> BaseException:
    """What one model call of this kind raises (the test fails if it returns); the model is closed afterwards."""
    messages, tools, texts = [Message("user", QUESTION)], demo_registry().schemas(), list[str]()
    sync: dict[str, Callable[[], Any]] = {
        "complete": lambda: model.complete(messages, tools),
        "complete_stream": lambda: model.complete_stream(messages, tools, texts.append),
    }
    if call in sync:
        with model, pytest.raises(Exception) as info:  # noqa: PT011 - which exception is what the tests check
            sync[call]()
        return info.value
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "acomplete": lambda: model.acomplete(messages, tools),
        "acomplete_stream": lambda: model.acomplete_stream(messages, tools, texts.append),
    }

    async def go() -> BaseException:
        async with model:
            with pytest.raises(Exception) as info:  # noqa: PT011 - as above
                await calls[call]()
            return info.value

    return asyncio.run(go())


def _shown(error: BaseException) -> str:
    """Everything a traceback of ``error`` prints, its causes included, and the repr of each link."""
    links, link = [], error
    while link is not None:
        links.append(repr(link))
        link = link.__cause__ or link.__context__
    return "".join(traceback.format_exception(error)) + "".join(links)


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_the_context_length_error_is_a_context_overflow_with_the_sdk_error_as_cause(
    provider_server: ProviderServer, provider: Provider, call: str
) -> None:
    """Sync, async and streamed: the provider's message, tokens and limit, and the SDK's 400 as __cause__."""
    provider_server.queue(provider.overflow())
    error = _raised(provider.build(provider_server.url), call)
    assert isinstance(error, ContextOverflowError)
    assert (error.message, error.tokens, error.limit) == (provider.message, provider.tokens, provider.limit)
    assert str(error) == provider.message
    assert isinstance(error.__cause__, provider.cause)
    assert getattr(error.__cause__, "status_code", getattr(error.__cause__, "code", None)) == 400
    assert len(provider_server.requests) == 1  # a context-length error is not retried


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_only_the_context_length_400_is_mapped_another_400_raises_the_sdk_error_as_before(
    provider_server: ProviderServer, provider: Provider, call: str
) -> None:
    """An invalid tool schema (or JSON mode with tools) stays the SDK's 400; the context-length 400 beside it maps."""
    provider_server.queue(provider.another_400(), provider.overflow())
    other = _raised(provider.build(provider_server.url), call)
    overflow = _raised(provider.build(provider_server.url), call)
    assert type(other) is provider.other
    assert not isinstance(other, ContextOverflowError)
    assert isinstance(overflow, ContextOverflowError)


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_an_agent_run_whose_model_call_overflows_stops_with_the_overflow(
    provider_server: ProviderServer, provider: Provider
) -> None:
    """Through an Agent, the run raises AgentLoopError that names the overflow (its reason or its evidence)."""
    provider_server.queue(provider.overflow())
    with provider.build(provider_server.url) as model:
        stop = stop_of(Agent(model, demo_registry()))
    assert isinstance(stop, AgentLoopError)
    assert stop.reason == "context_overflow" or stop.result.evidence.get("type") == "ContextOverflowError"


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_the_api_key_quoted_in_the_context_error_never_reaches_the_error_or_the_run(
    provider_server: ProviderServer, provider: Provider
) -> None:
    """A message that quotes the key is still an overflow, with [redacted] in its place in every text shown."""
    provider_server.queue(provider.overflow(f" (key {KEY})"), provider.overflow(f" (key {KEY})"))
    error = _raised(provider.build(provider_server.url), "complete")
    assert isinstance(error, ContextOverflowError)
    assert error.message == f"{provider.message} (key {REDACTED})"
    assert (error.tokens, error.limit) == (provider.tokens, provider.limit)
    assert isinstance(error.__cause__, provider.cause)
    assert CANARY not in _shown(error)
    with provider.build(provider_server.url) as model:
        stop = stop_of(Agent(model, demo_registry()))
    assert CANARY not in _shown(stop) + json.dumps(stop.evidence) + json.dumps(stop.result.evidence)


# --- the Responses API's in-band forms ----------------------------------------------------------------------


@pytest.mark.parametrize("call", ["complete_stream", "acomplete_stream"])
def test_a_responses_stream_error_event_with_the_context_code_is_a_context_overflow(
    provider_server: ProviderServer, call: str
) -> None:
    """The error event nesting the error object (the SDK raises APIError for it) maps, that APIError its cause."""
    import openai

    provider_server.queue(streamed("openai_responses", "stream_error_context_length"))
    error = _raised(BY_NAME["openai-responses"].build(provider_server.url), call)
    assert isinstance(error, ContextOverflowError)
    assert (error.message, error.tokens, error.limit) == (WINDOW, None, None)
    assert type(error.__cause__) is openai.APIError
    assert error.__cause__.code == "context_length_exceeded"


@pytest.mark.parametrize("name", ["stream_error_event_context_length", "stream_failed_context_length"])
@pytest.mark.parametrize("call", ["complete_stream", "acomplete_stream"])
def test_a_flat_error_event_or_a_failed_response_with_the_context_code_is_a_context_overflow(
    provider_server: ProviderServer, call: str, name: str
) -> None:
    """The documented flat error event, and response.failed carrying the code: overflows, with no SDK error behind."""
    provider_server.queue(streamed("openai_responses", name))
    error = _raised(BY_NAME["openai-responses"].build(provider_server.url), call)
    assert isinstance(error, ContextOverflowError)
    assert (error.message, error.tokens, error.limit) == (WINDOW, None, None)
    assert error.__cause__ is None


@pytest.mark.parametrize("call", ["complete", "acomplete"])
def test_a_failed_response_is_an_overflow_only_when_its_error_has_the_context_code(
    provider_server: ProviderServer, call: str
) -> None:
    """A failed response carrying context_length_exceeded maps; one failed for a server error stays a model_error."""
    failed = body("openai_responses", "failed")
    overflowed = {**failed, "error": {"code": "context_length_exceeded", "message": WINDOW}}
    server_error = {**failed, "error": {"code": "server_error", "message": "The server had an error."}}
    provider_server.queue(overflowed, server_error)
    build = BY_NAME["openai-responses"].build
    error = _raised(build(provider_server.url), call)
    assert isinstance(error, ContextOverflowError)
    assert error.message == WINDOW
    with build(provider_server.url) as model:
        stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert "unknown stop_reason 'failed'" in stop.evidence["error"]


# --- how each provider's message is read ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "tokens", "limit"),
    [
        (
            "This model's maximum context length is 128000 tokens. However, your messages resulted in "
            "130512 tokens. Please reduce the length of the messages.",
            130512,
            128000,
        ),
        (
            "This model's maximum context length is 4097 tokens. However, you requested 4120 tokens "
            "(3120 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            3120,
            4097,
        ),
        (
            "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 3148588 tokens. "
            "Please reduce the length of the messages.",
            3148588,
            272000,
        ),
        (WINDOW, None, None),
    ],
    ids=["resulted-in", "requested", "configured-limit", "responses"],
)
def test_openai_context_messages_give_the_input_length_and_the_window(
    message: str, tokens: int | None, limit: int | None
) -> None:
    """Each wording OpenAI has used: the input's tokens (not the completion's) and the window, or None unsaid."""
    overflow = openai_overflow("context_length_exceeded", message)
    assert overflow is not None
    assert (overflow.message, overflow.tokens, overflow.limit) == (message, tokens, limit)
    assert openai_overflow("invalid_function_parameters", message) is None


@pytest.mark.parametrize(
    ("message", "tokens", "limit"),
    [
        (
            "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. "
            "Please reduce the length of the input messages.",
            5000,
            4096,
        ),
        (
            "You passed 8193 input tokens and requested 0 output tokens. However, the model's context length is only "
            "8192 tokens, resulting in a maximum input length of 8192 tokens. Please reduce the length of the input "
            "prompt. (parameter=input_tokens, value=8193)",
            8193,
            8192,
        ),
        (
            "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 "
            "tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None",
            2778,
            4096,
        ),
        (
            "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (1900 in the "
            "messages, 200 in the completion). Please reduce the length of the messages or completion.",
            1900,
            2048,
        ),
    ],
    ids=["request-has", "you-passed", "max-tokens-too-large", "legacy-requested"],
)
def test_compatible_context_messages_give_the_input_length_and_the_window(
    message: str, tokens: int | None, limit: int | None
) -> None:
    """Each wording vLLM's versions used, with no code of OpenAI's: the input's tokens and the window."""
    overflow = compatible_overflow({"type": "BadRequestError", "code": 400}, message)
    assert overflow is not None
    assert (overflow.message, overflow.tokens, overflow.limit) == (message, tokens, limit)
    other = body("openai", "error_vllm_tool_choice")["error"]
    assert compatible_overflow(other, other["message"]) is None


def test_a_llamacpp_overflow_without_its_numbers_reads_them_from_its_message() -> None:
    """The type alone marks llama.cpp's overflow; without n_prompt_tokens and n_ctx the message gives them."""
    error = body("openai", "error_context_length_llamacpp")["error"]
    bare = {"code": 400, "type": error["type"], "message": error["message"]}
    overflow = compatible_overflow(bare, error["message"])
    assert overflow is not None
    assert (overflow.tokens, overflow.limit) == (13392, 8192)
    vague = compatible_overflow({"type": error["type"]}, "the request exceeds the available context size")
    assert vague is not None
    assert (vague.tokens, vague.limit) == (None, None)


@pytest.mark.parametrize(
    ("name", "tokens", "limit"),
    [("error_context_length", 208310, 200000), ("error_context_limit_max_tokens", 178959, 200000)],
    ids=["prompt-too-long", "no-room-for-max-tokens"],
)
@pytest.mark.parametrize("call", ["complete", "acomplete_stream"])
def test_both_anthropic_context_errors_give_the_input_length_and_the_window(
    provider_server: ProviderServer, call: str, name: str, tokens: int, limit: int
) -> None:
    """The prompt over the window, and the prompt leaving no room for max_tokens: the input's tokens and the window."""
    import anthropic

    data = body("anthropic", name)
    provider_server.queue(Reply(data, 400))
    error = _raised(BY_NAME["anthropic"].build(provider_server.url), call)
    assert isinstance(error, ContextOverflowError)
    assert (error.message, error.tokens, error.limit) == (data["error"]["message"], tokens, limit)
    assert isinstance(error.__cause__, anthropic.BadRequestError)


ANSWERS = {"openai": "final_answer", "openai_responses": "answer", "gemini": "answer", "anthropic": "final_answer"}
"""Each provider's recorded final answer: what the call made again after the compaction gets."""


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_a_compaction_after_the_providers_own_overflow_makes_the_call_again_and_it_succeeds(
    provider_server: ProviderServer, provider: Provider, driver: str
) -> None:
    """The real context-length 400, then compact, then the same call with the short history: the run finishes."""
    provider_server.queue(provider.overflow(), Reply(body(provider.folder, ANSWERS[provider.folder])))
    model = provider.build(provider_server.url)

    def compact(messages: list[Message]) -> list[Message]:
        return [Message("user", f"Summary of {len(messages)} messages: {messages[-1].content}")]

    agent = Agent(model, demo_registry(), on_stop={"context_overflow": "compact"}, compact=compact)

    async def arun() -> Any:
        async with model:
            return await agent.arun(QUESTION)

    result = agent.run(QUESTION) if driver == "sync" else asyncio.run(arun())
    assert result.ok
    assert result.trace[0].guard == "compacts_history"
    first, second = (json.dumps(sent) for sent in provider_server.bodies())
    assert "Summary of 1 messages" in second
    assert "Summary of" not in first
