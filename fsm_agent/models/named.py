"""Models named by a string, ``"openai:gpt-4o-mini"``: what ``Agent("provider:name", ...)`` and ``--model`` accept.

The provider before the colon picks the adapter, the rest is the
provider's model name.  The adapter reads its API key from the
environment as its SDK does (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``,
``GOOGLE_API_KEY`` then ``GEMINI_API_KEY``), and the SDK is imported only
when the adapter is built.
"""

from __future__ import annotations

from typing import Any

from fsm_agent.models.anthropic_messages import AnthropicModel
from fsm_agent.models.gemini import GeminiModel
from fsm_agent.models.openai_chat import OpenAIChatModel
from fsm_agent.models.openai_responses import OpenAIResponsesModel
from fsm_agent.models.provider import ProviderModel

ADAPTERS: dict[str, type[ProviderModel]] = {
    "openai": OpenAIChatModel,
    "openai-responses": OpenAIResponsesModel,
    "anthropic": AnthropicModel,
    "gemini": GeminiModel,
}
"""Provider prefix of a model string -> the adapter that talks to it."""


def split_name(spec: str) -> tuple[str, str]:
    """``"provider:name"`` as its provider and name; a ``ValueError`` naming the providers for anything else."""
    provider, _, name = spec.partition(":")
    if provider not in ADAPTERS or not name:
        msg = f"a model string is PROVIDER:NAME with PROVIDER one of {', '.join(ADAPTERS)}, got {spec!r}"
        raise ValueError(msg)
    return provider, name


def model_named(spec: str, **settings: Any) -> ProviderModel:
    """The adapter for ``"provider:name"``, built with ``settings`` (``api_key``, ``base_url``, ``max_retries``).

    Without an SDK installed it is the adapter's ``ImportError``, which
    names the package to install.
    """
    provider, name = split_name(spec)
    adapter: Any = ADAPTERS[provider]  # each takes the model's name and these settings; ProviderModel's own does not
    return adapter(name, **settings)  # type: ignore[no-any-return]
