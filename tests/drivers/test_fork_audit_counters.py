"""What a fork shares with its source: counters and spend, and its own completed calls when it is cut and taken over.

fork-a-run.md: a fork's "history up to ``at`` is the original's", and a
call the source completed after ``at`` "is not made again"; exactly-once.md:
a Ctrl-C inside a call writes the run "so its next owner makes only the
calls it cut again".  Every tool counts its executions; the counters the
guards read (tokens, dollars, tool calls, per tool) are compared whole.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from support.by_turn import ByTurn
from support.exactly_once import LEASE, resumed_by_new_owner

from fsm_agent import Agent, AgentLoopError, AgentRun, Price, RunResult, ToolRegistry, Usage
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
PRICE = Price(1, 2)


def counted(made: Counter[str], *, cut: bool = False) -> ToolRegistry:
    """``lookup``, ``send`` and ``risky`` (a Ctrl-C inside it when ``cut``), counting executions by argument."""
    tools = ToolRegistry()

    def lookup(q: str) -> str:
        """Look something up."""
        made[f"lookup {q}"] += 1
        return f"found {q}"

    async def send(to: str) -> str:
        """Send a message: an effect in the world."""
        made[f"send {to}"] += 1
        return f"sent {to}"

    def risky(n: int) -> str:
        """A call that a Ctrl-C cuts while it runs (when ``cut``)."""
        made[f"risky {n}"] += 1
        if cut:
            time.sleep(0.05)  # its async siblings come back first
            raise KeyboardInterrupt
        return "fine"

    tools.register(lookup)
    tools.register(send)
    tools.register(risky)
    return tools


def finished(run: AgentRun, driver: str) -> RunResult:
    try:
        return run.finish() if driver == "sync" else asyncio.run(run.afinish())
    except AgentLoopError as stop:
        return stop.result


def researcher(made: Counter[str]) -> Agent:
    script = [tool_turn(tool_call("lookup", id="l1", q="x"), usage=Usage(100, 10)), reply("x", usage=Usage(50, 5))]
    return Agent(ByTurn(script), counted(made), prices=PRICE)


def planner(made: Counter[str]) -> Agent:
    """A batch of a sub-agent, a held ``send`` and a ``lookup``, then the answer; every reply priced."""
    tools = counted(made)
    tools.register(researcher(made).as_tool("research", "Research one question."))
    batch = tool_turn(
        tool_call("research", id="c1", input="x?"),
        tool_call("send", id="s1", to="ada"),
        tool_call("lookup", id="l9", q="z"),
        usage=Usage(1000, 100),
    )
    return Agent(ByTurn([batch, reply("done", usage=Usage(2000, 20))]), tools, prices=PRICE, approve={"send"})


def _counters(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in snapshot["counters"].items() if name != "elapsed"}


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_at_every_transition_ends_with_the_source_s_counters_and_spend(store_target: str, driver: str) -> None:
    """Tokens, dollars (the child's too), tool calls per tool: each fork's are the source's, and nothing is made."""
    with open_store(store_target) as store:
        made: Counter[str] = Counter()
        assert finished(planner(made).start("plan", store=store, run_id="src"), driver).reason == "paused"
        source = finished(planner(made).resume(store.load("src"), store=store, approvals={"s1": True}), driver)
        assert dict(made) == {"lookup x": 1, "send ada": 1, "lookup z": 1}
        expected = _counters(store.load("src"))
        assert expected["cost"] == pytest.approx(source.usage.cost)
        assert expected["calls_by_tool"] == {"research": 1, "send": 1, "lookup": 1}
        assert expected["tool_calls"] == 4  # the child's lookup counts against its parent's total
        again: Counter[str] = Counter()
        for at in range(len(source.trace) - 1):
            result = finished(planner(again).fork("src", at, store=store, run_id=f"f{at}"), driver)
            if result.reason == "paused":  # s1 waits for a person again, then takes the source's result
                result = finished(
                    planner(again).resume(store.load(f"f{at}"), store=store, approvals={"s1": True}), driver
                )
            assert (result.final, result.usage) == (source.final, source.usage), at
            assert _counters(store.load(f"f{at}")) == expected, at
        assert dict(again) == {}


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_cut_in_the_call_it_makes_again_is_finished_by_a_new_owner_reusing_the_source_s_results(
    store_target: str, driver: str, resumer: str
) -> None:
    """``rerun={"k1"}``: the fork makes risky again and a Ctrl-C cuts it there; the next owner makes only risky.

    The source's three sends are taken from it by whichever owner asks for
    them (the fork's or the next one), never sent again.
    """
    script = [
        tool_turn(
            tool_call("risky", id="k1", n=1), tool_call("send", id="s1", to="ada"), tool_call("send", id="s2", to="bob")
        ),
        tool_turn(tool_call("send", id="s3", to="cy")),
        reply("all sent"),
    ]
    with open_store(store_target) as store:
        made: Counter[str] = Counter()
        Agent(ByTurn(script), counted(made)).run("go", store=store, run_id="src")
        assert dict(made) == {"risky 1": 1, "send ada": 1, "send bob": 1, "send cy": 1}
    made.clear()
    store = open_store(store_target, lease=LEASE)
    try:
        run = Agent(ByTurn(script), counted(made, cut=True)).fork("src", 0, store=store, run_id="f", rerun={"k1"})
        with pytest.raises(KeyboardInterrupt):
            finished(run, driver)
    finally:
        store.close()
    assert dict(made) == {"risky 1": 1}
    result = resumed_by_new_owner(store_target, "f", resumer, Agent(ByTurn(script), counted(made)))
    assert result.final == "all sent"
    assert dict(made) == {"risky 1": 2}  # the cut call, in flight, made again; no send at all
    assert [s.reused_from for s in result.steps if s.kind == "tool_call"] == [None, "src/s1", "src/s2", "src/s3"]
