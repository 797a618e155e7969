"""Adapters that put real models behind the engine's ``Model`` protocol, through the providers' official SDKs.

The SDKs are optional extras (``pip install 'fsm-agent[openai]'``,
``'fsm-agent[anthropic]'``, ``'fsm-agent[gemini]'``) and are imported only when an adapter is built,
so importing this package never needs them; building an adapter without its
SDK raises ``ImportError`` with the install command.
"""

from fsm_agent.models.anthropic_messages import AnthropicModel
from fsm_agent.models.gemini import GeminiModel
from fsm_agent.models.openai_chat import OpenAIChatModel
from fsm_agent.models.openai_responses import OpenAIResponsesModel
from fsm_agent.models.redaction import RedactedError
from fsm_agent.models.replies import MalformedReplyError

__all__ = [
    "AnthropicModel",
    "GeminiModel",
    "MalformedReplyError",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "RedactedError",
]
