"""A parent's check proves its sub-agents under the limits their runs get from it, not only their own.

A sub-agent's run is held to its parent's remaining time, and to shares of
its tokens, dollars and tool calls (``drivers.child_runs``).  ``check`` of
the parent checked each child under the child's own limits only, so a
sub-agent with no timeout was said never to stop on ``timeout``, yet its run
under a parent with one did.  ``Proof.children`` now holds each sub-agent's
proof with the parent's kinds of limits added; ``check(child)`` alone stays
about the child run on its own.
"""

from __future__ import annotations

from typing import Any

from fsm_agent import Agent, AgentLoopError, ToolRegistry
from fsm_agent.definition.limits import Limits
from fsm_agent.persist import open_store
from fsm_agent.proof import check
from fsm_agent.proof.check import handed_down
from fsm_agent.records import RunResult
from fsm_agent.testing import FakeModel, ManualClock, reply, tool_call, tool_turn


def _parent_and_child(clock: ManualClock) -> tuple[Agent, Agent]:
    """A child with no timeout whose one tool call takes ten seconds, under a parent with ``timeout=5``."""
    child_tools = ToolRegistry()

    def slow(x: str) -> str:
        """Takes ten seconds of the clock."""
        clock.advance(10)
        return "slow " + x

    child_tools.register(slow)
    child = Agent(FakeModel(tool_turn(tool_call("slow", x="a")), reply("child done")), child_tools, clock=clock)
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "asks a helper"))
    parent = Agent(FakeModel(tool_turn(tool_call("helper", input="go")), reply("done")), tools, timeout=5, clock=clock)
    return parent, child


def _ended(agent: Agent, store: Any = None) -> RunResult:
    try:
        return agent.run("q", store=store)
    except AgentLoopError as stop:
        return stop.result


def test_a_sub_agents_run_ends_only_on_a_reason_the_parents_proof_of_it_calls_reachable(store_target: str) -> None:
    """ExecuteTool->Failed[timeout] in the child's run under the parent: the parent's proof of the sub-agent
    reaches ``timeout``; check(child) alone, the child run on its own, does not.

    The child's deadline is the parent's, so its ``timeout`` is the stop of
    both (the call stays pending, see docs/how-to/sub-agents.md, and the next
    test): its stored run shows the child's own stop.
    """
    clock = ManualClock()
    parent, child = _parent_and_child(clock)
    proof = check(parent)
    assert "timeout" in check(child).unreachable  # the child's own runs have no timeout
    assert "timeout" in proof.children["helper"].reachable
    assert "sub-agent 'helper', under the limits handed down" in proof.report()
    with open_store(store_target) as store:
        result = _ended(parent, store)
        [call] = result.pending
        assert result.snapshot is not None
        stopped = store.load(f"{result.snapshot['run_id']}/{call.id}")["reason"]
    assert (result.reason, stopped) == ("timeout", "timeout")
    assert stopped in proof.children["helper"].reachable


def test_without_a_store_the_sub_agents_timeout_is_the_parents_stop_with_the_call_pending() -> None:
    """ExecuteTool->Failed[timeout] in both runs: the child's deadline is the parent's, so the call is not answered."""
    parent, _ = _parent_and_child(ManualClock())
    result = _ended(parent)
    assert (result.reason, [call.id for call in result.pending]) == ("timeout", [result.evidence["unfinished"]])
    assert not [m for m in result.messages if m.role == "tool"]


def test_the_parents_time_budgets_and_tool_call_cap_are_added_where_the_child_has_none() -> None:
    """Each kind the parent limits and the child does not is handed down; the child's own limit of a kind stays."""
    parent = Limits(timeout=5, token_budget=1000, cost_budget=2.0, max_tool_calls=4)
    assert handed_down(parent, Limits()) == {
        "timeout": 5,
        "token_budget": 1000,
        "cost_budget": 2.0,
        "max_tool_calls": 4,
    }
    assert handed_down(parent, Limits(max_tool_calls={"search": 2})) == {
        "timeout": 5,
        "token_budget": 1000,
        "cost_budget": 2.0,
        "max_tool_calls": {"search": 2, "*": 4},
    }
    own = Limits(timeout=1, token_budget=10, cost_budget=0.5, max_tool_calls=1)
    assert handed_down(parent, own) == {}
    assert handed_down(Limits(), Limits()) == {}
