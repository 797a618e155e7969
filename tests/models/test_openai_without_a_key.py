"""An OpenAI adapter built with no key anywhere: one message naming the adapter, OPENAI_API_KEY and ``api_key=``.

Before, the SDK's own error came out, naming admin keys and workload
identity, which no chat request takes; the Anthropic and Gemini adapters
already named what to set.
"""

from __future__ import annotations

import pytest
from support.newcomer import without_provider_keys

from fsm_agent.models import OpenAIChatModel, OpenAIResponsesModel


@pytest.mark.parametrize("adapter", [OpenAIChatModel, OpenAIResponsesModel], ids=lambda a: a.__name__)
def test_an_openai_adapter_without_a_key_says_what_to_set(
    adapter: type[OpenAIChatModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ValueError naming the adapter, the variable and ``api_key=``; nothing about admin keys."""
    without_provider_keys(monkeypatch)
    with pytest.raises(ValueError, match="api_key=") as refused:
        adapter("gpt-4o-mini")
    message = str(refused.value)
    assert message.startswith(f"{adapter.__name__} has no key: set OPENAI_API_KEY")
    assert "admin" not in message.lower()


def test_a_local_server_still_needs_some_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """``base_url`` without a key: the SDK needs one all the same, and the message says any text will do."""
    without_provider_keys(monkeypatch)
    with pytest.raises(ValueError, match="any text for a server that checks none"):
        OpenAIChatModel("llama3.1", base_url="http://127.0.0.1:9/v1")


def test_a_key_from_the_environment_is_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPENAI_API_KEY set: the adapter is built as before."""
    without_provider_keys(monkeypatch)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-from-the-environment")
    assert OpenAIChatModel("gpt-4o-mini").model == "gpt-4o-mini"
