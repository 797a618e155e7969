"""``cost_budget``: a run stopped before the model call that would pass its US dollars, a child's included.

Prices here are explicit (``Price``) and large, so each model call's cost
is a round figure: at $1000 per million tokens in and out, 10 tokens cost
one cent.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import pytest

from fsm_agent import (
    Agent,
    AgentLoopError,
    Limits,
    ModelResponse,
    Price,
    RunResult,
    ToolRegistry,
    UnpricedModelError,
    Usage,
    check,
)
from fsm_agent.models import OpenAIChatModel
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn

DEAR = Price(input_per_mtok=1000, output_per_mtok=1000)
"""$1000 per million tokens: 10 tokens cost a cent."""
CENT = Usage(6, 4)
"""A call's usage that costs one cent at ``DEAR``."""


def _counted() -> tuple[ToolRegistry, list[str]]:
    """A registry whose ``look`` tool records each execution, so a test sees whether a call ran again."""
    ran: list[str] = []
    tools = ToolRegistry()

    @tools.register
    def look(n: int) -> str:
        """Look one thing up."""
        ran.append(f"look {n}")
        return f"found {n}"

    return tools, ran


def _looks(*numbers: int) -> list[ModelResponse]:
    return [tool_turn(tool_call("look", id=f"c{n}", n=n), usage=CENT) for n in numbers]


def _finish(agent: Agent, driver: str) -> RunResult:
    try:
        return agent.run("go") if driver == "sync" else asyncio.run(agent.arun("go"))
    except AgentLoopError as stop:
        return stop.result


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_execute_tool_to_failed_cost_budget_stops_before_the_call_that_would_overspend(driver: str) -> None:
    """Budget 3 cents, a cent a call: three calls are made, and the fourth never is (edge ExecuteTool->Failed)."""
    tools, ran = _counted()
    model = FakeModel([*_looks(1, 2, 3, 4), reply("never")])
    result = _finish(Agent(model, tools, max_steps=10, cost_budget=0.03, prices=DEAR), driver)
    assert result.reason == "cost_budget"
    assert edges(result)[-1] == "ExecuteTool->Failed[cost_budget]"
    assert len(model.seen) == 3
    assert ran == ["look 1", "look 2", "look 3"]
    assert result.evidence["cost"] == pytest.approx(0.03)
    assert (result.evidence["budget"], result.evidence["priced_calls"], result.evidence["unpriced_calls"]) == (
        0.03,
        3,
        0,
    )
    assert result.usage.cost == pytest.approx(0.03)
    assert [step.counters["cost"][0] for step in result.steps] == pytest.approx([0.01, 0.02, 0.03])


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_finalize_policy_makes_one_last_call_without_tools(driver: str) -> None:
    """on_stop finalize: the spent budget buys one last answer, and the run still reports cost_budget."""
    tools, _ = _counted()
    model = FakeModel([*_looks(1, 2), reply("what I found", usage=CENT)])
    agent = Agent(model, tools, cost_budget=0.02, prices=DEAR, on_stop={"cost_budget": "finalize"})
    result = _finish(agent, driver)
    assert "ExecuteTool->AwaitModel[finalize_on_cost_budget]" in edges(result)
    assert result.reason == "cost_budget"
    assert result.final == "what I found"
    assert result.usage.cost == pytest.approx(0.03)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_sub_agents_cost_counts_against_the_parent_and_stops_it(driver: str) -> None:
    """A child that would spend 5 cents runs under the 2 cents its parent has left: it stops, and so does the parent.

    As for ``token_budget``: the parent's first call spent 1 of its 3 cents,
    so the child's ``cost_budget`` is the 2 left; it stops on it after its
    second call (a tool error the parent's model would read), and the
    parent, its own and its child's calls counted, stops before its next.
    """
    child_tools, child_ran = _counted()
    child = Agent(FakeModel([*_looks(1, 2, 3, 4), reply("done", usage=CENT)]), child_tools, prices=DEAR)
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    parent_model = FakeModel([tool_turn(tool_call("helper", id="h1", input="look"), usage=CENT), reply("never")])
    parent = Agent(parent_model, tools, cost_budget=0.03, prices=DEAR)
    result = _finish(parent, driver)
    assert child_ran == ["look 1", "look 2"]
    assert len(parent_model.seen) == 1
    assert result.reason == "cost_budget"
    assert edges(result)[-1] == "ExecuteTool->Failed[cost_budget]"
    assert result.usage.cost == pytest.approx(0.01 + 0.02)  # the parent's call and the child's two
    assert (result.evidence["priced_calls"], result.evidence["unpriced_calls"]) == (3, 0)
    told = json.loads(result.messages[-1].content)
    assert (told["reason"], told["evidence"]["cost"], told["evidence"]["budget"]) == ("cost_budget", 0.02, 0.02)
    assert told["error"] == f"sub-agent 'helper' stopped (cost_budget) in run {result.steps[0].child!r}"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_resume_with_a_larger_cost_budget_lifts_the_stop_without_running_a_tool_again(driver: str) -> None:
    """Cut at 2 cents, resumed with 4: the run goes on where it stopped; no tool call executes twice."""
    tools, ran = _counted()
    agent = Agent(FakeModel([*_looks(1, 2, 3), reply("all found", usage=CENT)]), tools, cost_budget=0.02, prices=DEAR)
    cut = _finish(agent, driver)
    assert cut.reason == "cost_budget"
    assert ran == ["look 1", "look 2"]
    if driver == "sync":
        result = agent.resume(cut, cost_budget=0.05).finish()
    else:

        async def resumed() -> RunResult:
            return await (await agent.aresume(cut, cost_budget=0.05)).afinish()

        result = asyncio.run(resumed())
    assert result.ok
    assert result.final == "all found"
    assert ran == ["look 1", "look 2", "look 3"]
    assert "Failed->AwaitModel[resumes_before_model]" in edges(result)
    assert result.usage.cost == pytest.approx(0.04)


def test_resume_without_more_budget_is_refused() -> None:
    """The same budget lifts nothing: a ValueError, and the run is not continued."""
    tools, ran = _counted()
    agent = Agent(FakeModel([*_looks(1, 2, 3)]), tools, cost_budget=0.02, prices=DEAR)
    cut = _finish(agent, "sync")
    with pytest.raises(ValueError, match="cost_budget"):
        agent.resume(cut, cost_budget=0.02)
    assert ran == ["look 1", "look 2"]


def test_a_cost_budget_over_a_model_without_a_price_is_refused_when_the_agent_is_built() -> None:
    """A self-hosted model nothing prices: ValueError naming it, before any run; without a budget, cost is None."""
    model = OpenAIChatModel("my-local-llm", api_key="test-key", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match=r"cost_budget needs a price.*'my-local-llm'"):
        Agent(model, ToolRegistry(), cost_budget=1)
    with pytest.raises(ValueError, match="FakeModel"):
        Agent(FakeModel([reply("x")]), ToolRegistry(), limits=Limits(cost_budget=1))
    unpriced = Agent(FakeModel([reply("x", usage=CENT)]), ToolRegistry()).run("go")
    assert unpriced.usage.cost is None
    assert unpriced.usage.input_tokens == 6


def test_a_cost_budget_over_an_unpriced_sub_agent_is_refused_naming_it() -> None:
    """The parent is priced, its sub-agent's model is not: ValueError naming the sub-agent."""
    tools = ToolRegistry()
    tools.register(Agent(FakeModel([reply("x")]), ToolRegistry()).as_tool("helper", "Helps."))
    with pytest.raises(UnpricedModelError, match="sub-agent 'helper'") as refused:
        Agent(FakeModel([reply("x")]), tools, cost_budget=1, prices=DEAR)
    assert refused.value.sub_agent == "helper"
    assert isinstance(refused.value, ValueError)
    assert refused.value.explain("say how").startswith("sub-agent 'helper': cost_budget needs a price")
    assert "say how, or install genai-prices" in refused.value.explain("say how")


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_unpriced_sub_agent_registered_after_the_agent_was_built_is_refused_before_any_call(driver: str) -> None:
    """The budget is checked again when the tools change: the next run raises naming it, and nothing is called."""
    tools, ran = _counted()
    parent_model = FakeModel([*_looks(1), reply("done", usage=CENT)])
    agent = Agent(parent_model, tools, cost_budget=1, prices=DEAR)
    child_model = FakeModel([reply("x")])
    tools.register(Agent(child_model, ToolRegistry()).as_tool("helper", "Helps."))
    with pytest.raises(ValueError, match="sub-agent 'helper'"):
        _finish(agent, driver)
    assert (len(parent_model.seen), len(child_model.seen), ran) == (0, 0, [])
    later = Agent(FakeModel([reply("done", usage=CENT)]), ToolRegistry(), cost_budget=1, prices=DEAR)
    later.registry.register(Agent(FakeModel([reply("x")]), ToolRegistry(), prices=DEAR).as_tool("helper", "Helps."))
    assert _finish(later, driver).final == "done"


def test_prices_map_model_names_and_refuse_anything_else() -> None:
    """A mapping is looked up by the model's name; a wrong type or a negative price is refused."""
    named = OpenAIChatModel("my-local-llm", api_key="test-key", base_url="http://127.0.0.1:9/v1")
    Agent(named, ToolRegistry(), cost_budget=1, prices={"my-local-llm": DEAR})
    with pytest.raises(ValueError, match="'my-local-llm'"):
        Agent(named, ToolRegistry(), cost_budget=1, prices={"another-model": DEAR})
    with pytest.raises(TypeError, match="prices must map model names"):
        Agent(named, ToolRegistry(), prices={"my-local-llm": 3.0})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="finite number of US dollars >= 0"):
        Price(input_per_mtok=-1, output_per_mtok=1)


def test_a_price_in_decimal_is_computed_by_hand() -> None:
    """$3 in, $15 out, $0.30 cached per million: 2000 in (1500 cached), 400 out cost $0.00795."""
    price = Price(input_per_mtok=Decimal("3"), output_per_mtok=Decimal("15"), cached_input_per_mtok=Decimal("0.30"))
    usage = Usage(2000, 400, cache_read_tokens=1500)
    # 500 * 3 + 1500 * 0.30 + 400 * 15 = 1500 + 450 + 6000 = 7950 millionths of a dollar.
    assert price.cost(usage) == pytest.approx(0.00795, rel=1e-12)
    result = Agent(FakeModel([reply("x", usage=usage)]), ToolRegistry(), prices=price).run("go")
    assert result.usage.cost == pytest.approx(0.00795, rel=1e-12)


def test_a_cost_the_model_reports_is_kept_and_an_unpriced_call_makes_the_run_cost_unknown() -> None:
    """A reply's own usage.cost is taken as it is; unpriced, a call leaves the run's cost None, never a guess."""
    reported = Usage(10, 10, cost=0.25)
    result = Agent(FakeModel([reply("x", usage=reported)]), ToolRegistry(), prices=DEAR).run("go")
    assert result.usage.cost == 0.25
    tools, _ = _counted()
    script = [tool_turn(tool_call("look", n=1), usage=Usage(6, 4, cost=0.5)), reply("x", usage=CENT)]
    mixed = Agent(FakeModel(script), tools).run("go")
    assert mixed.usage.cost is None
    assert mixed.steps[-1].counters["cost"] == [0.5, None]  # the priced part, as a budget would count it


def test_a_call_without_usage_costs_nothing_at_a_known_price_as_it_counts_no_tokens() -> None:
    """No usage is zero tokens for token_budget, so zero dollars where the price is known; unknown where not."""
    tools, _ = _counted()
    script = [tool_turn(tool_call("look", n=1)), reply("x", usage=CENT)]
    assert Agent(FakeModel(script), tools, prices=DEAR).run("go").usage.cost == pytest.approx(0.01)
    assert Agent(FakeModel(script), tools).run("go").usage.cost is None


def test_the_checker_reports_cost_budget_reachable_only_when_it_is_set() -> None:
    """Without a budget the stop is unreachable and its row dead; with one, reachable and its path drivable."""
    from fsm_agent.proof.driving import drive

    plain = check(Agent(FakeModel(), ToolRegistry(), prices=DEAR))
    assert "cost_budget" in plain.unreachable
    tools, _ = _counted()
    budgeted = Agent(FakeModel(), tools, cost_budget=0.5, prices=DEAR)
    proof = check(budgeted)
    assert proof.ok
    assert "cost_budget" in proof.reachable
    path = proof.paths["cost_budget"]
    result = drive(budgeted, [(move.entry, move.choice) for move in path.moves])
    assert result.reason == "cost_budget"
    assert edges(result)[-1] == "ExecuteTool->Failed[cost_budget]"


def test_cost_budget_is_a_limit_in_dollars() -> None:
    """Limits takes a Decimal or a number > 0 and keeps a float; zero and infinity are refused."""
    assert Limits(cost_budget=Decimal("0.5")).cost_budget == 0.5
    for bad in (0, -1, float("inf"), True):
        with pytest.raises(ValueError, match="cost_budget must be a finite number of US dollars > 0"):
            Limits(cost_budget=bad)
