"""A ``cost_budget`` over sub-agents of sub-agents: an unpriced one at any depth is refused like a direct one.

Its calls are the top agent's spending: unpriced, their dollars would never
reach the budget.  The refusal names the path of sub-agent tools down to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from fsm_agent import Agent, Message, ModelResponse, Price, ToolRegistry, Usage
from fsm_agent.core.pricing import UnpricedModelError
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

DEAR = Price(input_per_mtok=1000, output_per_mtok=1000)


def _helper(inner: Agent) -> ToolRegistry:
    """A registry with ``helper``: a priced sub-agent whose own tool is ``inner`` as ``deep``."""
    tools = ToolRegistry()
    middle = ToolRegistry()
    middle.register(inner.as_tool("deep", "Goes deeper."))
    tools.register(Agent(FakeModel([reply("x")]), middle, prices=DEAR).as_tool("helper", "Helps."))
    return tools


def test_an_unpriced_grandchild_is_refused_when_the_agent_is_built_naming_its_path() -> None:
    tools = _helper(Agent(FakeModel([reply("x")]), ToolRegistry()))
    with pytest.raises(UnpricedModelError, match="sub-agent 'helper' -> 'deep': cost_budget needs a price") as no:
        Agent(FakeModel([reply("x")]), tools, cost_budget=1, prices=DEAR)
    assert (no.value.sub_agent, no.value.through) == ("deep", ("helper",))


def test_an_unpriced_great_grandchild_is_refused_and_a_priced_tree_is_not() -> None:
    tools = _helper(
        Agent(FakeModel([reply("x")]), _helper(Agent(FakeModel([reply("x")]), ToolRegistry())), prices=DEAR)
    )
    with pytest.raises(UnpricedModelError, match="sub-agent 'helper' -> 'deep' -> 'helper' -> 'deep'"):
        Agent(FakeModel([reply("x")]), tools, cost_budget=1, prices=DEAR)
    priced = _helper(Agent(FakeModel([reply("x")]), ToolRegistry(), prices=DEAR))
    Agent(FakeModel([reply("x")]), priced, cost_budget=1, prices=DEAR)


class Counted:
    """Asks ``helper`` once per question, then answers; counts its calls.  ``ask=False``: answers at once."""

    def __init__(self, *, ask: bool = True) -> None:
        self.ask = ask
        self.calls = 0

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.calls += 1
        if self.ask and messages[-1].role == "user":
            return tool_turn(tool_call("helper", id=f"h{self.calls}", input="go"), usage=Usage(10, 1))
        return reply("done", usage=Usage(10, 1))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_unpriced_grandchild_registered_after_the_parent_ran_is_refused_before_its_next_run(driver: str) -> None:
    """The helper's own tools gain an unpriced sub-agent later: the parent's next run is refused, nothing called."""
    middle, tools = ToolRegistry(), ToolRegistry()
    helper_model, parent_model, deep_model = Counted(ask=False), Counted(), Counted(ask=False)
    tools.register(Agent(helper_model, middle, prices=DEAR).as_tool("helper", "Helps."))
    parent = Agent(parent_model, tools, cost_budget=1, prices=DEAR)
    assert parent.run("first").final == "done"  # a priced tree: it runs
    middle.register(Agent(deep_model, ToolRegistry()).as_tool("deep", "Goes deeper."))  # no price, after the fact
    calls = (parent_model.calls, helper_model.calls)
    second = (lambda: parent.run("second")) if driver == "sync" else (lambda: asyncio.run(parent.arun("second")))
    with pytest.raises(UnpricedModelError, match="sub-agent 'helper' -> 'deep': cost_budget needs a price"):
        second()
    assert (parent_model.calls, helper_model.calls, deep_model.calls) == (*calls, 0)  # refused before any call
