"""A run's ``start_id``: fresh at each start, kept by a resume, a new one for a fork; stored as its tools see it."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, ForkEdit, RunContext, ToolRegistry, run_context
from fsm_agent.errors import RunLeasedError, SnapshotError, StaleRunError
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
WAIT = 30.0
"""Seconds the barrier waits at most: its four threads start within milliseconds of each other."""


def _agent(seen: list[str], *turns: int, **limits: Any) -> Agent:
    """A turn calling ``mark`` (which notes the start it was called under) for each of ``turns``, then an answer."""
    tools = ToolRegistry()

    @tools.register
    def mark(n: int, context: RunContext[None]) -> str:
        """Note the run's start."""
        seen.append(context.start_id)
        return "marked"

    model = FakeModel(*(tool_turn(tool_call("mark", id=f"c{n}", n=n)) for n in turns or (1, 2)), reply("ok"))
    return Agent(model, tools, **limits)


def _stopped(agent: Agent, driver: str, **how: Any) -> dict[str, Any]:
    """The run, stopped at ``max_steps`` after its first turn: its snapshot."""
    with pytest.raises(AgentLoopError) as stop:
        agent.run("go", **how) if driver == "sync" else asyncio.run(agent.arun("go", **how))
    assert stop.value.reason == "max_steps"
    snapshot = stop.value.result.snapshot
    assert snapshot is not None
    return json.loads(json.dumps(snapshot))


def _resumed(agent: Agent, driver: str, source: dict[str, Any], **how: Any) -> Any:
    if driver == "sync":
        return agent.resume(source, max_steps=5, **how).finish()

    async def go() -> Any:
        run = await agent.aresume(source, max_steps=5, **how)
        return await run.afinish()

    return asyncio.run(go())


@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_resumed_run_keeps_its_start_and_a_new_run_under_the_same_id_gets_another(
    store_target: str, driver: str, resumer: str
) -> None:
    seen: list[str] = []
    agent = _agent(seen, max_steps=1)
    with open_store(store_target) as store:
        _stopped(agent, driver, store=store, run_id="r")
        stored = store.load("r")
        _resumed(agent, resumer, stored, store=store)
        _stopped(_agent(seen, max_steps=1), driver, store=store, run_id="r", overwrite=True)
        again = store.load("r")
    first, kept, new = seen
    assert first == kept == stored["start_id"]
    assert len(first) == 32
    assert new == again["start_id"] != first


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_snapshot_carries_the_start_to_a_resume_without_a_store(driver: str) -> None:
    seen: list[str] = []
    agent = _agent(seen, max_steps=1)
    snapshot = _stopped(agent, driver, run_id="r")
    _resumed(agent, driver, snapshot)
    assert seen[0] == seen[1] == snapshot["start_id"]


def test_a_fork_is_a_new_start() -> None:
    seen: list[str] = []
    agent = _agent(seen, max_steps=1)
    snapshot = _stopped(agent, "sync", run_id="r")
    edit = ForkEdit(limits={"max_steps": 5})
    fork = _agent(seen, 2).fork(snapshot, 2, edit=edit)  # after c1's dispatch: its result is the source's
    fork_start = fork.snapshot()["start_id"]
    assert fork.finish().final == "ok"
    assert fork_start not in (snapshot["start_id"], "")
    assert seen == [snapshot["start_id"], fork_start]


def test_a_snapshot_from_before_start_ids_resumes_with_none_and_sends_no_start_key() -> None:
    """The keys a server gets are what the process that wrote the snapshot sent: a run and a call id, no start."""
    from fsm_agent.mcp import START_ID_KEY, call_keys

    seen: list[str] = []
    keys: list[dict[str, Any]] = []
    agent = _agent(seen, max_steps=1)
    snapshot = _stopped(agent, "sync", run_id="r")
    del snapshot["start_id"]
    run = agent.resume(snapshot, max_steps=5)
    keys.append(call_keys(run.run_context(tool_call("mark", id="c2", n=2))))
    run.finish()
    assert seen[1] == ""
    assert START_ID_KEY not in keys[0]
    assert keys[0] == {"fsm-agent/run_id": "r", "fsm-agent/call_id": "c2"}


def test_a_start_id_that_is_no_string_is_a_snapshot_error_naming_it() -> None:
    seen: list[str] = []
    agent = _agent(seen, max_steps=1)
    snapshot = _stopped(agent, "sync", run_id="r")
    snapshot["start_id"] = 7
    with pytest.raises(SnapshotError, match="snapshot field start_id must be a string or null, got 7"):
        agent.resume(snapshot, max_steps=5)


def test_parallel_sync_tools_of_a_run_without_a_store_all_see_its_one_run_id_and_start() -> None:
    """The ids are made when first read; four worker threads reading them at once (run_context()) make one each.

    A race: each run's four calls meet at a barrier and then read at once, with
    the interpreter switching threads as often as it can. Without the lock about
    half of such runs told their tools two ids; fifty runs are checked.
    """
    gate = threading.Barrier(4)
    tools = ToolRegistry()
    told: list[tuple[str, str]] = []

    @tools.register
    def mark(n: int) -> str:
        """Note the ids the run is known by."""
        gate.wait(timeout=WAIT)
        context = run_context()
        told.append((context.run_id, context.start_id))
        return "marked"

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(50):
            told.clear()
            model = FakeModel(tool_turn(*(tool_call("mark", id=f"c{n}", n=n) for n in range(4))), reply("ok"))
            result = asyncio.run(Agent(model, tools).arun("go"))
            assert result.final == "ok"
            assert len(told) == 4
            assert len(set(told)) == 1, f"one run told its tools {set(told)}"
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.parametrize("drivers", [("sync", "sync"), ("sync", "async"), ("async", "async")])
def test_two_owners_resuming_a_stored_run_at_once_one_goes_on_under_its_stored_start(
    store_target: str, drivers: tuple[str, str]
) -> None:
    """Both read the stopped run, then claim it at the same moment: one makes ``c2`` under the stored start, once."""
    seen: list[str] = []
    with open_store(store_target) as store:
        _stopped(_agent(seen, max_steps=1), "sync", store=store, run_id="r")
        stored_start = store.load("r")["start_id"]
    gate = threading.Barrier(2)
    outcomes: list[object] = [None, None]

    def owner(i: int, driver: str) -> None:
        with open_store(store_target) as store:
            data = store.load("r")
            gate.wait(timeout=WAIT)
            try:
                outcomes[i] = _resumed(_agent(seen, 2), driver, data, store=store)
            except (RunLeasedError, StaleRunError) as refused:
                outcomes[i] = refused

    threads = [threading.Thread(target=owner, args=(i, driver)) for i, driver in enumerate(drivers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    finished = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(finished) == 1, outcomes
    assert sum(isinstance(o, RunLeasedError) for o in outcomes) == 1, outcomes  # StaleRunError is one
    assert seen == [stored_start, stored_start]  # c1 by the first owner, c2 once, by the winner
