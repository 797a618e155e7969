"""``check``'s claims for agents with sub-agents, against real runs (both drivers)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from fsm_agent import Agent, AgentLoopError, SqliteStore, ToolRegistry
from fsm_agent.proof import check
from fsm_agent.records import Message, ModelResponse, RunResult
from fsm_agent.testing import FakeModel, edge_id, reply, tool_call, tool_turn

LEASE = 0.05
"""A killed owner's lease in the crash test: short, so a new owner takes the run over at once."""


def _agents(runs: Counter[str]) -> Agent:
    """A parent capped at 5 tool calls in 3 turns, whose replies ask for one call each; its child makes 4 calls."""

    def leaf(x: str) -> str:
        """Counts its runs."""
        runs[x] += 1
        return x

    child_tools = ToolRegistry()
    child_tools.register(leaf)
    child = Agent(
        FakeModel(*[tool_turn(tool_call("leaf", x=f"child {n}")) for n in range(4)], reply("ok")), child_tools
    )
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "asks a helper"))
    tools.register(leaf)
    script = (tool_turn(tool_call("helper", input="go")), tool_turn(tool_call("leaf", x="parent")), reply("end"))
    return Agent(FakeModel(*script), tools, max_steps=3, max_tool_calls=5)


def _run(agent: Agent, driver: str) -> RunResult:
    try:
        return agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    except AgentLoopError as stop:
        return stop.result


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_sub_agents_calls_reach_a_cap_the_proof_calls_unreachable(driver: str) -> None:
    """One call per reply, 3 turns, cap 5: the proof says no run stops on max_tool_calls; a real run does."""
    runs: Counter[str] = Counter()
    proof = check(_agents(Counter()), calls_per_reply=1)
    result = _run(_agents(runs), driver)
    assert runs == {f"child {n}": 1 for n in range(4)}  # the child made its 4 calls; the parent's own never ran
    assert all(len(m.tool_calls) <= 1 for m in result.messages if m.role == "assistant")  # the script obeys 1/reply
    last = result.trace[-1]
    assert edge_id(last) == "Dispatch->Failed[max_tool_calls]"
    assert last not in {row.entry for row in proof.dead_rows}, "a row the proof calls dead was taken"
    assert result.reason in proof.reachable, f"{result.reason} ended a real run; proof: {proof.unreachable}"


def _stored_agents(runs: Counter[str], cut: str | None = None) -> Agent:
    """A parent asking one sub-agent call per reply; the child's one turn asks for two calls, ``cut`` dies once."""
    armed = [cut]

    def leaf(what: str) -> str:
        """Counts its runs; the armed call is killed in flight once (a Ctrl-C)."""
        runs[what] += 1
        if what == armed[0]:
            armed[0] = None
            raise KeyboardInterrupt
        return what

    class Child:
        def complete(self, messages: Sequence[Message], tools: object) -> ModelResponse:
            if messages[-1].role == "tool":
                return reply("child done")
            return tool_turn(tool_call("leaf", id="l1", what="first"), tool_call("leaf", id="l2", what="second"))

    class Parent:
        def complete(self, messages: Sequence[Message], tools: object) -> ModelResponse:
            if messages[-1].role == "tool":
                return reply("parent done")
            return tool_turn(tool_call("helper", id="h", input="go"))

    child_tools = ToolRegistry()
    child_tools.register(leaf)
    tools = ToolRegistry()
    tools.register(Agent(Child(), child_tools).as_tool("helper", "asks a helper"))
    return Agent(Parent(), tools)


@pytest.mark.parametrize("every", ["call", "turn"])
def test_a_crash_inside_a_sub_agent_runs_again_what_the_proof_says(tmp_path: Path, every: str) -> None:
    """The parent asks one call per reply, its sub-agent two: under ``turn`` the proof says not crash safe (the
    sub-agent's run is), and killed inside the child's second call and resumed, its finished first call runs again.
    """
    proof = check(_stored_agents(Counter()), every=every, calls_per_reply=1)
    assert proof.crash_safe is (every == "call")
    assert bool(proof.crash_counterexample) is (every == "turn")
    runs: Counter[str] = Counter()
    path = tmp_path / "runs.db"
    with SqliteStore(path, every=every, lease=LEASE) as store, pytest.raises(KeyboardInterrupt):
        _stored_agents(runs, cut="second").run("q", store=store, run_id="p")
    time.sleep(2 * LEASE)  # the killed owner's lease lapses, so a new owner may take the run (and its child) over
    with SqliteStore(path, every=every, lease=LEASE) as store:
        result = _stored_agents(runs).resume(store.load("p"), store=store).finish()
    assert result.final == "parent done"
    # "second" was in flight at the kill; under "turn" the sub-agent's "first" was not written yet
    assert runs == {"first": 1 if every == "call" else 2, "second": 2}
