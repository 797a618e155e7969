"""The minimal store of the guide (``wants``/``save``/``load`` only) on both drivers: run, stop, resume, fork.

docs/how-to/store.md, section 1: "Use it like any store."  A store with
only these methods gets whole snapshots and no leases; its ids are still
refused once taken (``RunExistsError``) unless the run is started with
``overwrite=True``.  Each check runs on the sync driver and on the async one,
which runs the store's sync methods in a worker thread (it has no twins).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, RunExistsError, RunResult
from fsm_agent.persist.store import JournaledStore, Store
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn


class DictStore:
    """Every run as the JSON text of its latest snapshot; a checkpoint after every transition (the guide's)."""

    def __init__(self) -> None:
        self.runs: dict[str, str] = {}
        self.saves = 0

    def wants(self, state: Any, paused: bool) -> bool:
        return True

    def save(self, run_id: str, snapshot: dict[str, Any]) -> None:
        self.saves += 1
        self.runs[run_id] = json.dumps(snapshot)

    def load(self, run_id: str) -> dict[str, Any]:
        if run_id not in self.runs:
            raise KeyError(f"no run {run_id!r}")
        return json.loads(self.runs[run_id])  # type: ignore[no-any-return]


def _model() -> FakeModel:
    return FakeModel(tool_turn(tool_call("add", a=2, b=3)), tool_turn(tool_call("add", a=5, b=4)), reply("9 in all."))


def _run(driver: str, agent: Agent, text: str, **options: Any) -> RunResult:
    if driver == "sync":
        return agent.run(text, **options)
    return asyncio.run(agent.arun(text, **options))


def _resume(driver: str, agent: Agent, source: Any, **options: Any) -> RunResult:
    if driver == "sync":
        return agent.resume(source, **options).finish()

    async def go() -> RunResult:
        return await (await agent.aresume(source, **options)).afinish()

    return asyncio.run(go())


def test_the_guide_s_store_is_a_store_and_not_a_journaled_one() -> None:
    """What the engine checks once per run: a ``Store``, without the four methods of a ``JournaledStore``."""
    assert isinstance(DictStore(), Store)
    assert not isinstance(DictStore(), JournaledStore)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stopped_run_resumes_from_the_minimal_store_as_the_guide_shows(driver: str) -> None:
    """Stopped on max_steps=1, stored Failed; resumed from load() with a larger limit, each call made once."""
    store = DictStore()
    model = _model()
    agent = Agent(model, demo_registry(), max_steps=1)
    with pytest.raises(AgentLoopError) as stop:
        _run(driver, agent, "Add 2 and 3, then 5 and 4.", store=store, run_id="job-1")
    assert stop.value.reason == "max_steps"
    snapshot = store.load("job-1")
    assert (snapshot["state"], snapshot["reason"], len(snapshot["steps"])) == ("Failed", "max_steps", 1)
    result = _resume(driver, agent, snapshot, store=store, max_steps=4)
    assert result.final == "9 in all."
    assert [step.detail for step in result.steps] == [
        'add({"a": 2, "b": 3}) -> 5',
        'add({"a": 5, "b": 4}) -> 9',
        "9 in all.",
    ]
    assert len(model.seen) == 3
    assert store.load("job-1")["state"] == "Done"
    assert "stored_seq" not in store.load("job-1")  # no versions: nothing to compare a write with


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_taken_id_is_refused_unless_overwrite(driver: str) -> None:
    """A second run under a stored id is ``RunExistsError`` and writes nothing; ``overwrite=True`` replaces it."""
    store = DictStore()
    _run(driver, Agent(FakeModel(reply("first")), demo_registry()), "one", store=store, run_id="r")
    before = store.runs["r"]
    with pytest.raises(RunExistsError):
        _run(driver, Agent(FakeModel(reply("second")), demo_registry()), "two", store=store, run_id="r")
    assert store.runs["r"] == before
    _run(driver, Agent(FakeModel(reply("second")), demo_registry()), "two", store=store, run_id="r", overwrite=True)
    assert store.load("r")["final"] == "second"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_run_paused_for_approval_is_decided_and_finished_on_the_minimal_store(driver: str) -> None:
    """Paused (stored paused, whole), then resumed with the decision from the stored snapshot, to Done."""
    store = DictStore()
    model = FakeModel(tool_turn(tool_call("add", id="c1", a=1, b=2)), reply("3"))
    agent = Agent(model, demo_registry(), approve={"add"})
    paused = _run(driver, agent, "add", store=store, run_id="p")
    assert paused.reason == "paused"
    assert store.load("p")["paused"] is True
    result = _resume(driver, agent, store.load("p"), approvals={"c1": True}, store=store)
    assert result.final == "3"
    assert store.load("p")["state"] == "Done"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stored_run_is_forked_by_its_id_from_the_minimal_store(driver: str) -> None:
    """``fork("job", at, store=...)`` / ``afork``: the source read from the store, the fork stored beside it."""
    store = DictStore()
    Agent(_model(), demo_registry()).run("Add 2 and 3, then 5 and 4.", store=store, run_id="job")
    agent = Agent(FakeModel(reply("fork answer")), demo_registry())
    if driver == "sync":
        result = agent.fork("job", 4, store=store, run_id="fork").finish()
    else:

        async def go() -> RunResult:
            return await (await agent.afork("job", 4, store=store, run_id="fork")).afinish()

        result = asyncio.run(go())
    assert result.final == "fork answer"
    assert store.load("fork")["forked_from"] == ["job", 4]
