"""OpenTelemetry spans of runs over the real provider adapters: the GenAI conventions' names and finish reasons."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from provider_server import QUESTION, ProviderServer, body

from fsm_agent import Agent
from fsm_agent.models import AnthropicModel, GeminiModel, OpenAIChatModel, OpenAIResponsesModel
from fsm_agent.models.provider import ProviderModel
from fsm_agent.otel import instrument
from fsm_agent.testing import demo_registry

KEY = "sk-test-4f7c0d9e2b1a8c3f5e6d7a9b"
OPERATION = gen_ai.GenAiOperationNameValues


@dataclass(frozen=True)
class Case:
    """A provider's two-turn run (a tool call, then the answer) and what its spans must say."""

    name: str
    build: Callable[[str], ProviderModel]
    turns: tuple[str, str]
    operation: str
    finish_reasons: tuple[str, str]  # the provider's own value for each turn, as its reply said it


CASES = [
    Case(
        "openai",
        lambda url: OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{url}/v1"),
        ("tool_call", "final_answer"),
        OPERATION.CHAT.value,
        ("tool_calls", "stop"),
    ),
    Case(
        "openai_responses",
        lambda url: OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=f"{url}/v1"),
        ("reasoning_call", "final_answer"),
        OPERATION.CHAT.value,
        ("completed", "completed"),
    ),
    Case(
        "anthropic",
        lambda url: AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=url),
        ("tool_use", "final_answer"),
        OPERATION.CHAT.value,
        ("tool_use", "end_turn"),
    ),
    Case(
        "gemini",
        lambda url: GeminiModel("gemini-2.5-flash", api_key=f"AIza-{KEY}", base_url=url),
        ("thought_call", "answer"),
        OPERATION.GENERATE_CONTENT.value,
        ("STOP", "STOP"),
    ),
]


def _traced_run(case: Case, server: ProviderServer) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server.queue(*(body(case.name, turn) for turn in case.turns))
    with case.build(server.url) as model:
        agent = Agent(model, demo_registry())
        instrument(agent, provider, capture_content=True)
        assert agent.run(QUESTION).ok
    return list(exporter.get_finished_spans())


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_model_call_spans_name_the_conventions_operation_and_the_providers_own_finish_reasons(
    provider_server: ProviderServer, case: Case
) -> None:
    """Gemini's calls are generate_content, the others chat; finish reasons are the provider's, not the engine's."""
    spans = _traced_run(case, provider_server)
    run = dict(next(s for s in spans if s.name.startswith("invoke_agent")).attributes or {})
    calls = [s for s in spans if (s.attributes or {}).get(gen_ai.GEN_AI_OPERATION_NAME) == case.operation]
    assert [s.name for s in calls] == [f"{case.operation} {run[gen_ai.GEN_AI_REQUEST_MODEL]}"] * 2
    reasons = [tuple((s.attributes or {})[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS]) for s in calls]
    assert reasons == [(reason,) for reason in case.finish_reasons]
    replies = [json.loads(str((s.attributes or {})[gen_ai.GEN_AI_OUTPUT_MESSAGES])) for s in calls]
    assert [reply[0]["finish_reason"] for reply in replies] == list(case.finish_reasons)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_run_spans_output_message_carries_the_finish_reason_the_schema_requires(
    provider_server: ProviderServer, case: Case
) -> None:
    """The invoke_agent span's answer is an OutputMessage: role, parts and the answer's finish_reason."""
    spans = _traced_run(case, provider_server)
    run = dict(next(s for s in spans if s.name.startswith("invoke_agent")).attributes or {})
    (message,) = json.loads(str(run[gen_ai.GEN_AI_OUTPUT_MESSAGES]))
    assert message == {
        "role": "assistant",
        "parts": [{"type": "text", "content": "(2+3)*4 = 20"}],
        "finish_reason": case.finish_reasons[1],
    }
