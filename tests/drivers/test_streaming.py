"""Streamed text: both adapters over real HTTP with recorded server-sent-event bodies, through both drivers.

Each stream (``tests/support/provider_bodies/<provider>/stream_*.sse``) carries the
same reply as its recorded unstreamed twin (``<name>.json``), written out in
the provider's server-sent-event format (OpenAI ``chat.completion.chunk``
lines ending in ``[DONE]`` with a usage chunk; Anthropic ``message_start`` ...
``message_stop`` events, tool input as ``input_json_delta``), so a script run
both ways must end the same: same messages, trace, reason, usage and
evidence.  Streaming adds only the ``TextDelta`` events, and only before the
transition that takes their reply in.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.provider_server import QUESTION, ProviderServer, body, streamed

from fsm_agent import Agent, AgentLoopError, RunResult, TextDelta, TransitionEvent
from fsm_agent.models import AnthropicModel, OpenAIChatModel
from fsm_agent.testing import demo_registry

KEY = "sk-test-4f7c0d9e2b1a8c3f5e6d7a9b"

SCRIPTS = {
    "openai": [
        ["tool_call", "final_answer"],
        ["two_tool_calls", "final_answer"],
        ["truncated_answer"],
        ["truncated_tool_call"],
        ["refusal"],
        ["content_filter"],
    ],
    "anthropic": [
        ["tool_use", "final_answer"],
        ["two_tool_uses", "final_answer"],
        ["truncated_answer"],
        ["refusal"],
    ],
}
CASES = [(provider, script) for provider, scripts in SCRIPTS.items() for script in scripts]


def adapter(provider: str, server: ProviderServer) -> OpenAIChatModel | AnthropicModel:
    if provider == "openai":
        return OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{server.url}/v1", max_retries=0)
    return AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=server.url, max_retries=0)


def comparable(result: RunResult) -> dict[str, Any]:
    """What must be equal streamed or not: everything but timings."""
    evidence = {k: v for k, v in result.evidence.items() if k != "counters"}
    return {
        "messages": result.messages,
        "final": result.final,
        "reason": result.reason,
        "usage": result.usage,
        "trace": result.trace,
        "pending": result.pending,
        "evidence": evidence,
    }


def unstreamed(provider: str, script: list[str], server: ProviderServer, driver: str) -> RunResult:
    server.queue(*(body(provider, name) for name in script))
    agent = Agent(adapter(provider, server), demo_registry())
    try:
        return agent.run(QUESTION) if driver == "sync" else asyncio.run(agent.arun(QUESTION))
    except AgentLoopError as exc:
        return exc.result


def streamed_run(
    provider: str, script: list[str], server: ProviderServer, driver: str
) -> tuple[RunResult, list[TransitionEvent | TextDelta]]:
    server.queue(*(streamed(provider, f"stream_{name}") for name in script))
    agent = Agent(adapter(provider, server), demo_registry())
    seen: list[TransitionEvent | TextDelta] = []

    async def collect() -> None:
        async for event in agent.astream(QUESTION):
            seen.append(event)

    try:
        if driver == "sync":
            seen.extend(agent.stream(QUESTION))
        else:
            asyncio.run(collect())
    except AgentLoopError as exc:
        return exc.result, seen
    last = seen[-1]
    assert isinstance(last, TransitionEvent)
    assert last.result is not None
    return last.result, seen


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize(("provider", "script"), CASES, ids=[f"{p}:{'+'.join(s)}" for p, s in CASES])
def test_a_script_ends_the_same_streamed_or_not(
    provider_server: ProviderServer, provider: str, script: list[str], driver: str
) -> None:
    """Truncation, refusal and tool calls come out exactly as unstreamed; only TextDelta events are added."""
    plain = unstreamed(provider, script, provider_server, driver)
    assert all(not (r.json or {}).get("stream") for r in provider_server.requests)
    provider_server.requests.clear()
    result, seen = streamed_run(provider, script, provider_server, driver)
    assert comparable(result) == comparable(plain)
    assert all((r.json or {}).get("stream") is True for r in provider_server.requests) or provider == "anthropic"
    transitions = [e for e in seen if isinstance(e, TransitionEvent)]
    assert [e.transition for e in transitions] == list(result.trace)
    # The deltas of each model call sit right before the transition that takes its reply in, and add up to its text.
    pending: list[str] = []
    for event in seen:
        if isinstance(event, TextDelta):
            pending.append(event.text)
            continue
        if event.trigger in ("replied", "model_failed") and event.response is not None:
            assert "".join(pending) == _streamed_text(provider, event)
        else:
            assert pending == [], f"text before {event.source}->{event.dest}"
        pending = []


def _streamed_text(provider: str, event: TransitionEvent) -> str:
    """The text the provider streamed for a reply: its content, not the refusal explanation filled in afterwards."""
    assert event.response is not None
    if event.response.stop_reason == "refusal" and provider == "anthropic":
        return ""
    if event.response.stop_reason == "refusal" and not event.response.message.tool_calls:
        return "" if event.response.message.content.startswith("I'm sorry") else event.response.message.content
    return event.response.message.content


def test_the_openai_stream_asks_for_usage(provider_server: ProviderServer) -> None:
    """A streamed request carries stream and include_usage, so token_budget still counts streamed replies."""
    provider_server.queue(streamed("openai", "stream_final_answer"))
    agent = Agent(adapter("openai", provider_server), demo_registry())
    result = list(agent.stream(QUESTION))[-1].result
    (request,) = provider_server.requests
    assert request.json["stream"] is True
    assert request.json["stream_options"] == {"include_usage": True}
    assert result is not None
    assert result.usage.input_tokens == 140


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_text_hook_makes_run_stream_and_gets_each_piece_in_order(
    provider_server: ProviderServer, provider: str
) -> None:
    """``agent.on("text")`` receives the answer piece by piece, numbered by turn, before the run returns."""
    provider_server.queue(
        streamed(provider, f"stream_{SCRIPTS[provider][0][0]}"), streamed(provider, "stream_final_answer")
    )
    agent = Agent(adapter(provider, provider_server), demo_registry())
    pieces: list[TextDelta] = []
    agent.on("text", pieces.append)
    result = agent.run(QUESTION)
    last_turn = [p.text for p in pieces if p.turn == 2]
    assert "".join(last_turn) == result.final == "(2+3)*4 = 20"
    assert len(last_turn) > 1
    assert {p.run_id for p in pieces} == {pieces[0].run_id} != {""}


def test_without_a_text_reader_the_adapter_is_not_asked_to_stream(provider_server: ProviderServer) -> None:
    """Hooks of other kinds do not switch streaming on: nobody reads text, so the plain call is made."""
    provider_server.queue(body("openai", "final_answer"))
    agent = Agent(adapter("openai", provider_server), demo_registry())
    agent.on("transition", lambda event: None)
    assert agent.run(QUESTION).final == "(2+3)*4 = 20"
    assert "stream" not in provider_server.requests[0].json


def test_a_reader_that_stops_early_leaves_the_run_after_the_transition_in_progress(
    provider_server: ProviderServer,
) -> None:
    """Closing the stream after the first piece of text does not hang and makes no further request."""
    provider_server.queue(streamed("openai", "stream_tool_call"), streamed("openai", "stream_final_answer"))
    agent = Agent(adapter("openai", provider_server), demo_registry())
    stream: Iterator[TransitionEvent | TextDelta] = agent.stream(QUESTION)
    first = next(stream)
    assert isinstance(first, TransitionEvent)
    stream.close()  # type: ignore[attr-defined]
    assert len(provider_server.requests) == 1


def test_an_async_reader_that_stops_early_cuts_the_call_in_flight_off(provider_server: ProviderServer) -> None:
    """Closing ``astream`` during a model call cancels it; no further request is made and nothing hangs."""
    provider_server.queue(streamed("anthropic", "stream_tool_use"), streamed("anthropic", "stream_final_answer"))
    agent = Agent(adapter("anthropic", provider_server), demo_registry())

    async def first_piece() -> TextDelta | TransitionEvent:
        events = agent.astream(QUESTION)
        first = await anext(events)
        await events.aclose()
        return first

    first = asyncio.run(first_piece())
    assert isinstance(first, TextDelta)
    assert len(provider_server.requests) == 1


def test_the_run_command_prints_the_answer_as_it_streams(
    provider_server: ProviderServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run --stream``: each turn's text on stdout as it comes, the answer once, exit 0."""
    from fsm_agent.__main__ import main

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    tool_turn = streamed("openai", "stream_two_tool_calls")
    provider_server.queue(tool_turn, streamed("openai", "stream_final_answer"))
    url = f"{provider_server.url}/v1"
    code = main(["run", QUESTION, "--model", "openai:gpt-4o-mini", "--base-url", url, "--stream", "--quiet"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (0, "Adding, and checking the quota.\n(2+3)*4 = 20\n", "")
    assert provider_server.requests[0].json["stream"] is True


def test_the_run_command_does_not_stream_into_a_pipe_unless_asked(
    provider_server: ProviderServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Captured stdout is not a terminal: the plain call is made and the answer printed whole."""
    from fsm_agent.__main__ import main

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    provider_server.queue(body("openai", "final_answer"))
    code = main(
        ["run", QUESTION, "--model", "openai:gpt-4o-mini", "--base-url", f"{provider_server.url}/v1", "--quiet"]
    )
    assert (code, capsys.readouterr().out) == (0, "(2+3)*4 = 20\n")
    assert "stream" not in provider_server.requests[0].json


@pytest.mark.subprocess
def test_the_readme_example_streams_each_turns_words_before_its_transition() -> None:
    """``python examples/streaming.py`` shows the pieces of each reply, then the edges that take it in."""
    example = Path(__file__).resolve().parents[2] / "examples" / "streaming.py"
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=60, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "Let |me |add |those.|"
    assert lines[1] == "  [AwaitModel -> CheckTruncation]"
    assert "The |sum |is |5.|" in lines
    assert lines[-1] == "  [Dispatch -> Done]"
