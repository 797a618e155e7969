"""What ``Agent(model, tools)`` accepts besides a model object and a registry: model strings and lists of functions."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path
from typing import Any

import pytest
from support.provider_server import ProviderServer, body

import fsm_agent
from fsm_agent import Agent, RunContext, ToolRegistry
from fsm_agent.models import AnthropicModel, GeminiModel, OpenAIChatModel, OpenAIResponsesModel
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

ROOT = Path(__file__).resolve().parents[2]


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def shout(text: str, ctx: RunContext[str]) -> str:
    """Say it loudly, in the run's own voice."""
    return f"{ctx.deps}: {text.upper()}"


def test_a_list_of_functions_becomes_the_agents_registry() -> None:
    """Agent(model, [f, g]) registers each function, schemas from its hints, and runs them like any tool."""
    model = FakeModel(tool_turn(tool_call("add", a=2, b=3), tool_call("shout", text="hi")), reply("done"))
    agent = Agent(model, [add, shout])
    assert isinstance(agent.registry, ToolRegistry)
    assert list(agent.registry) == ["add", "shout"]
    assert model.tools_seen == []
    result = agent.run("go", deps="bot")
    assert [m.content for m in result.messages if m.role == "tool"] == ["5", '"bot: HI"']
    assert [t["name"] for t in model.tools_seen[0]] == ["add", "shout"]
    assert model.tools_seen[0][1]["parameters"]["properties"] == {"text": {"type": "string"}}


def test_an_empty_list_is_an_agent_without_tools() -> None:
    """Agent(model, []) offers no tools."""
    model = FakeModel(reply("hello"))
    assert Agent(model, []).run("hi").final == "hello"
    assert model.tools_seen == [[]]


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ([add, 3], "item 1 is int 3, not callable"),
        ((add, "shout"), "item 1 is str 'shout', not callable"),
        ("add", "registry must be a ToolRegistry or a list of functions, got str"),
        ({"add": add}, "registry must be a ToolRegistry or a list of functions, got dict"),
    ],
)
def test_tools_that_are_not_functions_are_a_type_error_naming_them(tools: Any, message: str) -> None:
    """A non-callable in the list, or something that is no list of functions, is refused before any run."""
    with pytest.raises(TypeError, match=message):
        Agent(FakeModel(), tools)


@pytest.mark.parametrize(
    ("spec", "adapter", "name"),
    [
        ("openai:gpt-4o-mini", OpenAIChatModel, "gpt-4o-mini"),
        ("openai-responses:o4-mini", OpenAIResponsesModel, "o4-mini"),
        ("anthropic:claude-sonnet-4-5", AnthropicModel, "claude-sonnet-4-5"),
        ("gemini:gemini-2.5-flash", GeminiModel, "gemini-2.5-flash"),
    ],
)
def test_a_model_string_builds_the_adapter_the_command_line_would(
    spec: str, adapter: type, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent("provider:name") accepts the strings --model does, each its provider's adapter for that model."""
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.setenv(variable, "test-key")
    agent = Agent(spec, [add])
    assert type(agent.model) is adapter
    assert agent.model.model == name  # type: ignore[union-attr]


@pytest.mark.parametrize("spec", ["gpt-4o-mini", "mistral:large", "openai:"])
def test_a_bad_model_string_is_a_value_error_naming_the_providers(spec: str) -> None:
    """A string that is no PROVIDER:NAME of a known provider is refused, saying which providers there are."""
    with pytest.raises(ValueError, match="PROVIDER:NAME with PROVIDER one of openai, openai-responses, anthropic"):
        Agent(spec, [])


def test_an_agent_named_by_a_string_runs_against_its_provider(
    provider_server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built adapter is a working model: the SDK reads its key and URL from the environment, as usual."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider_server.url}/v1")
    provider_server.queue(body("openai", "final_answer"))
    result = Agent("openai:gpt-4o-mini", []).run("what is 2 + 2?")
    assert result.ok
    assert result.final
    assert provider_server.requests[0].headers["authorization"] == "Bearer test-key"


def test_version_falls_back_to_pyproject_when_the_package_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source tree nobody installed still knows its version: the one in pyproject.toml."""

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.delitem(fsm_agent.__dict__, "__version__", raising=False)  # looked up again, not the cached one
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert fsm_agent.__version__ == project["version"]
