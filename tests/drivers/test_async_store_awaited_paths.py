"""More async paths that must reach the store through its async twins only: fork, heartbeat, batch, cancel, timeout.

``test_async_no_blocking`` covers ``arun``, ``aresume``, ``afinish``,
sub-agents, ``Session`` and local batches over a store whose sync methods
raise.  This module drives the paths it leaves out over the same kind of
store (``SyncRaises``: any sync call, from the loop or from a worker thread,
fails), and a store of whole snapshots (the minimal ``Store``) with async
twins of its own.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.async_only import AsyncOnly

from fsm_agent import Agent, ModelResponse, SqliteStore, ToolRegistry
from fsm_agent.persist.store import JournaledStore, traits
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn


class SyncRaises(AsyncOnly):
    """``AsyncOnly``, with ``kept`` set by the first ``akeep``: a heartbeat renewed the lease."""

    def __init__(self, inner: SqliteStore) -> None:
        super().__init__(inner)
        self.kept = asyncio.Event()

    def noted(self, name: str) -> None:
        if name == "akeep":
            self.kept.set()


@pytest.fixture
def inner(tmp_path: Path) -> Iterator[SqliteStore]:
    """A SQLite store (short lease, so a heartbeat comes soon) the tests set runs up in and read back, sync."""
    with SqliteStore(tmp_path / "runs.db", lease=0.3) as store:
        yield store


def _noting() -> tuple[ToolRegistry, list[str]]:
    registry, notes = ToolRegistry(), []

    @registry.register
    def note(text: str) -> str:
        """Note a text."""
        notes.append(text)
        return f"noted {text}"

    return registry, notes


def test_the_wrapper_is_journaled_and_awaits_every_twin(inner: SqliteStore) -> None:
    """The guard: a JournaledStore whose every twin the engine would await, and whose sync load raises."""
    store = SyncRaises(inner)
    assert isinstance(store, JournaledStore)
    assert traits(store).awaits == {"save", "load", "create", "claim", "append", "renew", "keep"}  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="sync store call"):
        store.load("r")


def test_afork_of_a_stored_run_reads_and_writes_with_the_async_twins_only(inner: SqliteStore) -> None:
    """``afork("src", at, store=...)`` reads the source with ``aload`` and writes the fork with ``acreate``."""
    registry, notes = _noting()
    script = [
        tool_turn(tool_call("note", id="n1", text="a")),
        tool_turn(tool_call("note", id="n2", text="b")),
        reply("ok"),
    ]
    Agent(FakeModel(script), registry).run("go", store=inner, run_id="src")
    assert notes == ["a", "b"]
    store = SyncRaises(inner)
    agent = Agent(FakeModel(reply("ok")), registry)  # the fork takes the source's first two replies

    async def go() -> Any:
        run = await agent.afork("src", 4, store=store, run_id="fork")
        return await run.afinish()

    result = asyncio.run(go())
    assert result.final == "ok"
    assert notes == ["a", "b"]  # the second call was the source's, taken as recorded
    assert inner.load("fork")["forked_from"] == ["src", 4]
    assert {"aload", "acreate", "aappend"} <= set(store.awaited)


def test_the_heartbeat_of_a_long_call_renews_the_lease_with_akeep(inner: SqliteStore) -> None:
    """While an async tool is in flight the lease is renewed by the async heartbeat, through ``akeep``."""
    store = SyncRaises(inner)
    registry = ToolRegistry()

    @registry.register
    async def wait_for_a_heartbeat() -> str:
        """Return once the run's lease was renewed while this call was in flight."""
        await asyncio.wait_for(store.kept.wait(), 30)
        return "renewed"

    agent = Agent(FakeModel(tool_turn(tool_call("wait_for_a_heartbeat", id="w1")), reply("done")), registry)
    result = asyncio.run(agent.arun("go", store=store, run_id="long"))
    assert result.final == "done"
    assert result.messages[2].content == '"renewed"'
    assert "akeep" in store.awaited
    assert inner.load("long")["state"] == "Done"


def test_a_sync_tool_s_heartbeat_renews_with_akeep_from_the_loop(inner: SqliteStore) -> None:
    """A sync tool runs in a thread; meanwhile the loop renews the lease (akeep), which the tool waits to see."""
    store = SyncRaises(inner)
    seen = threading.Event()
    registry = ToolRegistry()

    @registry.register
    def wait_in_a_thread() -> str:
        """Block this worker thread until a heartbeat renewed the lease."""
        return "renewed" if seen.wait(30) else "never renewed"

    original = store.kept.set

    def both() -> None:
        original()
        seen.set()

    store.kept.set = both  # type: ignore[method-assign]
    agent = Agent(FakeModel(tool_turn(tool_call("wait_in_a_thread", id="w1")), reply("done")), registry)
    result = asyncio.run(agent.arun("go", store=store, run_id="long"))
    assert result.messages[2].content == '"renewed"'
    assert "akeep" in store.awaited


def test_a_parallel_batch_writes_each_kept_outcome_with_aappend(inner: SqliteStore) -> None:
    """Two calls of one turn: each outcome is written as it returns (``akeep_outcome``), awaited, nothing sync."""
    store = SyncRaises(inner)
    registry, notes = _noting()
    both = tool_turn(tool_call("note", id="n1", text="a"), tool_call("note", id="n2", text="b"))
    result = asyncio.run(Agent(FakeModel(both, reply("ok")), registry).arun("go", store=store, run_id="b"))
    assert result.final == "ok"
    assert sorted(notes) == ["a", "b"]
    stored = inner.load("b")
    assert [m["tool_call_id"] for m in stored["messages"] if m["role"] == "tool"] == ["n1", "n2"]
    assert set(store.awaited) <= {"acreate", "aappend", "arenew", "akeep"}


def test_a_cancelled_task_records_its_run_cancelled_with_awaited_writes(inner: SqliteStore) -> None:
    """Cancelling the task while a call is in flight stores Failed/cancelled through ``aappend``."""
    store = SyncRaises(inner)
    started = asyncio.Event()
    registry = ToolRegistry()

    @registry.register
    async def hang() -> str:
        """Never return."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    agent = Agent(FakeModel(tool_turn(tool_call("hang", id="h1"))), registry)

    async def go() -> None:
        run = await agent.astart("go", store=store, run_id="c")
        task = asyncio.create_task(run.afinish())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    stored = inner.load("c")
    assert (stored["state"], stored["reason"]) == ("Failed", "cancelled")
    assert store.awaited[0] == "acreate"
    assert "aappend" in store.awaited


class _Stuck:
    """A sync model whose call blocks its thread until ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def complete(self, messages: Any, tools: Any) -> ModelResponse:
        self.release.wait(30)
        return reply("late")


def test_a_run_past_its_deadline_in_a_sync_model_call_is_stored_with_awaited_writes(inner: SqliteStore) -> None:
    """The sync model runs in a daemon worker; the deadline stops the run on timeout, its checkpoint awaited."""
    store = SyncRaises(inner)
    model = _Stuck()
    agent = Agent(model, ToolRegistry(), timeout=0.2, on_stop={"timeout": "return"})
    try:
        result = asyncio.run(agent.arun("go", store=store, run_id="t"))
    finally:
        model.release.set()
    assert result.reason == "timeout"
    assert (inner.load("t")["state"], inner.load("t")["reason"]) == ("Failed", "timeout")
    assert set(store.awaited) <= {"acreate", "aappend", "arenew", "akeep"}


def test_a_sub_agent_called_twice_in_one_batch_runs_both_children_with_awaited_store_calls(
    inner: SqliteStore,
) -> None:
    """Two sub-agent calls in one turn, concurrently: both children stored, every store call awaited."""
    store = SyncRaises(inner)

    class Echo:
        async def acomplete(self, messages: Any, tools: Any) -> ModelResponse:
            return reply(f"answer to {messages[-1].content}")

    child = Agent(Echo(), ToolRegistry())
    registry = demo_registry()
    registry.register(child.as_tool("research", "Answers one question."))  # type: ignore[arg-type]
    turn = tool_turn(tool_call("research", id="q1", input="one?"), tool_call("research", id="q2", input="two?"))
    parent = Agent(FakeModel(turn, reply("both")), registry)
    result = asyncio.run(parent.arun("go", store=store, run_id="p"))
    assert result.final == "both"
    assert inner.load("p/q1")["final"] == "answer to one?"
    assert inner.load("p/q2")["final"] == "answer to two?"


# --- a store of whole snapshots, with async twins --------------------------------------------------------------


class WholeSnapshots:
    """The guide's minimal store (wants/save/load), with ``asave``/``aload`` twins; its sync methods raise."""

    def __init__(self) -> None:
        self.runs: dict[str, str] = {}
        self.awaited: list[str] = []

    def wants(self, state: Any, paused: bool) -> bool:
        return True

    def save(self, run_id: str, snapshot: dict[str, Any]) -> None:
        raise AssertionError("sync store call from the async driver: save")

    def load(self, run_id: str) -> dict[str, Any]:
        raise AssertionError("sync store call from the async driver: load")

    async def asave(self, run_id: str, snapshot: dict[str, Any]) -> None:
        self.awaited.append("asave")
        self.runs[run_id] = json.dumps(snapshot)

    async def aload(self, run_id: str) -> dict[str, Any]:
        self.awaited.append("aload")
        if run_id not in self.runs:
            raise KeyError(run_id)
        return json.loads(self.runs[run_id])  # type: ignore[no-any-return]


def test_a_minimal_store_s_async_twins_are_awaited_for_its_checkpoints() -> None:
    """Not journaled: a checkpoint after the run is open is a whole snapshot, written with ``asave``."""
    store = WholeSnapshots()
    registry, _ = _noting()
    agent = Agent(FakeModel(tool_turn(tool_call("note", id="n1", text="a")), reply("ok")), registry)

    async def go() -> Any:
        run = agent._begin("go", None, (), store, "m")
        await run._aopen_store(new=True, overwrite=True)
        return await run.afinish()

    assert asyncio.run(go()).final == "ok"
    assert json.loads(store.runs["m"])["state"] == "Done"
    assert set(store.awaited) == {"asave"}


def test_arun_on_a_minimal_store_with_async_twins_awaits_aload_for_the_id_check() -> None:
    """``arun(store=..., run_id=...)`` on a store of whole snapshots asks ``aload`` whether the id is taken."""
    store = WholeSnapshots()
    result = asyncio.run(Agent(FakeModel(reply("ok")), ToolRegistry()).arun("go", store=store, run_id="m"))
    assert result.final == "ok"
    assert store.awaited[0] == "aload"


def test_a_minimal_store_refuses_a_taken_id_on_arun_too() -> None:
    """The id check itself: a stored id is ``RunExistsError`` on the async driver, as on the sync one."""
    from fsm_agent import RunExistsError

    store = WholeSnapshots()
    store.runs["m"] = "{}"
    store.load = lambda run_id: json.loads(store.runs[run_id])  # type: ignore[method-assign]
    with pytest.raises(RunExistsError):
        asyncio.run(Agent(FakeModel(reply("ok")), ToolRegistry()).arun("go", store=store, run_id="m"))
    assert store.runs["m"] == "{}"
