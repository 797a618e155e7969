"""MCP tools behind a real adapter: the real test server's tools, called by a model on the loopback provider server.

What the MCP module promises about results (``fsm_agent.mcp``: an ``isError``
result is ``{"error": ...}`` "and the Anthropic adapter marks it
``is_error``"; docs/how-to/mcp.md: schemas "exactly as the server lists
them", "async with ... works the same for agent.arun") is checked on the
wire, in the request the provider receives, on both drivers.
"""

from __future__ import annotations

import asyncio
import copy
import sys
from pathlib import Path
from typing import Any

import pytest
from support.provider_server import ProviderServer, body
from support.sdk import skip_unless_installed

from fsm_agent import Agent, AgentLoopError, RunResult, ToolRegistry
from fsm_agent.models import AnthropicModel

skip_unless_installed("mcp", reason="the mcp extra is not installed: pip install -e '.[mcp]'")

SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_server.py"
KEY = "sk-test-4f7c0d9e2b1a8c3f5e6d7a9b"
DRIVERS = ["sync", "async"]


def _tool_use(name: str, arguments: dict[str, Any], call_id: str = "toolu_01Mcp") -> dict[str, Any]:
    data = copy.deepcopy(body("anthropic", "tool_use"))
    data["content"][1].update(id=call_id, name=name, input=arguments)
    return data


def _run(server: ProviderServer, driver: str, tmp_path: Path, question: str) -> tuple[RunResult, ToolRegistry]:
    from fsm_agent.mcp import stdio_tools

    env = {"FSM_AGENT_TEST_COUNTS": str(tmp_path / "counts.json")}
    model = AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=server.url, max_retries=0)
    connection = stdio_tools(sys.executable, [str(SERVER)], env)

    def run(agent: Agent) -> RunResult:
        try:
            return agent.run(question)
        except AgentLoopError as stop:
            return stop.result

    async def arun() -> tuple[RunResult, ToolRegistry]:
        async with connection as tools, model:
            agent = Agent(model, tools, max_consecutive_failures=5)
            try:
                return await agent.arun(question), tools
            except AgentLoopError as stop:
                return stop.result, tools

    if driver == "async":
        return asyncio.run(arun())
    with connection as tools, model:
        return run(Agent(model, tools, max_consecutive_failures=5)), tools


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_the_servers_tools_reach_the_provider_as_listed_and_their_results_come_back(
    provider_server: ProviderServer, tmp_path: Path, driver: str
) -> None:
    """Each tool's name, description and input schema as the server listed it; the result text as the tool message."""
    provider_server.queue(_tool_use("add", {"a": 2, "b": 3}), body("anthropic", "final_answer"))
    result, tools = _run(provider_server, driver, tmp_path, "What is (2+3)*4?")
    assert result.ok
    sent_tools = provider_server.requests[0].json["tools"]
    assert [t["name"] for t in sent_tools] == list(tools)
    add = next(t for t in sent_tools if t["name"] == "add")
    assert add["input_schema"] == tools.get("add").parameters
    assert add["description"] == "Add two integers."
    results = [b for b in provider_server.requests[1].json["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert results == [{"type": "tool_result", "tool_use_id": "toolu_01Mcp", "content": "5"}]


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_server_error_result_goes_to_anthropic_marked_is_error(
    provider_server: ProviderServer, tmp_path: Path, driver: str
) -> None:
    """``isError`` from the server: a failed call, sent as a ``tool_result`` with ``is_error`` and the server's text."""
    provider_server.queue(_tool_use("refuse", {"why": "no \U0001f600 today"}), body("anthropic", "final_answer"))
    result, _ = _run(provider_server, driver, tmp_path, "Refuse.")
    assert result.ok
    (step,) = [s for s in result.steps if s.kind == "tool_call"]
    assert step.counters["failures"][0] == 1
    (block,) = [b for b in provider_server.requests[1].json["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert block["is_error"] is True
    assert "no \U0001f600 today" in block["content"]


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_server_that_dies_mid_call_is_a_tool_error_sent_to_the_model_and_the_run_goes_on(
    provider_server: ProviderServer, tmp_path: Path, driver: str
) -> None:
    """The crash is the call's failed result (``is_error``); the model then answers and the run ends done."""
    provider_server.queue(_tool_use("crash", {}), body("anthropic", "final_answer"))
    result, _ = _run(provider_server, driver, tmp_path, "Crash.")
    assert result.ok
    (block,) = [b for b in provider_server.requests[1].json["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert block["is_error"] is True
    assert '"error"' in block["content"]
