"""Sub-agents draw on their parent's budget together; a used-up budget is a stop; an agent is never its own child."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, RunResult, ToolRegistry, Usage
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


def _finish(agent: Agent, driver: str) -> RunResult:
    if driver == "sync":
        return agent.run("go")
    return asyncio.run(agent.arun("go"))


class _Spender:
    """A child model that spends 40 tokens a call and never answers, so only its budget stops it."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, messages: Sequence[Message], tools: list[Any]) -> ModelResponse:
        """Ask for one more lookup, spending 40 tokens."""
        self.calls += 1
        return tool_turn(tool_call("look", n=self.calls), usage=Usage(30, 10))


def _looker() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.register
    def look(n: int) -> str:
        """Look one thing up."""
        return f"found {n}"

    return tools


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("children", [2, 4])
def test_sub_agents_called_together_share_the_parents_budget(driver: str, children: int) -> None:
    """Budget 100, k children at once: together they spend at most 100 plus one model call (40) each."""
    spender = _Spender()
    tools = ToolRegistry()
    tools.register(Agent(spender, _looker(), max_steps=50).as_tool("helper", "Looks things up."))
    calls = [tool_call("helper", id=f"c{i}", input=f"task {i}") for i in range(children)]
    parent = Agent(FakeModel(tool_turn(*calls), reply("never")), tools, token_budget=100, max_consecutive_failures=9)
    with pytest.raises(AgentLoopError) as stopped:
        _finish(parent, driver)
    result = stopped.value.result
    spent = 40 * spender.calls
    share = 100 // children
    # Each child stops after the call that reached its share: at most ceil(share / 40) calls of 40 tokens.
    assert spender.calls <= children * -(-share // 40)
    assert spent <= 100 + 40 * children
    assert result.reason == "token_budget"
    assert result.usage.input_tokens + result.usage.output_tokens == spent


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_budget_used_up_exactly_stops_on_token_budget_and_the_child_is_never_asked(driver: str) -> None:
    """The parent spent all 40 of its 40 tokens: the sub-agent call is a token_budget tool error, no ValueError."""
    spender = _Spender()
    tools = ToolRegistry()
    tools.register(Agent(spender, _looker()).as_tool("helper", "Looks things up."))
    script = [tool_turn(tool_call("helper", id="c1", input="task"), usage=Usage(30, 10)), reply("never")]
    parent = Agent(FakeModel(script), tools, token_budget=40)
    with pytest.raises(AgentLoopError) as stopped:
        _finish(parent, driver)
    result = stopped.value.result
    assert spender.calls == 0
    told = json.loads(next(m.content for m in result.messages if m.role == "tool"))
    assert (told["reason"], told["evidence"]["share"]) == ("token_budget", 0)
    assert edges(result)[-1] == "ExecuteTool->Failed[token_budget]"


@pytest.mark.parametrize("through", [0, 2])
def test_an_agent_that_is_its_own_sub_agent_is_refused_before_it_runs(through: int) -> None:
    """Directly, or through two other agents: a ValueError naming the path, and no model call."""
    model = FakeModel(tool_turn(tool_call("next", id="c1", input="again")))
    tools = ToolRegistry()
    agent = Agent(model, tools)
    chain = [agent]
    for _ in range(through):
        registry = ToolRegistry()
        chain.append(Agent(FakeModel(reply("x")), registry))
    for caller, callee in zip(chain, [*chain[1:], agent], strict=True):
        caller.registry.register(callee.as_tool("next", "The next agent."))
    names = " -> ".join(["'next'"] * (through + 1))
    with pytest.raises(ValueError, match=f"its own sub-agent through {names}"):
        agent.run("go")
    assert model.seen == []


@pytest.mark.parametrize("driver", DRIVERS)
def test_sub_agents_called_together_share_the_parents_tool_calls(driver: str) -> None:
    """max_tool_calls=6, two sub-agent calls at once: each child may make (6 - 2) / 2 = 2 calls, the parent counts 6."""
    looked: list[int] = []
    counted = ToolRegistry()

    @counted.register
    def look(n: int) -> str:
        """Look one thing up, counted."""
        looked.append(n)
        return f"found {n}"

    tools = ToolRegistry()
    tools.register(Agent(_Spender(), counted, max_steps=50).as_tool("helper", "Looks things up."))
    calls = [tool_call("helper", id=f"c{i}", input=f"task {i}") for i in range(2)]
    parent = Agent(FakeModel(tool_turn(*calls), reply("done")), tools, max_tool_calls=6, max_consecutive_failures=9)
    result = _finish(parent, driver)
    assert len(looked) == 4
    assert result.steps[-1].counters["tool_calls"] == [6, 6]
    told = [json.loads(m.content) for m in result.messages if m.role == "tool"]
    assert [t["reason"] for t in told] == ["max_tool_calls", "max_tool_calls"]
