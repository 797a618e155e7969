"""Every store behaves the same: each test here runs against a SQLite file and a PostgreSQL database.

The store contract itself is checked by ``fsm_agent.testing.stores.StoreConformance`` (``TestBundledStores``),
the suite a store of anyone's runs; what is here checks the engine over the bundled stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.store_cases import LONE, Ticks, as_json, journal, tick_agent

import fsm_agent
from fsm_agent import (
    Agent,
    AgentLoopError,
    Message,
    ModelResponse,
    RunExistsError,
    RunLeasedError,
    RunResult,
    ToolRegistry,
    Usage,
)
from fsm_agent.persist import PostgresStore, SqliteStore, is_url, open_store
from fsm_agent.persist.store import DEFAULT_LEASE, TWINS, FullStore, Traits, journaled, traits
from fsm_agent.records import plain
from fsm_agent.testing import ManualClock
from fsm_agent.testing.replay import replay
from fsm_agent.testing.stores import LoseEntry, MakeStore, ReopenStore, StoreConformance

Store = SqliteStore | PostgresStore


@pytest.fixture
def stores(store_target: str) -> Iterator[list[Store]]:
    """Stores opened in the test, closed after it."""
    made: list[Store] = []
    yield made
    for store in made:
        store.close()


@pytest.fixture
def opened(store_target: str, stores: list[Store]) -> Any:
    """``opened(**options)``: a store on this test's SQLite file or PostgreSQL database."""

    def make(**options: Any) -> Store:
        store = open_store(store_target, **options)
        stores.append(store)
        return store

    return make


def test_after_every_transition_the_store_loads_exactly_the_run_s_snapshot(opened: Any) -> None:
    """every="transition": base plus journal rebuilds the very snapshot the run object gives, at every transition."""
    store = opened(every="transition")
    run = tick_agent(5).start("go", store=store, run_id="r")
    assert store.load("r") == as_json(run.snapshot())
    while not run.done:
        run.advance()
        assert store.load("r") == as_json(run.snapshot())


def test_by_default_the_store_holds_the_run_as_of_the_last_call_s_outcome(opened: Any) -> None:
    """every="call" (the default): each call's outcome is stored as it returns; the pure steps after it wait."""
    store = opened()
    run = tick_agent(5).start("go", store=store, run_id="r")
    stored = as_json(run.snapshot())
    writes = 0
    while not run.done:
        run.advance()
        if run.trace[-1].source in {"AwaitModel", "ExecuteTool"} or run.done:
            stored, writes = as_json(run.snapshot()), writes + 1
        assert store.load("r") == stored
    assert writes == 5 + 6 + 1  # 6 model calls, 5 tool calls, and the end (Dispatch->Done)
    assert len(run.trace) > writes


def test_each_checkpoint_appends_only_what_its_transition_added(opened: Any, store_target: str) -> None:
    """One journal entry per transition, holding the new messages, steps and trace entries, whatever the length."""
    store = opened(every="transition")
    result = tick_agent(60).run("go", store=store, run_id="long")
    entries = journal(store_target, "long")
    assert len(entries) == len(result.trace)
    assert all(len(e.get("add", {}).get("trace", [])) == 1 for e in entries)
    assert sum(len(e.get("add", {}).get("messages", [])) for e in entries) == len(result.messages) - 1
    sizes = [len(json.dumps(e)) for e in entries]
    early, late = max(sizes[4:40]), max(sizes[-40:-4])
    assert late <= early * 1.2, "an entry grew with the length of the run"


def test_delete_finished_keeps_running_and_paused_runs_and_honours_older_than(opened: Any) -> None:
    """Only Done and Failed runs go, and with older_than only those last saved before then."""
    store = opened()
    tick_agent(1).run("go", store=store, run_id="finished")
    paused = tick_agent(3, approve={"tick"}).run("go", store=store, run_id="paused")
    running = tick_agent(3).start("go", store=store, run_id="running")
    running.advance()
    assert paused.reason == "paused"
    assert store.delete_finished(older_than=3600) == 0
    assert store.delete_finished(older_than=0) == 1
    assert sorted(r.run_id for r in store.list_runs()) == ["paused", "running"]
    assert store.delete("paused") is True
    assert store.delete("paused") is False
    with pytest.raises(KeyError, match="no run 'paused'"):
        store.load("paused")


def test_reusing_a_run_id_is_refused_and_the_stored_run_survives(opened: Any) -> None:
    """A second run with a stored id is RunExistsError, even for a paused run; overwrite=True replaces it."""
    store = opened()
    first = tick_agent(3, approve={"tick"}).run("wire the money", store=store, run_id="job-42")
    assert first.reason == "paused"
    with pytest.raises(RunExistsError, match="'job-42' already exists") as info:
        tick_agent(1).run("unrelated", store=store, run_id="job-42")
    assert isinstance(info.value, fsm_agent.FsmAgentError)
    assert store.load("job-42")["messages"][0]["content"] == "wire the money"
    tick_agent(1).run("unrelated", store=store, run_id="job-42", overwrite=True)
    assert store.load("job-42")["messages"][0]["content"] == "unrelated"


def test_an_empty_run_id_is_a_value_error(opened: Any) -> None:
    """run_id="" is refused rather than replaced by a random id, with a store or without."""
    with pytest.raises(ValueError, match="run_id must not be empty"):
        tick_agent(1).run("go", store=opened(), run_id="")
    with pytest.raises(ValueError, match="run_id must not be empty"):
        tick_agent(1).start("go", run_id="")


def test_a_second_owner_is_refused_with_the_holder_named_until_the_first_returns(opened: Any) -> None:
    """While one run object advances a run, resuming it elsewhere is RunLeasedError; once it pauses, anyone may."""
    store = opened()
    agent = tick_agent(3, approve={"tick"})
    first = agent.start("go", store=store, run_id="shared")
    first.advance()
    with pytest.raises(RunLeasedError) as info:
        agent.resume(store.load("shared"), store=opened())
    assert info.value.holder == first._journal.owner  # type: ignore[union-attr]
    assert info.value.holder in str(info.value)
    while not first.paused:
        first.advance()
    resumed = agent.resume(store.load("shared"), store=opened(), approvals={"t0": True})
    resumed.advance()
    assert store.load("shared")["trace"][-1]["dest"] == "AwaitModel"


def test_resuming_a_paused_run_without_a_decision_leaves_it_free(opened: Any) -> None:
    """Looking at a paused run through resume() does not lock out the person who then decides on it."""
    store = opened()
    agent = tick_agent(3, approve={"tick"})
    agent.run("go", store=store, run_id="waiting")
    assert agent.resume(store.load("waiting"), store=store).paused
    decided = agent.resume(store.load("waiting"), store=opened(), approvals={"t0": True})
    decided.advance()
    assert store.load("waiting")["trace"][-1]["source"] == "ExecuteTool"


def test_a_lapsed_lease_is_taken_over_and_the_old_owner_is_then_refused(opened: Any) -> None:
    """A stuck owner's lease lapses; another resumes the run; the stuck one's next checkpoint is refused."""
    store = opened(lease=0.3)
    stuck = tick_agent(4).start("go", store=store, run_id="slow")
    stuck.advance()
    time.sleep(0.4)
    taker = tick_agent(4).resume(store.load("slow"), store=opened(lease=0.3))
    result = taker.finish()
    with pytest.raises(RunLeasedError):
        stuck.advance()
    assert store.load("slow")["final"] == result.final


@pytest.mark.slow
def test_a_run_checkpointing_every_turn_still_renews_its_lease_in_between(opened: Any) -> None:
    """With every="turn", transitions that write nothing still renew a lease that is a third spent."""
    store = opened(every="turn", lease=0.6)
    run = tick_agent(3).start("go", store=store, run_id="turns")
    while run.state != "Dispatch":
        run.advance()
    time.sleep(0.3)
    run.advance()  # Dispatch -> ExecuteTool: no checkpoint, but the lease is renewed
    time.sleep(0.4)
    with pytest.raises(RunLeasedError):
        tick_agent(3).resume(store.load("turns"), store=opened(lease=0.6))


def test_save_replaces_a_run_whole_but_not_one_being_advanced(opened: Any) -> None:
    """save() is a compaction point for a run nobody holds, and refuses a leased one."""
    store = opened()
    run = tick_agent(3).start("go", store=store, run_id="busy")
    run.advance()
    with pytest.raises(RunLeasedError):
        store.save("busy", run.snapshot())
    result = run.finish()
    store.save("busy", store.load("busy"))
    assert store.load("busy")["final"] == result.final
    store.save("fresh", store.load("busy"))
    assert {r.run_id for r in store.list_runs()} == {"busy", "fresh"}


def test_lone_surrogates_are_stored_and_loaded_exactly(opened: Any) -> None:
    """Model and tool text with lone surrogates is checkpointed, loaded back unchanged and resumed."""
    store = opened()
    agent = tick_agent(2, text=LONE)
    run = agent.start("go \ud800", store=store, run_id="surrogate")
    run.advance()
    loaded = store.load("surrogate")
    assert loaded == as_json(run.snapshot())
    assert loaded["messages"][-1]["content"] == LONE
    assert agent.resume(loaded).finish().final == f"{LONE}: done after 2"
    result = run.finish()
    assert store.load("surrogate")["final"] == result.final


def test_the_async_driver_awaits_its_checkpoints(opened: Any) -> None:
    """arun with a store never calls a sync store method, and the stored run equals the result."""
    store = opened()
    called: list[str] = []
    for name in ("save", "load", "create", "claim", "append", "renew"):
        real = getattr(store, name)

        def refuse(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            called.append(_name)
            return _real(*args, **kwargs)

        setattr(store, name, refuse)

    async def main() -> tuple[Any, dict[str, Any], list[str]]:
        result = await tick_agent(4).arun("go", store=store, run_id="async")
        loaded = await store.aload("async")
        runs = [r.run_id for r in await store.alist_runs(state="Done")]
        await store.aclose()
        return result, loaded, runs

    result, loaded, runs = asyncio.run(main())
    if isinstance(store, PostgresStore):
        assert called == [], "the event loop waited on a sync database call"
    assert (loaded["final"], loaded["trace"], runs) == (result.final, [plain(t) for t in result.trace], ["async"])


def test_an_async_run_cancelled_mid_call_is_stored_as_cancelled_and_released(opened: Any) -> None:
    """Cancelling the task records Failed(cancelled) in the store, awaited, and frees the run for others."""
    store = opened()
    registry = ToolRegistry()
    started = asyncio.Event()

    @registry.register
    async def tick(n: int) -> int:
        """Wait for a long time."""
        started.set()
        await asyncio.sleep(30)
        return n

    agent = Agent(Ticks(3), registry, clock=ManualClock())

    async def main() -> None:
        task = asyncio.ensure_future(agent.arun("go", store=store, run_id="cut"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.aclose()

    asyncio.run(main())
    stored = store.load("cut")
    assert (stored["state"], stored["reason"]) == ("Failed", "cancelled")
    tick_agent(3).resume(stored, store=store)  # nobody holds it any more


def test_async_methods_cover_the_whole_protocol(opened: Any) -> None:
    """asave, aload, adelete and adelete_finished do what their sync twins do."""
    store = opened()

    async def main() -> None:
        tick_agent(1).run("go", store=store, run_id="a")
        snapshot = await store.aload("a")
        assert await store.asave("b", snapshot) == 1
        assert await store.aload("b") == {**snapshot, "stored_seq": 1}
        assert await store.adelete("b") is True
        assert await store.adelete_finished() == 1
        assert await store.alist_runs() == []
        await store.aclose()

    asyncio.run(main())


def test_a_store_with_only_save_and_load_still_checkpoints_whole_snapshots() -> None:
    """The three-method protocol still works: whole snapshots, reuse of an id still refused."""

    class Plain:
        def __init__(self) -> None:
            self.runs: dict[str, dict[str, Any]] = {}

        def wants(self, state: Any, paused: bool) -> bool:
            return True

        def save(self, run_id: str, snapshot: dict[str, Any]) -> None:
            self.runs[run_id] = snapshot

        def load(self, run_id: str) -> dict[str, Any]:
            return self.runs[run_id]

    store = Plain()
    result = tick_agent(2).run("go", store=store, run_id="p")
    assert store.runs["p"]["final"] == result.final
    with pytest.raises(RunExistsError):
        tick_agent(2).run("go", store=store, run_id="p")
    assert asyncio.run(tick_agent(2).arun("go", store=store, run_id="q")).final == result.final


def test_a_stopped_run_being_resumed_is_never_free_for_a_second_owner(opened: Any) -> None:
    """From the claim on, the resuming owner holds the lease: a second resume at its resume edge is refused."""
    store = opened()
    with pytest.raises(AgentLoopError):
        tick_agent(3, max_steps=1).run("go", store=store, run_id="stopped")
    agent = tick_agent(3)
    tried: list[BaseException | None] = []

    def second_owner_tries(event: fsm_agent.TransitionEvent) -> None:
        try:
            agent.resume(store.load("stopped"), store=opened(), max_steps=4)
            tried.append(None)
        except RunLeasedError as exc:
            tried.append(exc)

    first = agent.resume(store.load("stopped"), store=store, max_steps=4, observers=[second_owner_tries])
    refused = tried[0]
    assert refused is not None, "the second owner took a run the first was resuming"
    assert refused.holder == first._journal.owner  # type: ignore[attr-defined, union-attr]


def test_a_page_past_a_64_bit_integer_is_a_value_error_in_both_stores(opened: Any) -> None:
    """``list_runs(offset=2**63)`` or such a limit is refused by name before any query, the same in both stores."""
    store = opened()
    for page in ({"offset": 2**63}, {"limit": 2**63}, {"offset": 10**29}):
        with pytest.raises(ValueError, match=f"{next(iter(page))} must be"):
            store.list_runs(**page)
    assert store.list_runs(offset=2**63 - 1) == []


def _delete_journal_entry(target: str, run_id: str, seq: int) -> None:
    """Delete one journal row behind the store's back, as a hand-edited or damaged database would lose it."""
    if is_url(target):
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("DELETE FROM fsm_agent_journal WHERE run_id = %s AND seq = %s", (run_id, seq))
    else:
        with contextlib.closing(sqlite3.connect(target)) as db, db:
            db.execute("DELETE FROM journal WHERE run_id = ? AND seq = ?", (run_id, seq))


class TestBundledStores(StoreConformance):
    """The conformance suite any store runs (``fsm_agent.testing.stores``), on a SQLite file and on PostgreSQL."""

    @pytest.fixture
    def make_store(self, store_target: str, stores: list[Store]) -> MakeStore:
        """A store on this test's SQLite file or PostgreSQL database, with the lease the check asks for."""

        def make(lease: float) -> Store:
            store = open_store(store_target, lease=lease)
            stores.append(store)
            return store

        return make

    @pytest.fixture
    def reopen_store(self, make_store: MakeStore) -> ReopenStore:
        """Another store object on the same SQLite file or PostgreSQL database: ``make_store`` opens one each call."""
        return make_store

    @pytest.fixture
    def lose_entry(self, store_target: str) -> LoseEntry:
        """Delete a journal row with the database's own client."""
        return lambda run_id, seq: _delete_journal_entry(store_target, run_id, seq)


def test_both_bundled_stores_declare_the_full_store_protocol(opened: Any) -> None:
    """SqliteStore and PostgresStore are FullStores (checked statically in planned.py too), so the engine journals."""
    store = opened()
    assert isinstance(store, FullStore)
    assert traits(store) == Traits(True, store.lease, "call", True, frozenset(TWINS))


def test_a_store_with_only_save_and_load_is_not_journaled_and_keeps_its_defaults() -> None:
    """traits() of a minimal store: whole snapshots, the default lease, renew for keep, no async twins."""

    class Plain:
        def wants(self, state: Any, paused: bool) -> bool:
            return True

        def save(self, run_id: str, snapshot: dict[str, Any]) -> None:
            pass

        def load(self, run_id: str) -> dict[str, Any]:
            raise KeyError(run_id)

    assert not journaled(Plain())
    assert traits(Plain()) == Traits(False, DEFAULT_LEASE, None, False, frozenset())


@pytest.mark.subprocess
def test_only_the_conformance_suite_imports_pytest() -> None:
    """``import fsm_agent`` and ``fsm_agent.testing`` import neither pytest nor psycopg; the suite's module does."""
    code = (
        "import sys, fsm_agent, fsm_agent.testing, fsm_agent.persist;"
        "print('pytest' in sys.modules, 'psycopg' in sys.modules);"
        "import fsm_agent.testing.stores;"
        "print('pytest' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["False", "False", "True"]


class _OnceUnusable:
    """A model whose first reply cannot be acted on (``unusable``), then answers; it counts its calls."""

    def __init__(self, unusable: ModelResponse) -> None:
        self.unusable, self.calls = unusable, 0

    def complete(self, messages: Any, tools: Any) -> ModelResponse:
        self.calls += 1
        return self.unusable if self.calls == 1 else ModelResponse(Message("assistant", "answered"))


UNUSABLE = {
    "usage a tuple": ModelResponse(Message("assistant", "x"), usage=(1, 2)),  # type: ignore[arg-type]
    "usage an object": ModelResponse(Message("assistant", "x"), usage=object()),  # type: ignore[arg-type]
    "usage NaN": ModelResponse(Message("assistant", "x"), usage=Usage(float("nan"), 2)),  # type: ignore[arg-type]
    "stop_reason an object": ModelResponse(Message("assistant", "x"), stop_reason=object()),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("unusable", UNUSABLE.values(), ids=UNUSABLE.keys())
def test_a_reply_the_run_cannot_use_is_stored_and_the_run_resumes_and_replays_from_it(
    opened: Any, unusable: ModelResponse, driver: str
) -> None:
    """AwaitModel->Failed[model_error] on a reply whose usage or stop reason is unusable: stored, resumed, replayed.

    The reply's unusable part is kept as the text of its repr (JSON cannot hold an object, PostgreSQL no NaN):
    the run stops with its reason instead of failing at its checkpoint, the stored run loads and resumes with
    one more model call, and the exported recording replays to the same stop.
    """
    store = opened()
    model = _OnceUnusable(unusable)
    agent = Agent(model, ToolRegistry())

    def go() -> RunResult:
        if driver == "sync":
            return agent.run("go", store=store, run_id="r")
        return asyncio.run(agent.arun("go", store=store, run_id="r"))

    with pytest.raises(AgentLoopError) as stopped:
        go()
    assert stopped.value.reason == "model_error"
    kept = store.load("r")["io"][0]["reply"]
    assert isinstance(kept["usage"], str | None)
    assert isinstance(kept["stop_reason"], str)
    replayed = replay(Agent(model, ToolRegistry()), store.export("r"))
    assert (replayed.reason, replayed.trace) == ("model_error", stopped.value.result.trace)
    assert model.calls == 1  # the replay called no model
    result = agent.resume(store.load("r"), store=store, retry=True).finish()
    assert (result.final, model.calls) == ("answered", 2)
    assert store.load("r")["state"] == "Done"
