"""``cost_budget`` as an app paying for its users' runs reads it: a bound in dollars, sub-agents included.

At $1000 per million tokens in and out, 10 tokens cost one cent, so each
model call's cost is a round figure.  Every tool counts its executions.
"""

from __future__ import annotations

import asyncio

import pytest

from fsm_agent import Agent, AgentLoopError, ModelResponse, Price, RunResult, ToolRegistry, Usage
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DEAR = Price(input_per_mtok=1000, output_per_mtok=1000)
CENT = Usage(6, 4)
"""One cent at ``DEAR``."""


def _child(ran: list[str], looks: int) -> Agent:
    """A sub-agent that looks ``looks`` things up, one model call (a cent) each, then answers (a cent)."""
    tools = ToolRegistry()

    @tools.register
    def look(n: int) -> str:
        """Look one thing up (counted)."""
        ran.append(f"look {n}")
        return f"found {n}"

    script: list[ModelResponse] = [tool_turn(tool_call("look", id=f"k{n}", n=n), usage=CENT) for n in range(looks)]
    return Agent(FakeModel([*script, reply("child done", usage=CENT)]), tools, prices=DEAR, max_steps=50)


def _parent(child: Agent, budget: float) -> tuple[Agent, FakeModel]:
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    model = FakeModel([tool_turn(tool_call("helper", id="h1", input="look"), usage=CENT), reply("ok", usage=CENT)])
    return Agent(model, tools, prices=DEAR, cost_budget=budget), model


def _ended(agent: Agent, driver: str) -> RunResult:
    try:
        return agent.run("go") if driver == "sync" else asyncio.run(agent.arun("go"))
    except AgentLoopError as stop:
        return stop.result


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_sub_agent_spends_at_most_one_model_call_past_its_parents_cost_budget(driver: str) -> None:
    """Budget 3 cents: after the parent's first call (1 cent), the child may pass what is left by one call at most.

    That is ``token_budget``'s bound (docs/how-to/sub-agents.md, "What
    bounds the child"), which issue #40 asked ``cost_budget`` to follow: a
    limit like ``token_budget``, a child's cost counting against it.
    """
    ran: list[str] = []
    parent, _ = _parent(_child(ran, looks=19), budget=0.03)
    result = _ended(parent, driver)
    assert result.reason == "cost_budget"
    assert result.usage.cost is not None
    assert result.usage.cost <= 0.03 + 0.01 + 1e-9, f"spent ${result.usage.cost} against a $0.03 budget"
    assert len(ran) <= 2


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_cost_budget_evidence_counts_every_priced_model_call_a_sub_agent_made(driver: str) -> None:
    """cost-budget.md: the evidence says how many calls were priced; the child's three calls are three of them.

    Budget 4 cents: after the parent's first call (1 cent) the child's share
    is 3 cents, its three calls exactly; the parent then stops before its next.
    """
    ran: list[str] = []
    parent, model = _parent(_child(ran, looks=2), budget=0.04)
    result = _ended(parent, driver)
    assert (result.reason, len(model.seen), len(ran)) == ("cost_budget", 1, 2)
    assert result.evidence["cost"] == pytest.approx(0.04)  # the parent's call and the child's three
    assert (result.evidence["priced_calls"], result.evidence["unpriced_calls"]) == (4, 0)
