"""A ``chat`` span names the model as it is when ``instrument`` is called, and a provider only a bundled adapter has.

``gen_ai.provider.name`` is the bundled adapter's provider, found along the
model class's bases: a subclass of an adapter has it, while a model of the
user's own whose module merely contains a provider's name
(``my_openai_wrap``) has none (it was guessed from that name).  A second
``instrument`` call reads the model's name again, as it takes over with its
own settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from support.sdk import skip_unless_installed
from support.spans import Spans, attributes

from fsm_agent import Agent, Message, ModelResponse
from fsm_agent.models import OpenAIChatModel
from fsm_agent.testing import FakeModel, demo_registry, reply

skip_unless_installed("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")


class Wrapped:
    """A model of the user's own, in a module whose name contains a provider's."""

    model = "house-1"

    def complete(self, messages: Sequence[Message], tools: Any) -> ModelResponse:
        return reply("hi")


Wrapped.__module__ = "my_openai_wrap"


class Subclassed(OpenAIChatModel):
    """A subclass of a bundled adapter, answering without a server."""

    def complete(self, messages: Sequence[Message], tools: Any, **options: Any) -> ModelResponse:
        return reply("hi")


def _chat_span(model: Any, spans: Spans) -> dict[str, Any]:
    from fsm_agent.otel import instrument

    agent = Agent(model, demo_registry())
    instrument(agent, tracer_provider=spans.provider)
    agent.run("q")
    (chat,) = spans.named("chat")
    return {"name": chat.name, **attributes(chat)}


def test_a_users_model_whose_module_names_a_provider_names_no_provider(spans: Spans) -> None:
    chat = _chat_span(Wrapped(), spans)
    assert chat["name"] == "chat house-1"
    assert "gen_ai.provider.name" not in chat


def test_a_subclass_of_a_bundled_adapter_names_its_provider(spans: Spans) -> None:
    model = Subclassed("gpt-4o-mini", api_key="sk-test-4f7c0d9e2b1a8c3f5e6d7a9b", base_url="http://127.0.0.1:9/v1")
    chat = _chat_span(model, spans)
    assert (chat["name"], chat["gen_ai.provider.name"]) == ("chat gpt-4o-mini", "openai")


def test_a_second_instrument_reads_the_models_name_again(spans: Spans) -> None:
    from fsm_agent.otel import instrument

    model = FakeModel(reply("one"), reply("two"))
    agent = Agent(model, demo_registry())
    instrument(agent, tracer_provider=spans.provider)
    agent.run("q")
    model.model = "scripted-2"  # type: ignore[attr-defined]
    instrument(agent, tracer_provider=spans.provider)
    agent.run("q")
    assert [span.name for span in spans.named("chat")] == ["chat", "chat scripted-2"]
    assert attributes(spans.named("chat")[1])["gen_ai.request.model"] == "scripted-2"
