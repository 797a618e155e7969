"""OpenTelemetry spans of runs over the real provider adapters: the GenAI conventions' names and finish reasons."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from support.provider_server import QUESTION, ProviderServer, body
from support.sdk import skip_unless_installed

from fsm_agent import Agent
from fsm_agent.models import AnthropicModel, GeminiModel, OpenAIChatModel, OpenAIResponsesModel
from fsm_agent.models.provider import ProviderModel
from fsm_agent.testing import demo_registry

skip_unless_installed("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

KEY = "sk-test-4f7c0d9e2b1a8c3f5e6d7a9b"


@dataclass(frozen=True)
class Case:
    """A provider's two-turn run (a tool call, then the answer) and what its spans must say."""

    name: str
    build: Callable[[str], ProviderModel]
    turns: tuple[str, str]
    operation_name: str  # a member of the GenAI conventions' operation names
    finish_reasons: tuple[str, str]  # the provider's own value for each turn, as its reply said it

    @property
    def operation(self) -> str:
        """The operation's name in the GenAI conventions."""
        from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

        return str(gen_ai.GenAiOperationNameValues[self.operation_name].value)


CASES = [
    Case(
        "openai",
        lambda url: OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{url}/v1"),
        ("tool_call", "final_answer"),
        "CHAT",
        ("tool_calls", "stop"),
    ),
    Case(
        "openai_responses",
        lambda url: OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=f"{url}/v1"),
        ("reasoning_call", "final_answer"),
        "CHAT",
        ("completed", "completed"),
    ),
    Case(
        "anthropic",
        lambda url: AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=url),
        ("tool_use", "final_answer"),
        "CHAT",
        ("tool_use", "end_turn"),
    ),
    Case(
        "gemini",
        lambda url: GeminiModel("gemini-2.5-flash", api_key=f"AIza-{KEY}", base_url=url),
        ("thought_call", "answer"),
        "GENERATE_CONTENT",
        ("STOP", "STOP"),
    ),
]


def _traced_run(case: Case, server: ProviderServer) -> list[ReadableSpan]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from fsm_agent.otel import instrument

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
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

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
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

    spans = _traced_run(case, provider_server)
    run = dict(next(s for s in spans if s.name.startswith("invoke_agent")).attributes or {})
    (message,) = json.loads(str(run[gen_ai.GEN_AI_OUTPUT_MESSAGES]))
    assert message == {
        "role": "assistant",
        "parts": [{"type": "text", "content": "(2+3)*4 = 20"}],
        "finish_reason": case.finish_reasons[1],
    }
