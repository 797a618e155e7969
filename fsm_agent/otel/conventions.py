"""The GenAI semantic conventions' side of tracing: provider and operation names, finish reasons, message JSON.

What the conventions say a span holds, computed from the engine's records;
``fsm_agent.otel.instrumentation`` decides when spans open and close, this
module what their conventions' attributes read (``gen_ai.provider.name``,
``gen_ai.response.finish_reasons``, ``gen_ai.input.messages``, ...).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fsm_agent.records import ModelResponse, RunResult, ToolCall

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent


PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini"}
"""Bundled adapter module name fragment (``fsm_agent.models.<fragment>...``) -> ``gen_ai.provider.name``."""

ADAPTERS = "fsm_agent.models."
"""Where the bundled adapters live: only a class from there names its provider."""

OPERATIONS = {"gcp.gemini": "generate_content"}
"""``gen_ai.provider.name`` -> ``gen_ai.operation.name`` of its model calls, where it is not ``chat``."""


def model_name(agent: Agent) -> str | None:
    name = getattr(agent.model, "model", None)
    return name if isinstance(name, str) else None


def provider_name(agent: Agent) -> str | None:
    """The provider of the agent's model: that of the bundled adapter its class is, or derives from; else None.

    Only the bundled adapters' modules are asked, class by class along the
    method resolution order: a subclass of an adapter names its provider,
    while a model of the user's own whose module merely contains a
    provider's name (``my_openai_wrap``) names none.
    """
    for cls in type(agent.model).__mro__:
        module = cls.__module__
        if module.startswith(ADAPTERS):
            adapter = module.removeprefix(ADAPTERS)
            found = next((name for part, name in PROVIDERS.items() if adapter.startswith(part)), None)
            if found is not None:
                return found
    return None


def finish_reason(response: ModelResponse) -> str:
    """The reply's finish reason as its provider said it, which the bundled adapters keep; else its ``stop_reason``.

    Read by name: the adapters sit below this module and are not imported.
    """
    kept = getattr(response, "finish_reason", None)
    return kept if isinstance(kept, str) and kept else response.stop_reason


def text_message(role: str, text: str, finish_reason: str | None = None) -> str:
    """One message in the conventions' JSON shape (``gen_ai.input.messages`` / ``gen_ai.output.messages``).

    An output message must say why it finished (the OutputMessage schema requires ``finish_reason``).
    """
    entry: dict[str, Any] = {"role": role, "parts": [{"type": "text", "content": text}]}
    if finish_reason is not None:
        entry["finish_reason"] = finish_reason
    return json.dumps([entry], ensure_ascii=False)


def reply_message(response: ModelResponse) -> str:
    message = response.message
    parts: list[dict[str, Any]] = [{"type": "text", "content": message.content}] if message.content else []
    parts.extend(
        {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        for call in message.tool_calls
    )
    entry = {"role": "assistant", "parts": parts, "finish_reason": finish_reason(response)}
    return json.dumps([entry], ensure_ascii=False, default=str)


def answer_finish(result: RunResult, last_finish: tuple[str, str] | None) -> str:
    """Why the run's answer finished: its reply's reason when the run ended on it, else the conventions' ``error``.

    ``last_finish`` is the last reply's ``stop_reason`` and the finish reason reported for it.

    A run that is done, or stopped on its last reply's own signal (cut off,
    refused), ends on that reply; any other stop ended it from outside.
    """
    if last_finish is None:
        return "stop" if result.ok else "error"
    stop_reason, reported = last_finish
    return reported if result.ok or result.reason == stop_reason else "error"


def tool_arguments(call: ToolCall) -> str:
    """A tool call's arguments as ``gen_ai.tool.call.arguments`` holds them: the model's text where it was not JSON."""
    if call.raw_arguments is not None:
        return call.raw_arguments
    return json.dumps(call.arguments, ensure_ascii=False, default=str)
