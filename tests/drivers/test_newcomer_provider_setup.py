"""A newcomer's first real model: a missing key or a misspelt request setting, refused when the adapter is built.

No request is sent: every check here happens before the first model call.
``base_url`` points at a closed loopback port, so a request made by mistake
is refused at once and goes nowhere.
"""

from __future__ import annotations

import pytest
from support.newcomer import without_provider_keys

from fsm_agent import Agent
from fsm_agent.models import AnthropicModel, GeminiModel, OpenAIChatModel


def test_openai_without_a_key_is_refused_when_built_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OPENAI_API_KEY: ``Agent("openai:gpt-4o-mini", ...)`` fails at once, naming the variable to set."""
    without_provider_keys(monkeypatch)
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        Agent("openai:gpt-4o-mini", [])


def test_anthropic_without_a_key_is_refused_when_built_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, unused_port: int
) -> None:
    """No ANTHROPIC_API_KEY: refused when built, naming ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) and ``api_key=``."""
    without_provider_keys(monkeypatch)
    with pytest.raises((ValueError, TypeError), match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-sonnet-4-5", base_url=f"http://127.0.0.1:{unused_port}", max_retries=0)


def test_gemini_without_a_key_names_the_variables_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """No key: the ValueError names GOOGLE_API_KEY, the variable the guide says the adapter reads."""
    without_provider_keys(monkeypatch)
    with pytest.raises(ValueError, match="GOOGLE_API_KEY"):
        GeminiModel("gemini-2.5-flash")


@pytest.mark.parametrize("adapter", [OpenAIChatModel, AnthropicModel], ids=["openai", "anthropic"])
def test_a_misspelt_request_keyword_is_refused_when_the_model_is_built(
    adapter: type[OpenAIChatModel] | type[AnthropicModel], unused_port: int
) -> None:
    """``temprature=0.1``: a TypeError naming it when the adapter is built, as Gemini's guide promises for Gemini."""
    with pytest.raises(TypeError, match="temprature"):
        adapter("some-model", api_key="test-key", base_url=f"http://127.0.0.1:{unused_port}", temprature=0.1)


def test_gemini_refuses_a_misspelt_request_keyword_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The behaviour the other adapters lack: GeminiModel names the misspelt field at construction."""
    without_provider_keys(monkeypatch)
    with pytest.raises(ValueError, match="temprature"):
        GeminiModel("gemini-2.5-flash", api_key="test-key", temprature=0.1)
