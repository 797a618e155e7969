"""Broken transports, through a whole run on both drivers: empty and cut streams, timeouts, a stream's error event.

Each must stop the run with ``model_error`` and evidence that says what went
wrong (docs/how-to/openai.md "Check what came back", anthropic.md, gemini.md
"Retries and errors"; ``fsm_agent.models.replies``: a malformed reply is a
``MalformedReplyError`` naming the field), never an exception escaping the
run, and a timeout is retried ``max_retries`` times like any transient error.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.provider_server import BODIES, QUESTION, ProviderServer, Received, Reply
from support.sdk import sdk_attribute

from fsm_agent import Agent, AgentLoopError
from fsm_agent.models import AnthropicModel, GeminiModel, OpenAIChatModel, OpenAIResponsesModel
from fsm_agent.models.provider import ProviderModel
from fsm_agent.testing import demo_registry

KEY = "sk-test-4f7c0d9e2b1a8c3f5e6d7a9b"
DRIVERS = ["sync", "async"]

BUILD: dict[str, Callable[..., ProviderModel]] = {
    "openai": lambda url, **kw: OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{url}/v1", **kw),
    "openai_responses": lambda url, **kw: OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=f"{url}/v1", **kw),
    "anthropic": lambda url, **kw: AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=url, **kw),
    "gemini": lambda url, **kw: GeminiModel("gemini-2.5-flash", api_key=f"AIza-{KEY}", base_url=url, **kw),
}
PROVIDERS = list(BUILD)


def stopped(model: ProviderModel, driver: str, *, stream: bool = True) -> AgentLoopError:
    """The stop of a run over ``model``; streaming when ``stream`` (a text hook asks for it)."""
    agent = Agent(model, demo_registry())
    if stream:
        agent.on("text", lambda delta: None)
    if driver == "sync":
        with pytest.raises(AgentLoopError) as info:
            agent.run(QUESTION)
    else:
        with pytest.raises(AgentLoopError) as info:
            asyncio.run(agent.arun(QUESTION))
    return info.value


def recorded_events(provider: str, name: str, keep: int) -> str:
    """The first ``keep`` events of a recorded stream: the connection closed after them, as a dropped stream is."""
    text = (BODIES / provider / f"{name}.sse").read_text(encoding="utf-8")
    events = [event for event in text.split("\n\n") if event.strip()]
    return "".join(f"{event}\n\n" for event in events[:keep])


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_stream_that_ends_before_any_event_is_a_model_error_naming_it(
    provider_server: ProviderServer, provider: str, driver: str
) -> None:
    """A 200 event stream with no event at all is a malformed reply, said in words, as the Responses adapter says it."""
    provider_server.queue(Reply({}, sse=""))
    stop = stopped(BUILD[provider](provider_server.url, max_retries=0), driver)
    assert stop.reason == "model_error"
    assert stop.evidence["type"] == "MalformedReplyError"
    assert stop.evidence["error"].startswith("malformed provider reply:")
    assert [m.role for m in stop.result.messages] == ["user"]


CUT = {
    "openai": ("stream_tool_call", 3),
    "anthropic": ("stream_tool_use", 5),
    "openai_responses": ("stream_reasoning_call", 3),
    "gemini": ("stream_thought_call", 1),
}


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_stream_cut_mid_reply_stops_with_model_error_and_runs_no_tool(
    provider_server: ProviderServer, provider: str, driver: str
) -> None:
    """The text that arrived is no answer and a call cut before its end never runs: ``model_error``, with evidence."""
    name, keep = CUT[provider]
    provider_server.queue(Reply({}, sse=recorded_events(provider, name, keep)))
    stop = stopped(BUILD[provider](provider_server.url, max_retries=0), driver)
    assert stop.reason == "model_error"
    assert stop.evidence["error"]
    assert stop.result.steps == () or all(step.kind != "tool_call" for step in stop.result.steps)
    assert not any(m.role == "tool" for m in stop.result.messages)
    assert len(provider_server.requests) == 1


@pytest.fixture
def held(provider_server: ProviderServer) -> Iterator[threading.Event]:
    """Released at the end of the test: until then the server holds each answer back, as a hung provider does."""
    # The client has given up by then, so the late answer meets a closed socket: not worth a traceback on stderr.
    provider_server._httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
    release = threading.Event()
    yield release
    release.set()


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_provider_that_does_not_answer_in_time_is_retried_then_a_model_error_saying_so(
    provider_server: ProviderServer, held: threading.Event, provider: str, driver: str, stream: bool
) -> None:
    """``timeout=`` bounds each attempt; ``max_retries=1`` makes two attempts; the stop names the server."""

    def hang(received: Received) -> dict[str, Any]:
        held.wait(10)
        return {}

    provider_server.queue(Reply(hang), Reply(hang), Reply(hang))
    model = BUILD[provider](provider_server.url, max_retries=1, timeout=0.2)
    stop = stopped(model, driver, stream=stream)
    assert stop.reason == "model_error"
    assert stop.evidence["error"].startswith("Request timed out: no answer from http://127.0.0.1:")
    assert len(provider_server.requests) == 2


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_responses_stream_error_event_puts_the_providers_message_in_the_evidence(
    provider_server: ProviderServer, driver: str
) -> None:
    """The API's documented ``error`` event (``type``, ``code``, ``message``) is what the stop reports."""
    event = (
        "event: error\n"
        'data: {"type": "error", "code": "server_error", "message": "The server had an error while processing '
        'your request.", "param": null, "sequence_number": 1}\n\n'
    )
    provider_server.queue(Reply({}, sse=event), Reply({}, sse=event))
    stop = stopped(BUILD["openai_responses"](provider_server.url, max_retries=2), driver)
    assert stop.reason == "model_error"
    assert "The server had an error" in stop.evidence["error"]
    # As the SDK raises the nested form: its APIError, the event's code on it; it came in a 200, so it is not retried.
    assert stop.evidence["type"] == "APIError"
    cause = stop.__cause__
    assert type(cause) is sdk_attribute("openai:APIError")
    assert (cause.code, cause.message) == ("server_error", stop.evidence["error"])
    assert len(provider_server.requests) == 1
