"""Each adapter's calls priced by genai-prices: the cached and reasoning tokens read, the figure the package gives.

The SDK clients are the real ones, at the providers' own URLs (which is how
genai-prices knows the provider), with an httpx transport answering from the
recorded bodies instead of the network; each body's usage is a realistic one
with cached (and, where the provider has them, reasoning) tokens.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import genai_prices
import httpx
import pytest
from support.provider_server import body

from fsm_agent import Agent, AgentLoopError, Price, Usage
from fsm_agent.core.pricing import pricing_of
from fsm_agent.models import AnthropicModel, GeminiModel, MalformedReplyError, OpenAIChatModel, OpenAIResponsesModel
from fsm_agent.testing import demo_registry


def _transport(answer: dict[str, Any]) -> httpx.Client:
    """An httpx client that answers every request with ``answer``, sent nowhere."""
    return httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200, json=answer)))


def _with_usage(provider: str, name: str, usage_key: str, usage: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = copy.deepcopy(body(provider, name))
    answer[usage_key] = usage
    return answer


def _openai_chat(answer: dict[str, Any]) -> OpenAIChatModel:
    import openai

    return OpenAIChatModel("o4-mini", openai.OpenAI(api_key="test-key", http_client=_transport(answer)))


def _openai_responses(answer: dict[str, Any]) -> OpenAIResponsesModel:
    import openai

    return OpenAIResponsesModel("gpt-5-mini", openai.OpenAI(api_key="test-key", http_client=_transport(answer)))


def _anthropic(answer: dict[str, Any]) -> AnthropicModel:
    import anthropic

    return AnthropicModel("claude-sonnet-4-5", anthropic.Anthropic(api_key="test-key", http_client=_transport(answer)))


def _gemini(answer: dict[str, Any]) -> GeminiModel:
    from google import genai

    options = genai.types.HttpOptions(httpx_client=_transport(answer))
    return GeminiModel("gemini-2.5-flash", genai.Client(api_key="test-key", http_options=options))


CASES: dict[str, tuple[Callable[[dict[str, Any]], Any], dict[str, Any], str, dict[str, int]]] = {
    # Chat Completions: prompt_tokens counts the cached ones, completion_tokens the reasoning ones.
    "openai-chat": (
        _openai_chat,
        _with_usage(
            "openai",
            "final_answer",
            "usage",
            {
                "prompt_tokens": 5200,
                "completion_tokens": 900,
                "total_tokens": 6100,
                "prompt_tokens_details": {"cached_tokens": 4096, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 704, "audio_tokens": 0},
            },
        ),
        "openai",
        {"input_tokens": 5200, "cache_read_tokens": 4096, "output_tokens": 900, "reasoning_tokens": 704},
    ),
    "openai-responses": (
        _openai_responses,
        _with_usage(
            "openai_responses",
            "final_answer",
            "usage",
            {
                "input_tokens": 3300,
                "input_tokens_details": {"cached_tokens": 2048},
                "output_tokens": 1250,
                "output_tokens_details": {"reasoning_tokens": 1024},
                "total_tokens": 4550,
            },
        ),
        "openai",
        {"input_tokens": 3300, "cache_read_tokens": 2048, "output_tokens": 1250, "reasoning_tokens": 1024},
    ),
    # Anthropic's input_tokens leaves the cache out: the adapter adds what was written to it and read from it.
    "anthropic": (
        _anthropic,
        _with_usage(
            "anthropic",
            "final_answer",
            "usage",
            {
                "input_tokens": 350,
                "cache_creation_input_tokens": 1800,
                "cache_read_input_tokens": 12000,
                "output_tokens": 640,
                "service_tier": "standard",
            },
        ),
        "anthropic",
        {"input_tokens": 14150, "cache_read_tokens": 12000, "cache_write_tokens": 1800, "output_tokens": 640},
    ),
    # Gemini's prompt count includes the cached content; its thoughts are billed as output.
    "gemini": (
        _gemini,
        _with_usage(
            "gemini",
            "answer",
            "usageMetadata",
            {
                "promptTokenCount": 9000,
                "cachedContentTokenCount": 8192,
                "candidatesTokenCount": 300,
                "thoughtsTokenCount": 1200,
                "totalTokenCount": 10500,
            },
        ),
        "google",
        {"input_tokens": 9000, "cache_read_tokens": 8192, "output_tokens": 1500, "reasoning_tokens": 1200},
    ),
}


def _genai_figure(model: str, provider: str, counts: dict[str, int]) -> float:
    """What genai-prices itself says the usage costs (reasoning tokens are output tokens there too)."""
    priced = {name: value for name, value in counts.items() if name != "reasoning_tokens"}
    calculation = genai_prices.calc_price(genai_prices.Usage(**priced), model, provider_id=provider)
    return float(calculation.total_price)


@pytest.mark.parametrize("case", CASES)
def test_each_adapters_call_costs_what_genai_prices_says_for_its_usage(case: str) -> None:
    """The usage the adapter read, its cached and reasoning tokens included, is priced at genai-prices' figure."""
    build, answer, provider, counts = CASES[case]
    model = build(answer)
    agent = Agent(model, demo_registry())
    replies: list[Usage | None] = []
    agent.on("after_model", lambda event: replies.append(event.response.usage))
    result = agent.run("What is (2+3)*4?")
    expected = _genai_figure(model.model, provider, counts)
    assert expected > 0
    [usage] = replies
    assert usage is not None
    assert {name: getattr(usage, name) for name in counts} == counts
    assert usage.cost == pytest.approx(expected, rel=1e-12)
    assert result.usage.cost == pytest.approx(expected, rel=1e-12)
    assert result.steps[-1].counters["cost"] == [pytest.approx(expected, rel=1e-12), None]


def test_the_cached_tokens_make_the_call_cheaper_than_uncached_input() -> None:
    """The same tokens, none cached, cost more: the cached rate was really applied."""
    build, answer, _, _ = CASES["anthropic"]
    cached = Agent(build(answer), demo_registry()).run("q").usage.cost
    uncached_answer = copy.deepcopy(answer)
    uncached_answer["usage"].update(input_tokens=14150, cache_creation_input_tokens=0, cache_read_input_tokens=0)
    uncached = Agent(build(uncached_answer), demo_registry()).run("q").usage.cost
    assert cached is not None
    assert uncached is not None
    assert cached < uncached


def test_a_self_hosted_server_is_unpriced_rather_than_billed_at_the_providers_rates() -> None:
    """An OpenAI-compatible server at another URL, its model named like OpenAI's: unknown, not OpenAI's figure."""
    model = OpenAIChatModel("gpt-4o", api_key="test-key", base_url="http://127.0.0.1:9/v1")
    pricing = pricing_of(model, None)
    assert not pricing.known
    assert pricing(Usage(1000, 100)) is None


def test_prices_given_for_a_model_win_over_genai_prices() -> None:
    """A Price passed for the model's name is used, not the package's figure."""
    build, answer, _, _ = CASES["openai-chat"]
    mine = Price(input_per_mtok=1, output_per_mtok=2, cached_input_per_mtok=0.5)
    result = Agent(build(answer), demo_registry(), prices={"o4-mini": mine}).run("q")
    # 1104 uncached at $1, 4096 cached at $0.50, 900 output at $2, per million.
    assert result.usage.cost == pytest.approx((1104 * 1 + 4096 * 0.5 + 900 * 2) / 1e6, rel=1e-12)


def test_a_malformed_cached_count_is_a_model_error_naming_the_field() -> None:
    """A breakdown count that is not a whole number is refused by name, never priced as zero."""
    build, answer, _, _ = CASES["openai-chat"]
    broken = copy.deepcopy(answer)
    broken["usage"]["prompt_tokens_details"]["cached_tokens"] = -1
    with pytest.raises(AgentLoopError) as stop:
        Agent(build(broken), demo_registry()).run("q")
    assert stop.value.reason == "model_error"
    assert isinstance(stop.value.__cause__, MalformedReplyError)
    assert stop.value.__cause__.field == "usage.prompt_tokens_details.cached_tokens"


@pytest.mark.subprocess  # a fresh interpreter: what this process imported already cannot show
def test_an_agent_is_built_without_asking_genai_prices_until_a_price_is_needed() -> None:
    """Building an agent over an adapter does not load genai-prices' data; its first priced call or a budget does."""
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent(
        """
        import sys
        import openai
        from fsm_agent import Agent
        from fsm_agent.models import OpenAIChatModel
        from fsm_agent.testing import demo_registry
        model = OpenAIChatModel("gpt-4o-mini", openai.OpenAI(api_key="k"))
        agent = Agent(model, demo_registry())
        print("genai_prices" in sys.modules, agent.settings.pricing.known, "genai_prices" in sys.modules)
        Agent(model, demo_registry(), cost_budget=1.0)
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.split() == ["False", "True", "True"]
