"""What leaves a provider adapter, for each SDK over loopback HTTP: never a secret, never a malformed reply.

Gemini's adapter, on another SDK, has the same checks in ``test_models_gemini.py``.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.provider_server import ProviderServer, Received, Reply, body, stop_of
from support.sdk import sdk_attribute

from fsm_agent import Agent, AgentLoopError, Message, SqliteStore
from fsm_agent.models import AnthropicModel, MalformedReplyError, OpenAIChatModel, OpenAIResponsesModel, RedactedError
from fsm_agent.models.provider import ProviderModel
from fsm_agent.models.redaction import REDACTED, redacted
from fsm_agent.models.replies import token_count
from fsm_agent.testing import demo_registry

CANARY = "LEAKCANARY"
KEY = f"sk-{CANARY}-7f3a9c2e5b8d1f4a6c0e"
PASSWORD = f"pw-{CANARY}-31415"


@dataclass(frozen=True)
class Provider:
    """What differs between the two providers, for the tests that must hold for both."""

    name: str
    adapter: Callable[..., ProviderModel]
    sdk_client_path: str  # the SDK's client class, as module:name (imported when a test asks for it)
    model: str
    path: str  # what follows the server's root in base_url
    key_header: str  # the request header that carries the key, and what precedes the key in it
    key_prefix: str
    key_variable: str
    counts: tuple[str, str]  # the usage fields of input and output tokens

    @property
    def sdk_client(self) -> Callable[..., Any]:
        """The SDK's client class."""
        client: Callable[..., Any] = sdk_attribute(self.sdk_client_path)
        return client

    def build(self, url: str, **settings: Any) -> ProviderModel:
        """The adapter for a server at ``url``, with no retries."""
        return self.adapter(self.model, base_url=url + self.path, max_retries=0, **settings)

    def echo(self, received: Received) -> dict[str, Any]:
        """A careless server's 401: it repeats the credentials it rejected, as real servers do."""
        message = f"Incorrect API key provided: {received.headers[self.key_header]}"
        return {"type": "error", "error": {"type": "authentication_error", "message": message, "code": None}}


OPENAI = Provider(
    "openai",
    OpenAIChatModel,
    "openai:OpenAI",
    "gpt-4o-mini",
    "/v1",
    "authorization",
    "Bearer ",
    "OPENAI_API_KEY",
    ("prompt_tokens", "completion_tokens"),
)
OPENAI_RESPONSES = Provider(
    "openai_responses",
    OpenAIResponsesModel,
    "openai:OpenAI",
    "o4-mini",
    "/v1",
    "authorization",
    "Bearer ",
    "OPENAI_API_KEY",
    ("input_tokens", "output_tokens"),
)
ANTHROPIC = Provider(
    "anthropic",
    AnthropicModel,
    "anthropic:Anthropic",
    "claude-sonnet-4-5",
    "",
    "x-api-key",
    "",
    "ANTHROPIC_API_KEY",
    ("input_tokens", "output_tokens"),
)


@pytest.fixture(params=[OPENAI, OPENAI_RESPONSES, ANTHROPIC], ids=lambda provider: provider.name)
def provider(request: pytest.FixtureRequest) -> Provider:
    """Each provider in turn."""
    chosen: Provider = request.param
    return chosen


def _leaks(texts: list[str]) -> list[str]:
    return [text for text in texts if CANARY in text]


# Secrets


@pytest.mark.parametrize("source", ["argument", "environment"])
def test_a_key_with_whitespace_around_it_is_stripped_before_it_is_sent(
    provider: Provider, provider_server: ProviderServer, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """A key read from a file keeps its newline; it is stripped, so the request goes out and the run finishes."""
    if source == "environment":
        monkeypatch.setenv(provider.key_variable, f"{KEY}\r\n")
        model = provider.build(provider_server.url)
    else:
        model = provider.build(provider_server.url, api_key=f" {KEY}\n")
    provider_server.queue(body(provider.name, "final_answer"))
    with model:
        assert Agent(model, demo_registry()).run("Hi").ok
    assert provider_server.requests[0].headers[provider.key_header] == provider.key_prefix + KEY


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (f"{KEY[:9]}\n{KEY[9:]}", f"api_key has control character U+000A at position 9 of {len(KEY) + 1}"),
        (f"{KEY[:5]} {KEY[5:]}", f"api_key has SPACE at position 5 of {len(KEY) + 1}"),
        (f"{KEY}\u2019", f"api_key has RIGHT SINGLE QUOTATION MARK at position {len(KEY)} of {len(KEY) + 1}"),
        (f"{KEY[:3]}\x7f{KEY[3:]}", f"api_key has control character U+007F at position 3 of {len(KEY) + 1}"),
        (" \n", "api_key is empty"),
    ],
    ids=["newline", "space", "quotation-mark", "delete", "blank"],
)
def test_a_key_no_header_can_carry_is_refused_without_showing_it(provider: Provider, key: str, problem: str) -> None:
    """Whitespace, control or non-ASCII characters inside the key: a ValueError naming the position, not the key."""
    with pytest.raises(ValueError, match="api_key") as info:
        provider.build("http://127.0.0.1:9", api_key=key)
    assert str(info.value).startswith(problem)
    assert not _leaks([str(info.value)])


def test_a_client_passed_in_with_whitespace_around_its_key_is_refused(provider: Provider) -> None:
    """A ready client's key cannot be stripped by the adapter: it is refused at construction, the key not shown."""
    client = provider.sdk_client(api_key=f"{KEY}\n", base_url="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="the client's api_key has whitespace around it") as info:
        provider.adapter(provider.model, client)
    assert not _leaks([str(info.value)])
    client.close()


def _everything_written(model: ProviderModel, tmp_path: Path) -> tuple[AgentLoopError | None, list[str]]:
    """Run ``model`` with a JSON Lines log and a SqliteStore: the stop if any, and every text the run left behind."""
    store = SqliteStore(tmp_path / "runs.db")
    stop = None
    texts = [repr(model), str(model)]
    try:
        result = Agent(model, demo_registry()).run("Hi", log=tmp_path / "run.jsonl", store=store)
    except AgentLoopError as exc:
        stop, result = exc, exc.result
        texts += ["".join(traceback.format_exception(exc)), str(exc), repr(exc.__cause__)]
    finally:
        store.close()
    written = sorted(tmp_path.iterdir())
    assert {path.name for path in written} >= {"run.jsonl", "runs.db"}
    texts.append(result.to_json())
    texts.extend(path.read_bytes().decode("latin-1") for path in written)
    return stop, texts


def test_a_key_with_a_newline_appears_in_nothing_the_library_writes(
    provider: Provider, provider_server: ProviderServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: a key read from a file with its newline.  The run works, and no output holds the key."""
    provider_server.queue(body(provider.name, "final_answer"))
    with provider.build(provider_server.url, api_key=f"{KEY}\n") as model, caplog.at_level(logging.DEBUG):
        stop, texts = _everything_written(model, tmp_path)
    assert stop is None
    assert not _leaks([*texts, caplog.text])


def test_a_key_echoed_by_a_401_appears_in_nothing_the_library_writes(
    provider: Provider, provider_server: ProviderServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server quotes the key it rejected: the error, its chain, the result, the files and the logs never hold it."""
    import anthropic
    import openai

    provider_server.queue(Reply(provider.echo, 401))
    with provider.build(provider_server.url, api_key=KEY) as model, caplog.at_level(logging.DEBUG):
        stop, texts = _everything_written(model, tmp_path)
    assert provider_server.requests[0].headers[provider.key_header] == provider.key_prefix + KEY
    assert stop is not None
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, openai.AuthenticationError | anthropic.AuthenticationError)
    assert f"Incorrect API key provided: {provider.key_prefix}{REDACTED}" in str(stop.__cause__)
    assert not _leaks([*texts, caplog.text])


def test_a_key_quoted_by_httpx_is_redacted_from_the_whole_error_chain(
    provider: Provider, provider_server: ProviderServer, tmp_path: Path
) -> None:
    """httpx refuses a header with a newline and quotes it, three exceptions deep; no link of the chain keeps it.

    The key gets there only by being set on the client after the adapter
    checked it.  The SDK's own debug log of that exception, written before
    the adapter sees it, is not the adapter's to clean, so it is not checked.
    """
    import anthropic
    import openai

    with provider.build(provider_server.url, api_key=KEY) as model:
        model.client.api_key = f"{KEY}\n"
        stop, texts = _everything_written(model, tmp_path)
    assert stop is not None
    cause = stop.__cause__
    assert isinstance(cause, openai.APIConnectionError | anthropic.APIConnectionError)
    assert f"LocalProtocolError: Illegal header value b'{provider.key_prefix}{REDACTED}\\n'" in str(cause)
    assert not _leaks(texts)


def test_the_async_client_sends_the_same_credentials_and_its_errors_are_redacted_the_same(
    provider: Provider, provider_server: ProviderServer
) -> None:
    """acomplete's client gets the stripped key and the Basic header; a 401 quoting every header is cleaned."""
    import anthropic
    import openai

    host = provider_server.url.removeprefix("http://")
    model = provider.build(f"http://user:{PASSWORD}@{host}", api_key=f"{KEY}\n")
    provider_server.queue(Reply(lambda received: {"error": {"message": repr(received.headers)}}, 401))

    async def call() -> None:
        async with model:
            await model.acomplete([Message("user", "Hi")], [])

    with pytest.raises((openai.AuthenticationError, anthropic.AuthenticationError)) as info:
        asyncio.run(call())
    token = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert provider_server.requests[0].headers["authorization"] == f"Basic {token}"
    if provider is ANTHROPIC:  # OpenAI's key travels in Authorization, which the Basic credentials take over
        assert provider_server.requests[0].headers["x-api-key"] == KEY
    text = "".join(traceback.format_exception(info.value))
    assert REDACTED in text
    assert not _leaks([text])
    assert token not in text


def test_a_password_in_base_url_is_sent_as_basic_auth_and_shown_nowhere(
    provider: Provider, provider_server: ProviderServer, caplog: pytest.LogCaptureFixture
) -> None:
    """user:password@ leaves the URL for the Authorization header, so repr, base_url and httpx's logs never show it."""
    host = provider_server.url.removeprefix("http://")
    model = provider.build(f"http://user:{PASSWORD}@{host}", api_key=KEY)
    provider_server.queue(body(provider.name, "final_answer"))
    with model, caplog.at_level(logging.DEBUG):
        assert Agent(model, demo_registry()).run("Hi").ok
    assert model.base_url == provider_server.url + provider.path
    token = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert provider_server.requests[0].headers["authorization"] == f"Basic {token}"
    assert not _leaks([repr(model), str(model), model.base_url, caplog.text])


def test_a_client_passed_in_with_a_password_in_its_url_shows_it_redacted(provider: Provider) -> None:
    """A ready client's URL is left as it is, but the adapter's repr and base_url show the password as [redacted]."""
    client = provider.sdk_client(api_key=KEY, base_url=f"http://user:{PASSWORD}@127.0.0.1:9{provider.path}")
    with provider.adapter(provider.model, client) as model:
        assert model.base_url == f"http://user:{REDACTED}@127.0.0.1:9{provider.path}"
        assert not _leaks([repr(model), str(model)])
    client.close()


def test_an_unreachable_server_is_named_in_the_error(provider: Provider, unused_port: int) -> None:
    """A connection failure's message names the URL it could not reach, and the reason the socket gave."""
    import anthropic
    import openai

    with provider.build(f"http://user:{PASSWORD}@127.0.0.1:{unused_port}", api_key=KEY) as model:
        stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    cause = stop.__cause__
    assert isinstance(cause, openai.APIConnectionError | anthropic.APIConnectionError)
    url = f"http://127.0.0.1:{unused_port}{provider.path}"
    assert model.base_url == url
    assert str(cause).startswith(f"Connection error: cannot reach {url} (ConnectError: ")
    assert stop.evidence["error"] == str(cause)
    assert not _leaks(["".join(traceback.format_exception(stop))])


class _Opaque(Exception):
    """An exception whose text does not come from its args, so cleaning them cannot change what it shows."""

    def __str__(self) -> str:
        return f"token {KEY} refused"


def test_an_error_that_cannot_be_cleaned_in_place_is_replaced_by_a_redacted_stand_in() -> None:
    """The stand-in keeps the type names and the cleaned text, and carries no chain that could hold the key."""
    opaque = _Opaque()
    opaque.__cause__ = ValueError(f"bad key {KEY}")
    failure = redacted(opaque, [(KEY, REDACTED)])
    assert isinstance(failure, RedactedError)
    assert failure.__cause__ is None
    assert failure.__context__ is None
    assert str(failure) == (
        f"tests.models.test_models_boundary._Opaque: token {REDACTED} refused; caused by ValueError: bad key {REDACTED}"
    )


def test_an_error_cleaned_in_place_keeps_its_type_and_loses_the_key_from_its_whole_chain() -> None:
    """args, notes and exceptions held in args are cleaned along cause and context; the same object comes back."""
    held = OSError(f"refused {KEY}")
    outer = RuntimeError("wrapped", held)
    outer.add_note(f"note {KEY}")
    outer.__cause__ = KeyError(f"header {KEY}")
    outer.__context__ = TypeError(f"context {KEY}")
    assert redacted(outer, [(KEY, REDACTED)]) is outer
    assert not _leaks(["".join(traceback.format_exception(outer)), repr(held), repr(outer.__context__)])


# Malformed replies


PAGE = "<!DOCTYPE html><html><body>Bad gateway</body></html>"


def test_an_html_page_answered_with_200_is_a_model_error_showing_what_arrived(
    provider: Provider, provider_server: ProviderServer
) -> None:
    """A proxy's page with status 200 (the SDK hands its text on) is refused as text, not read as an empty reply."""
    provider_server.queue(Reply({}, html=PAGE))
    with provider.build(provider_server.url, api_key=KEY) as model:
        stop = stop_of(Agent(model, demo_registry()))
    assert stop.reason == "model_error"
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert str(stop.__cause__) == f"malformed provider reply: response body is not JSON: {PAGE!r}"


def _with_usage(provider: Provider, **counts: Any) -> dict[str, Any]:
    data = copy.deepcopy(body(provider.name, "final_answer"))
    data["usage"].update(counts)
    return data


_JUNK = [None, -1, float("nan"), float("inf"), 2.5]
# The openai SDK itself turns "9" into 9 and true into 1 while parsing, so only Anthropic's adapter meets those.
_JUNK_COUNTS = [(p, v) for p in (OPENAI, OPENAI_RESPONSES, ANTHROPIC) for v in _JUNK] + [
    (ANTHROPIC, "9"),
    (ANTHROPIC, True),
]


@pytest.mark.parametrize(
    ("provider", "value"), _JUNK_COUNTS, ids=[f"{p.name}-{v!r}" for p, v in _JUNK_COUNTS], indirect=["provider"]
)
def test_a_malformed_token_count_is_a_model_error_naming_the_field(
    provider: Provider, provider_server: ProviderServer, value: Any
) -> None:
    """Null, negative, NaN, infinite, a fraction, a string or a bool: the adapter refuses the reply, naming it."""
    output = provider.counts[1]
    provider_server.queue(_with_usage(provider, **{output: value}))
    with provider.build(provider_server.url, api_key=KEY) as model:
        stop = stop_of(Agent(model, demo_registry(), token_budget=100))
    assert stop.reason == "model_error"
    cause = stop.__cause__
    assert isinstance(cause, MalformedReplyError)
    assert isinstance(cause, ValueError)
    assert cause.field == f"usage.{output}"
    assert stop.evidence["type"] == "MalformedReplyError"
    assert stop.evidence["error"].startswith(f"malformed provider reply: usage.{output} ")


def test_usage_without_its_output_count_is_malformed_not_zero(
    provider: Provider, provider_server: ProviderServer
) -> None:
    """``"usage": {"prompt_tokens": 5}`` (or Anthropic's equivalent): a count half there is not taken for zero."""
    data = copy.deepcopy(body(provider.name, "final_answer"))
    data["usage"] = {provider.counts[0]: 5}
    provider_server.queue(data)
    with provider.build(provider_server.url, api_key=KEY) as model:
        stop = stop_of(Agent(model, demo_registry()))
    assert isinstance(stop.__cause__, MalformedReplyError)
    assert str(stop.__cause__) == f"malformed provider reply: usage.{provider.counts[1]} is missing or null"


def test_a_reply_without_usage_counts_as_zero_tokens(provider: Provider, provider_server: ProviderServer) -> None:
    """No usage object at all is allowed (compatible servers omit it): the run finishes, counting no tokens."""
    data = copy.deepcopy(body(provider.name, "final_answer"))
    del data["usage"]
    provider_server.queue(data)
    with provider.build(provider_server.url, api_key=KEY) as model:
        result = Agent(model, demo_registry()).run("Hi")
    assert result.ok
    assert result.usage.total == 0


@pytest.mark.parametrize("value", [None, "9", -1, float("nan"), float("inf"), True, 2.5, 2.0, [1]], ids=repr)
def test_a_token_count_must_be_an_integer_of_zero_or_more(value: Any) -> None:
    """Every kind of junk a server could send as a count is refused by the one check both adapters use."""
    with pytest.raises(MalformedReplyError, match=r"^malformed provider reply: usage\.output_tokens "):
        token_count(SimpleNamespace(output_tokens=value), "output_tokens")
    assert token_count(SimpleNamespace(output_tokens=0), "output_tokens") == 0
    assert token_count(SimpleNamespace(), "cache_read_input_tokens", optional=True) == 0
