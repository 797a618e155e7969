"""``check``'s claims for agents with sub-agents, against real runs (both drivers)."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from support.counted_calls import drive
from support.store_cases import in_child

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


def _stored_agents(note: Callable[[str], object], cut: str | None = None, *, kill: bool = False) -> Agent:
    """A parent asking one sub-agent call per reply; the child's one turn asks for two calls, ``cut`` is cut once.

    The cut is a Ctrl-C in the call, or with ``kill`` the process dying there
    (``os._exit``: nothing more runs, nothing more is written).  The child
    makes its calls one at a time on either driver (``max_concurrency=1``),
    so "first" has come back when "second" is cut.
    """
    armed = [cut]

    def leaf(what: str) -> str:
        """Notes each of its runs; the armed call is cut in flight once."""
        note(what)
        if what == armed[0]:
            armed[0] = None
            if kill:
                os._exit(9)
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
    tools.register(Agent(Child(), child_tools, max_concurrency=1).as_tool("helper", "asks a helper"))
    return Agent(Parent(), tools)


def _killed_in_the_second_call(path: str, every: str, notes: str) -> None:
    """In a fresh process: run the parent until its sub-agent's second call kills the process; calls noted in a file."""

    def note(what: str) -> None:
        with Path(notes).open("a", encoding="utf-8") as noted:
            noted.write(what + "\n")

    with SqliteStore(path, every=every, lease=LEASE) as store:
        _stored_agents(note, cut="second", kill=True).run("q", store=store, run_id="p")


def _resumed(path: Path, every: str, runs: Counter[str], driver: str = "sync") -> RunResult:
    """A new owner takes the parent (and its sub-agent's run) over from the store once the cut owner's lease lapsed."""
    time.sleep(2 * LEASE)
    with SqliteStore(path, every=every, lease=LEASE) as store:
        run = _stored_agents(lambda what: runs.update([what])).resume(store.load("p"), store=store)
        return run.finish() if driver == "sync" else asyncio.run(run.afinish())


@pytest.mark.subprocess
@pytest.mark.parametrize("every", ["call", "turn"])
def test_a_crash_inside_a_sub_agent_runs_again_what_the_proof_says(tmp_path: Path, every: str) -> None:
    """The parent asks one call per reply, its sub-agent two: under ``turn`` the proof says not crash safe (the
    sub-agent's run is), and a process killed inside the child's second call and resumed runs its finished first
    call again; under ``call``, only the call in flight.
    """
    proof = check(_stored_agents(lambda what: None), every=every, calls_per_reply=1)
    assert proof.crash_safe is (every == "call")
    assert bool(proof.crash_counterexample) is (every == "turn")
    path, notes = tmp_path / "runs.db", tmp_path / "calls.txt"
    assert in_child(_killed_in_the_second_call, str(path), every, str(notes)) == 9
    runs = Counter(notes.read_text(encoding="utf-8").split())
    assert runs == {"first": 1, "second": 1}
    result = _resumed(path, every, runs)
    assert result.final == "parent done"
    # "second" was in flight at the kill; under "turn" the sub-agent's "first" was not written yet
    assert runs == {"first": 1 if every == "call" else 2, "second": 2}


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("every", ["call", "turn"])
def test_a_ctrl_c_inside_a_sub_agent_call_is_no_crash_only_the_call_it_cut_runs_again(
    tmp_path: Path, every: str, driver: str
) -> None:
    """The proof's crash is a process killed anywhere; a Ctrl-C inside a call finds both runs whole and writes them
    (the sub-agent's, then its parent's), so even under ``turn`` the child's finished first call is not made again.
    """
    runs: Counter[str] = Counter()
    path = tmp_path / "runs.db"
    agent = _stored_agents(lambda what: runs.update([what]), cut="second")
    with SqliteStore(path, every=every, lease=LEASE) as store, pytest.raises(KeyboardInterrupt):
        drive(agent, driver, store=store, run_id="p")
    assert runs == {"first": 1, "second": 1}
    result = _resumed(path, every, runs, driver)
    assert result.final == "parent done"
    assert runs == {"first": 1, "second": 2}
