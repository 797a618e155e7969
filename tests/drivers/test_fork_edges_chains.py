"""Forks of forks and resumes of forks: the source's completed calls stay carried down the chain, made once.

A source makes ``send(bob)``.  Its fork ``f1``, taken before that call by an
agent that holds ``send`` for a person, pauses on it: ``f1`` still carries
the source's result of ``send(bob)``, to take once approved.  Whatever goes
on from ``f1`` (a resume, a fork of it) must take that result too, never
send again.  Every tool counts its executions by call id.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from support.by_turn import ByTurn
from support.counted_calls import Counted, finish

from fsm_agent import (
    Agent,
    AgentRun,
    ForkEdit,
    ModelResponse,
    RunLeasedError,
    RunResult,
    StaleRunError,
)
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn

ONE_SEND = [tool_turn(tool_call("send", id="s1", to="bob")), reply("done")]


def agent(counted: Counted, *, careful: bool = False, script: Sequence[ModelResponse] = ONE_SEND) -> Agent:
    return Agent(ByTurn(script), counted.registry, approve={"send"} if careful else None)


def forked(agent: Agent, driver: str, source: Any, at: int, **keywords: Any) -> AgentRun:
    if driver == "sync":
        return agent.fork(source, at, **keywords)
    return asyncio.run(agent.afork(source, at, **keywords))


def resumed(agent: Agent, driver: str, snapshot: dict[str, Any], **keywords: Any) -> AgentRun:
    if driver == "sync":
        return agent.resume(snapshot, **keywords)
    return asyncio.run(agent.aresume(snapshot, **keywords))


def paused_fork(store: Any, driver: str) -> RunResult:
    """``src`` (send made once) and its fork ``f1`` at transition 0, paused on s1 and carrying src's result."""
    counted = Counted()
    agent(counted).run("go", store=store, run_id="src")
    assert dict(counted.ran) == {"s1": 1}
    counted = Counted()
    held = finish(forked(agent(counted, careful=True), driver, "src", 0, store=store, run_id="f1"), driver)
    assert held.reason == "paused"
    assert [c.id for c in held.pending] == ["s1"]
    assert dict(counted.ran) == {}
    return held


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_paused_fork_resumed_from_its_store_takes_the_carried_result(store_target: str, driver: str) -> None:
    """Approved on resume (another agent, the stored snapshot), the fork's send takes src's result: sent once only."""
    with open_store(store_target) as store:
        paused_fork(store, driver)
        counted = Counted()
        careful = agent(counted, careful=True)
        result = finish(resumed(careful, driver, store.load("f1"), store=store, approvals={"s1": True}), driver)
        assert (result.reason, dict(counted.ran)) == ("done", {})
        assert [s.reused_from for s in result.steps if s.kind == "tool_call"] == ["src/s1"]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_of_a_paused_fork_takes_the_result_the_paused_fork_carries(store_target: str, driver: str) -> None:
    """f2, forked from f1 at its pause and approved by its edit, takes src's result as f1 would: nothing sent again."""
    with open_store(store_target) as store:
        held = paused_fork(store, driver)
        counted = Counted()
        edit = ForkEdit(approvals={"s1": True})
        run = forked(
            agent(counted, careful=True), driver, "f1", len(held.trace) - 1, store=store, run_id="f2", edit=edit
        )
        result = finish(run, driver)
        assert result.reason == "done"
        assert dict(counted.ran) == {}
        assert [s.reused_from for s in result.steps if s.kind == "tool_call"] == ["src/s1"]


def test_a_fork_of_a_fork_that_went_another_way_still_carries_the_first_source_s_calls(store_target: str) -> None:
    """f1 leaves src's path after s1 and finishes without s2; f2, forked from f1 there, asks s2: taken from src."""
    two_sends = [
        tool_turn(tool_call("send", id="s1", to="bob")),
        tool_turn(tool_call("send", id="s2", to="eve")),
        reply("done"),
    ]
    detour = [*two_sends[:1], tool_turn(tool_call("quick", id="q", n=1)), reply("ok")]
    with open_store(store_target) as store:
        made = Counted()
        agent(made, script=two_sends).run("go", store=store, run_id="src")
        assert dict(made.ran) == {"s1": 1, "s2": 1}
        first = Counted()
        assert agent(first, script=detour).fork("src", 3, store=store, run_id="f1").finish().final == "ok"
        assert dict(first.ran) == {"q": 1}  # f1 asked another question and never asked s2
        second = Counted()
        result = agent(second, script=two_sends).fork("f1", 3, store=store, run_id="f2").finish()
        assert result.final == "done"
        assert dict(second.ran) == {}  # s2 was made by src, the run f1 was forked from
        # s1 is in the history f2 starts from (before the fork point): as in any fork, no step of it says reused.
        assert [s.reused_from for s in result.steps if s.kind == "tool_call"] == [None, "src/s2"]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_two_owners_resuming_one_paused_fork_at_once_take_the_carried_result_once(
    store_target: str, driver: str
) -> None:
    """Two threads approve and resume the same stored fork at once: one goes on, the other is refused; nothing sent."""
    with open_store(store_target) as store:
        paused_fork(store, driver)
        snapshot = store.load("f1")
        counted = Counted()
        barrier = threading.Barrier(2)
        outcomes: list[object] = []
        lock = threading.Lock()

        def owner() -> None:
            careful = agent(counted, careful=True)
            barrier.wait()
            try:
                run = resumed(careful, driver, snapshot, store=store, approvals={"s1": True})
                outcome: object = finish(run, driver)
            except (RunLeasedError, StaleRunError) as refused:
                outcome = refused
            with lock:
                outcomes.append(outcome)

        threads = [threading.Thread(target=owner) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results = [o for o in outcomes if isinstance(o, RunResult)]
        assert len(results) == 1, outcomes
        assert results[0].reason == "done"
        assert dict(counted.ran) == {}
        assert store.load("f1")["state"] == "Done"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_two_owners_forking_one_source_at_once_under_fresh_ids_each_reuse_every_completed_call(
    store_target: str, driver: str
) -> None:
    """Forks made at once by two threads from one point each take the source's result; each is its own run."""
    with open_store(store_target) as store:
        agent(Counted()).run("go", store=store, run_id="src")
        counted = Counted()
        barrier = threading.Barrier(2)
        results: list[RunResult] = []
        lock = threading.Lock()

        def owner(name: str) -> None:
            barrier.wait()
            result = finish(forked(agent(counted), driver, "src", 0, store=store, run_id=name), driver)
            with lock:
                results.append(result)

        threads = [threading.Thread(target=owner, args=(f"f{i}",)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [r.reason for r in results] == ["done", "done"]
        assert dict(counted.ran) == {}
        for name in ("f0", "f1"):
            assert store.load(name)["forked_from"] == ["src", 0]
            assert [s["reused_from"] for s in store.load(name)["steps"] if s["kind"] == "tool_call"] == ["src/s1"]
