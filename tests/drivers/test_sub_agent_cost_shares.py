"""A sub-agent runs under what its parent has left of its ``cost_budget``, as under its ``token_budget``.

docs/how-to/sub-agents.md, "What bounds the child": the dollars left are
shared equally among the turn's sub-agent calls still to finish (or the
child agent's own budget, if smaller); a child stops after the model call
that reaches its share; a call that finds nothing left is not run.  And
docs/how-to/cost-budget.md: every model call a child (or grandchild) made
is one priced call of the parent's, counted once across a cut and a resume.

At $1000 per million tokens in and out, 10 tokens cost a cent, so each
model call's cost is a round figure.  Every tool counts its executions, by
run and call id.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.by_turn import ByTurn
from support.cut_children import LEASE as CUT_LEASE
from support.cut_children import WAIT, Block, Calls, parent_agent
from support.exactly_once import LEASE, ataken_over, resumed_by_new_owner, taken_over
from support.store_cases import in_child

from fsm_agent import (
    Agent,
    AgentLoopError,
    AgentRun,
    Message,
    ModelResponse,
    Price,
    RunContext,
    RunResult,
    ToolRegistry,
    Usage,
)
from fsm_agent.drivers.child import OnChildStop
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
DEAR = Price(input_per_mtok=1000, output_per_mtok=1000)
CENT = Usage(6, 4)
"""One cent at ``DEAR``."""


def _started(agent: Agent, driver: str, **options: Any) -> RunResult:
    """``agent.run("go", ...)`` on ``driver``, which may raise (a stop, a Ctrl-C)."""
    return agent.run("go", **options) if driver == "sync" else asyncio.run(agent.arun("go", **options))


def _ended(run: AgentRun | Agent, driver: str) -> RunResult:
    """Run (or finish) on ``driver``; a stop's result, not its exception."""
    try:
        if isinstance(run, Agent):
            return run.run("go") if driver == "sync" else asyncio.run(run.arun("go"))
        return run.finish() if driver == "sync" else asyncio.run(run.afinish())
    except AgentLoopError as stop:
        return stop.result


class _Spender:
    """A child model that spends a cent a call asking for one more lookup, never answering: only a budget stops it."""

    def __init__(self) -> None:
        self.made: list[int] = []  # appended from any thread

    def complete(self, messages: Sequence[Message], tools: list[Any]) -> ModelResponse:
        asked = sum(1 for m in messages if m.role == "assistant")
        self.made.append(asked)
        return tool_turn(tool_call("look", id=f"l{asked}", n=asked), usage=CENT)


def _looks(executed: Counter[str]) -> ToolRegistry:
    """The ``look`` tool, counting its executions by run and call id."""
    tools = ToolRegistry()

    @tools.register
    def look(n: int, ctx: RunContext[Any]) -> str:
        """Look one thing up (counted)."""
        executed[f"{ctx.run_id}:{ctx.call_id}"] += 1
        return f"found {n}"

    return tools


def _helper_tools(child: Agent, name: str = "helper") -> ToolRegistry:
    tools = ToolRegistry()
    tools.register(child.as_tool(name, "Looks things up."))
    return tools


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("children", [2, 4])
def test_sub_agents_called_together_share_what_the_parent_has_left(driver: str, children: int) -> None:
    """Budget 10 cents, the first reply 1: k children at once share 9, each passing its share by one call at most."""
    spender, executed = _Spender(), Counter[str]()
    child = Agent(spender, _looks(executed), prices=DEAR, max_steps=50)
    asks = [tool_call("helper", id=f"h{i}", input=f"task {i}") for i in range(children)]
    parent_model = FakeModel(tool_turn(*asks, usage=CENT), reply("never"))
    # Each child's stop is a failed call of the parent's: enough of them allowed for the budget to be what stops it.
    parent = Agent(parent_model, _helper_tools(child), cost_budget=0.10, prices=DEAR, max_consecutive_failures=9)
    result = _ended(parent, driver)
    made = len(spender.made)
    assert result.reason == "cost_budget"
    assert len(parent_model.seen) == 1
    assert made <= 9 + children  # what was left, and one call past each child's share
    assert result.evidence["cost"] == pytest.approx(0.01 * (1 + made))
    assert (result.evidence["priced_calls"], result.evidence["unpriced_calls"]) == (1 + made, 0)
    told = [json.loads(m.content) for m in result.messages if m.role == "tool"]
    assert [t["reason"] for t in told] == ["cost_budget"] * children
    budgets = [t["evidence"]["budget"] for t in told]
    assert budgets[0] == pytest.approx(0.09 / children)
    if driver == "async":  # started together: none given more than an equal share of the 9 cents
        assert all(budget <= 0.09 / children + 1e-12 for budget in budgets)
    else:  # one after another: each given an equal share of what the ones before it left
        left = 0.09
        for i, stop in enumerate(told):
            assert stop["evidence"]["budget"] == pytest.approx(left / (children - i))
            left -= stop["evidence"]["cost"]
    assert all(count == 1 for count in executed.values())  # no lookup ran twice
    assert sum(executed.values()) == made  # each reply's lookup ran (before the check that stopped its child)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_child_runs_under_its_own_budget_when_that_is_smaller(driver: str) -> None:
    """The child's own 2 cents are less than the 98 its parent has left: it stops at 2, and the parent goes on."""
    spender, executed = _Spender(), Counter[str]()
    child = Agent(spender, _looks(executed), prices=DEAR, max_steps=50, cost_budget=0.02)
    parent_model = FakeModel(tool_turn(tool_call("helper", id="h1", input="look"), usage=CENT), reply("ok", usage=CENT))
    result = _ended(Agent(parent_model, _helper_tools(child), cost_budget=0.99, prices=DEAR), driver)
    assert (result.final, len(spender.made)) == ("ok", 2)
    told = json.loads(result.messages[2].content)
    assert (told["reason"], told["evidence"]["budget"], told["evidence"]["cost"]) == ("cost_budget", 0.02, 0.02)
    assert result.usage.cost == pytest.approx(0.04)
    assert sorted(executed.values()) == [1, 1]  # its two lookups, each once


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("on_child_stop", ["error", "raise"])
def test_a_call_that_finds_no_dollars_left_is_never_run(driver: str, on_child_stop: OnChildStop) -> None:
    """The first reply spent the whole budget: the sub-agent call is a cost_budget outcome, its model never asked."""
    spender, executed = _Spender(), Counter[str]()
    child = Agent(spender, _looks(executed), prices=DEAR)
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up.", on_child_stop=on_child_stop))
    parent_model = FakeModel(tool_turn(tool_call("helper", id="h1", input="look"), usage=Usage(18, 12)))
    result = _ended(Agent(parent_model, tools, cost_budget=0.03, prices=DEAR), driver)
    assert (spender.made, sum(executed.values())) == ([], 0)
    told = json.loads(result.messages[2].content)
    assert (told["reason"], told["evidence"]["share"], told["evidence"]["cost"]) == ("cost_budget", 0, 0.03)
    assert told["error"].startswith("sub-agent 'helper' not run: the parent's cost budget is used up (run '")
    if on_child_stop == "raise":
        assert result.reason == "child_stopped"
        assert result.evidence["reason"] == "cost_budget"
    else:
        assert result.reason == "cost_budget"
        assert edges(result)[-1] == "ExecuteTool->Failed[cost_budget]"
        assert (result.evidence["priced_calls"], result.evidence["unpriced_calls"]) == (1, 0)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_grandchilds_model_calls_are_each_a_priced_call_of_the_grandparent(driver: str) -> None:
    """Parent -> helper -> digger: the parent's evidence counts the digger's two calls and the helper's two, each."""
    executed = Counter[str]()
    digger = Agent(
        FakeModel(tool_turn(tool_call("look", id="d1", n=1), usage=CENT), reply("dug", usage=CENT)),
        _looks(executed),
        prices=DEAR,
    )
    helper_model = FakeModel(
        tool_turn(tool_call("digger", id="g1", input="dig"), usage=CENT), reply("helped", usage=CENT)
    )
    helper = Agent(helper_model, _helper_tools(digger, "digger"), prices=DEAR)
    parent_model = FakeModel(tool_turn(tool_call("helper", id="h1", input="help"), usage=CENT), reply("never"))
    result = _ended(Agent(parent_model, _helper_tools(helper), cost_budget=0.05, prices=DEAR), driver)
    assert result.reason == "cost_budget"
    assert result.evidence["cost"] == pytest.approx(0.05)
    assert (result.evidence["priced_calls"], result.evidence["unpriced_calls"]) == (5, 0)
    assert sum(executed.values()) == 1


# --- a Ctrl-C inside the child's tool call, and a resume from the store ----------------------------------------


def _cut_family(executed: Counter[str], cut: threading.Event | None) -> tuple[Agent, ByTurn, ByTurn]:
    """A parent whose helper looks two things up, then answers; ``cut`` armed: a Ctrl-C inside the second lookup.

    Returned with the parent's model and the child's, which count their calls.
    """
    tools = ToolRegistry()

    @tools.register
    def look(n: int, ctx: RunContext[Any]) -> str:
        """Look one thing up (counted once it ran; a Ctrl-C cuts it before, once)."""
        if n == 1 and cut is not None and not cut.is_set():
            cut.set()
            raise KeyboardInterrupt
        executed[f"{ctx.run_id}:{ctx.call_id}"] += 1
        return f"found {n}"

    child_script = [
        tool_turn(tool_call("look", id="k0", n=0), usage=CENT),
        tool_turn(tool_call("look", id="k1", n=1), usage=CENT),
        reply("child done", usage=CENT),
    ]
    child_model = ByTurn(child_script)
    child = Agent(child_model, tools, prices=DEAR)
    parent_model = ByTurn([tool_turn(tool_call("helper", id="h1", input="look"), usage=CENT), reply("ok", usage=CENT)])
    return Agent(parent_model, _helper_tools(child), cost_budget=0.04, prices=DEAR), parent_model, child_model


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_child_cut_by_ctrl_c_goes_on_under_what_its_parent_has_left_and_each_call_counts_once(
    tmp_path: Path, driver: str, resumer: str
) -> None:
    """A Ctrl-C in the child's second lookup; a new owner resumes the parent from SQLite and takes the child over.

    The child goes on from its stored run (two replies, a cent each) under
    the 3 cents its parent has left, answers with its third, and the
    parent, its 4 cents spent, stops before its answer.  Every model call is
    one priced call of the parent's, each once; every lookup ran once.
    """
    target = str(tmp_path / "runs.db")
    executed = Counter[str]()
    first, *first_models = _cut_family(executed, threading.Event())
    store = open_store(target, lease=LEASE)
    try:
        with pytest.raises(KeyboardInterrupt):
            _started(first, driver, store=store, run_id="p")
    finally:
        store.close()
    assert dict(executed) == {"p/h1:k0": 1}
    with open_store(target) as look:
        cut_child = look.load("p/h1")
    assert cut_child["limits"]["cost_budget"] == pytest.approx(0.03)  # what the parent had left: all for this call

    again, *again_models = _cut_family(executed, None)
    with pytest.raises(AgentLoopError) as stop:
        resumed_by_new_owner(target, "p", resumer, again)
    result = stop.value.result
    with open_store(target) as look:
        parent, child = look.load("p"), look.load("p/h1")
    assert result.reason == "cost_budget"
    assert dict(executed) == {"p/h1:k0": 1, "p/h1:k1": 1}
    assert (child["state"], child["limits"]["cost_budget"]) == ("Done", pytest.approx(0.03))
    made = sum(model.calls for model in (*first_models, *again_models))
    assert made == 4  # the parent's first call and the child's three: none made again
    assert result.evidence["cost"] == pytest.approx(0.04)
    assert (result.evidence["priced_calls"], result.evidence["unpriced_calls"]) == (made, 0)
    assert (parent["counters"]["priced"], parent["counters"]["cost"]) == (made, pytest.approx(0.04))


# --- a cut at the parent's deadline (counted at the cut), and a resume that takes the child back ------------------


def _counted_once(parent: dict[str, Any], child: dict[str, Any], parent_calls: int) -> None:
    """The stored parent counts its own calls and each of its child's, once: calls and dollars."""
    assert parent["counters"]["priced"] == parent_calls + child["counters"]["priced"]
    assert parent["counters"]["unpriced"] == child["counters"]["unpriced"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("block", ["tool", "model"], ids=["after_a_reply", "before_any_reply"])
def test_a_child_cut_at_the_deadline_and_taken_back_counts_each_of_its_calls_once(
    store_target: str, driver: str, block: Block, tmp_path: Path
) -> None:
    """The cut counts the child's calls so far; the resume goes on with the child and adds only what came after."""
    calls = Calls(tmp_path / "calls.log", block=block)
    store = open_store(store_target, lease=CUT_LEASE)
    try:
        with pytest.raises(AgentLoopError) as stop:
            _started(parent_agent(calls, driver, cost_budget=1.0), driver, run_id="p", store=store)
        cut = stop.value.result
        assert (cut.reason, cut.evidence["unfinished"]) == ("timeout", "c1")
        assert cut.snapshot is not None
        kept = cut.snapshot["cut_children"]["c1"]
        assert kept["priced_calls"] == cut.snapshot["counters"]["priced"] - 1  # the parent's own first call
        assert calls.stopped.wait(WAIT)
        run = parent_agent(calls, driver, cost_budget=1.0).resume(store.load("p"), store=store, timeout=60)
        result = _ended(run, driver)
        parent, child = store.load("p"), store.load("p/c1")
    finally:
        calls.let_go()
        store.close()
    assert (result.final, child["state"]) == ("done", "Done")
    assert calls.count("child") == {"tool": 2, "model": 3}[block]  # its first reply, if it came, never made again
    _counted_once(parent, child, parent_calls=2)
    assert result.usage.cost == pytest.approx(calls.total().cost)


BUDGET = 1.0
"""The parent's cost budget where the child is taken over: far from reached, so only the child's share is checked."""


def _cut_then_killed(target: str, log: str, every: str) -> None:
    """The parent's process: its deadline cuts the child in its tool, and it dies the moment that stop is stored."""
    calls = Calls(Path(log), block="tool")
    agent = parent_agent(calls, "sync", cost_budget=BUDGET)
    agent.on("failed", lambda event: os._exit(9))
    agent.run("go", store=open_store(target, lease=CUT_LEASE, every=every), run_id="p")


@pytest.mark.subprocess
@pytest.mark.parametrize("every", ["call", "turn"])
@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_child_taken_over_after_its_owner_died_at_the_cut_is_given_back_the_dollars_the_cut_counted(
    store_target: str, resumer: str, every: str, tmp_path: Path
) -> None:
    """The child goes on from its stored run under its share plus what of that run the cut counted; calls once each.

    ``every="call"``: its first reply (550 millionths of a dollar) is
    stored, and counted at the cut: the parent's budget is not spent twice
    on it.  ``every="turn"``: it was never stored, is made again and
    counted again (billed again), and nothing is given back.
    """
    log = tmp_path / "calls.log"
    assert in_child(_cut_then_killed, store_target, str(log), every) == 9
    calls = Calls(log)
    store = open_store(store_target, lease=CUT_LEASE)
    try:
        agent = parent_agent(calls, resumer, cost_budget=BUDGET)
        if resumer == "sync":
            result = taken_over(lambda: agent.resume(store.load("p"), store=store, timeout=60)).finish()
        else:

            async def go() -> RunResult:
                async def claim() -> AgentRun:
                    return await agent.aresume(await store.aload("p"), store=store, timeout=60)

                return await (await ataken_over(claim)).afinish()

            result = asyncio.run(go())
        parent, child = store.load("p"), store.load("p/c1")
    finally:
        store.close()
    assert (result.final, child["state"]) == ("done", "Done")
    assert calls.count("child") == {"call": 2, "turn": 3}[every]
    left = BUDGET - 561e-6  # what the parent had left when it made the call again: its reply and the child's first
    assert child["limits"]["cost_budget"] == pytest.approx({"call": left + 550e-6, "turn": left}[every], abs=1e-12)
    assert parent["counters"]["priced"] == calls.count("parent") + calls.count("child")  # every call made, once
    assert result.usage.cost == pytest.approx(calls.total().cost, abs=1e-12)
