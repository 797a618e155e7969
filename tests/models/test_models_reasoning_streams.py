"""Streamed replies of the Responses and Gemini adapters: text handed on as it arrives, reasoning kept all the same."""

from __future__ import annotations

import asyncio
import base64

import pytest
from support.provider_rules import gemini_thought_signatures, openai_reasoning
from support.provider_server import QUESTION, ProviderServer, body, stop_of, streamed

from fsm_agent import Agent, TextDelta
from fsm_agent.models import GeminiModel, OpenAIResponsesModel
from fsm_agent.testing import demo_registry

KEY = "sk-proj-test-4f3e2d1c0b9a8f7e6d5c"
RESPONSES = "openai_responses"


def _responses(server: ProviderServer) -> OpenAIResponsesModel:
    return OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=server.url + "/v1", max_retries=0)


def test_a_streamed_responses_run_hands_on_text_and_sends_the_streamed_reasoning_back(
    provider_server: ProviderServer,
) -> None:
    """Text deltas reach the text hook; the reasoning of the streamed tool turn goes back as the stream ended it."""
    provider_server.rules.append(openai_reasoning)
    provider_server.queue(streamed(RESPONSES, "stream_reasoning_call"), streamed(RESPONSES, "stream_final_answer"))
    pieces: list[TextDelta] = []
    with _responses(provider_server) as model:
        agent = Agent(model, demo_registry())
        agent.on("text", pieces.append)
        result = agent.run(QUESTION)
    assert result.ok
    assert [p.text for p in pieces] == ["(2+3)", "*4 ", "= 20"]
    first, second = provider_server.requests
    assert first.json["stream"] is True
    assert second.json["input"][1:3] == body(RESPONSES, "reasoning_call")["output"]
    assert result.messages[-1].provider_data is not None


def test_a_streamed_cut_response_stops_with_max_tokens_and_its_text(provider_server: ProviderServer) -> None:
    """response.incomplete for max_output_tokens, streamed, is the same stop as unstreamed."""
    provider_server.queue(streamed(RESPONSES, "stream_incomplete_max_output_tokens"))
    with _responses(provider_server) as model:
        agent = Agent(model, demo_registry())
        agent.on("text", lambda piece: None)
        stop = stop_of(agent)
    assert stop.reason == "max_tokens"
    assert stop.result.final == "Let me work this out step by step: first, 2+3 is"


def test_the_async_stream_of_responses_keeps_the_reasoning_too(provider_server: ProviderServer) -> None:
    """acomplete_stream, through the async client, gives the same reply as the sync stream."""
    provider_server.rules.append(openai_reasoning)
    provider_server.queue(streamed(RESPONSES, "stream_reasoning_call"), streamed(RESPONSES, "stream_final_answer"))
    pieces: list[TextDelta] = []
    model = _responses(provider_server)

    async def go() -> str:
        async with model:
            agent = Agent(model, demo_registry())
            agent.on("text", pieces.append)
            return (await agent.arun(QUESTION)).final

    assert asyncio.run(go()) == "(2+3)*4 = 20"
    assert "".join(p.text for p in pieces) == "(2+3)*4 = 20"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_streamed_gemini_run_puts_the_chunks_back_together_with_their_signatures(
    provider_server: ProviderServer, driver: str
) -> None:
    """Chunks become one reply, parts unmerged: the streamed call's signature goes back, and so does the answer's."""
    provider_server.rules.append(gemini_thought_signatures)
    provider_server.queue(streamed("gemini", "stream_thought_call"), streamed("gemini", "stream_final_answer"))
    pieces: list[TextDelta] = []
    model = GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=provider_server.url, max_retries=0)
    agent = Agent(model, demo_registry())
    agent.on("text", pieces.append)

    async def go() -> str:
        async with model:
            return (await agent.arun(QUESTION)).final

    if driver == "sync":
        with model:
            final = agent.run(QUESTION).final
    else:
        final = asyncio.run(go())
    assert final == "(2+3)*4 = 20"
    assert [p.text for p in pieces] == ["(2+3)", "*4 = 20"]
    first, second = provider_server.requests
    assert first.path.endswith(":streamGenerateContent?alt=sse")
    served = body("gemini", "thought_call")["candidates"][0]["content"]["parts"]
    sent = second.json["contents"][1]["parts"]
    assert [p.get("thought") for p in sent] == [True, None]
    assert base64.urlsafe_b64decode(sent[1]["thoughtSignature"]) == base64.b64decode(served[1]["thoughtSignature"])
