"""A ``cost_budget`` over sub-agents of sub-agents: an unpriced one at any depth is refused like a direct one.

Its calls are the top agent's spending: unpriced, their dollars would never
reach the budget.  The refusal names the path of sub-agent tools down to it.
"""

from __future__ import annotations

import pytest

from fsm_agent import Agent, Price, ToolRegistry
from fsm_agent.core.pricing import UnpricedModelError
from fsm_agent.testing import FakeModel, reply

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
