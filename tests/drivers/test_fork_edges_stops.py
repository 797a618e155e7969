"""Forks at and around a stop: a failed model call, a tool-call cap hit in the middle of a parallel batch.

Every tool counts its executions by call id (``support.counted_calls``).
"""

from __future__ import annotations

import asyncio

import pytest
from support.by_turn import ByTurn
from support.counted_calls import Counted, finish

from fsm_agent import Agent, AgentLoopError, ForkEdit, RunResult
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_at_a_failed_model_call_goes_on_with_the_fork_s_model(driver: str) -> None:
    """The source's second model call failed; a fork right there asks the fork's model, and repeats no call."""
    counted = Counted()
    failing = Agent(FakeModel(tool_turn(tool_call("send", id="s1", to="bob")), RuntimeError("503")), counted.registry)
    with pytest.raises(AgentLoopError) as stopped:
        failing.run("go")
    source: RunResult = stopped.value.result
    assert source.reason == "model_error"
    assert dict(counted.ran) == {"s1": 1}
    last = len(source.trace) - 1
    again = Counted()
    better = Agent(FakeModel(reply("sent to bob")), again.registry)
    run = better.fork(source, last) if driver == "sync" else asyncio.run(better.afork(source, last))
    result = finish(run, driver)
    assert (result.reason, result.final) == ("done", "sent to bob")
    assert dict(again.ran) == {}


THREE = [tool_turn(*(tool_call("quick", id=f"q{i}", n=i) for i in (1, 2, 3))), reply("done")]


def capped(counted: Counted) -> Agent:
    return Agent(
        ByTurn(THREE), counted.registry, max_concurrency=4, max_tool_calls=2, on_stop={"max_tool_calls": "return"}
    )


@pytest.mark.parametrize("fork_driver", ["sync", "async"])
@pytest.mark.parametrize("source_driver", ["sync", "async"])
def test_a_batch_cut_by_its_tool_call_cap_forks_at_every_index_making_only_the_call_never_made(
    source_driver: str, fork_driver: str
) -> None:
    """max_tool_calls=2 stops a batch of three; each fork lifting the cap makes q3 once, takes q1's and q2's results."""
    counted = Counted()
    agent = capped(counted)
    source = agent.run("go") if source_driver == "sync" else asyncio.run(agent.arun("go"))
    assert (source.reason, dict(counted.ran)) == ("max_tool_calls", {"q1": 1, "q2": 1})
    assert edges(source)[-1] == "Dispatch->Failed[max_tool_calls]"
    for at in range(len(source.trace)):
        again = Counted()
        edit = ForkEdit(limits={"max_tool_calls": 10})
        agent = capped(again)
        run = (
            agent.fork(source, at, edit=edit)
            if fork_driver == "sync"
            else asyncio.run(agent.afork(source, at, edit=edit))
        )
        result = finish(run, fork_driver)
        assert (result.reason, result.final) == ("done", "done"), at
        assert dict(again.ran) == {"q3": 1}, at
        assert [m.content for m in result.messages if m.role == "tool"] == ["1", "2", "3"], at
