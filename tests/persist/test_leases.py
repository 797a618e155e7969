"""Leases that follow the owner: renewed by a heartbeat while a call is in flight, fenced, free soon after a crash.

Each test runs against a SQLite file and a PostgreSQL database.  A killed
owner is a new process (``support.store_cases.child_process``) ended with SIGKILL (no cleanup, no lease given
up); the run is taken over by yet another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.store_cases import child_process

from fsm_agent import Agent, Message, ModelResponse, RunLeasedError, RunResult, StaleRunError, ToolRegistry
from fsm_agent.persist import SqliteStore, is_url, open_store
from fsm_agent.persist.store import DEFAULT_LEASE
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

RUN = "slow"
BEAT = "fsm_agent lease"  # how a heartbeat thread or task is named


class TickThenSlow:
    """A quick ``tick`` call, then one ``slow`` call, then an answer; stateless, so any process resumes it."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        given = sum(1 for m in messages if m.role == "assistant")
        if given == 0:
            return tool_turn(tool_call("tick", id="t1"))
        if given == 1:
            return tool_turn(tool_call("slow", id="s1"))
        return reply("done")


def _note(folder: str, name: str, line: str) -> None:
    with Path(folder, name).open("a", encoding="utf-8") as file:
        file.write(line + "\n")


def _lines(folder: str, name: str) -> list[str]:
    path = Path(folder, name)
    return path.read_text(encoding="utf-8").split() if path.exists() else []


def slow_agent(folder: str, during: Callable[[], object] = lambda: None) -> Agent:
    """``TickThenSlow`` with tools that count their calls in ``folder``; ``slow`` runs ``during()`` as its work."""
    registry = ToolRegistry()

    def tick() -> str:
        """Count one quick call."""
        _note(folder, "tick.txt", "t1")
        return "ticked"

    def slow() -> str:
        """Count one slow call's start and end, doing ``during()`` between."""
        _note(folder, "slow-started.txt", "s1")
        during()
        _note(folder, "slow-done.txt", "s1")
        return "slept"

    registry.register(tick)
    registry.register(slow)
    return Agent(TickThenSlow(), registry, clock=ManualClock())


@pytest.fixture
def stores(store_target: str) -> Iterator[Callable[..., Any]]:
    """``stores(**options)``: a store on this test's SQLite file or PostgreSQL database, closed after the test."""
    opened: list[Any] = []

    def make(**options: Any) -> Any:
        store = open_store(store_target, **options)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def _try_claim(target: str, lease: float) -> BaseException | None:
    """Another owner tries to take the run over from its latest snapshot: the error, or None if it took it."""
    with contextlib.closing(open_store(target, lease=lease)) as other:
        try:
            other.claim(RUN, other.load(RUN), owner="another-owner")
        except RunLeasedError as exc:
            return exc
    return None


# --- 1. a killed owner's run is free within one lease -----------------------------------------------------------

KILL_LEASE = 1.0


def _owner(target: str, folder: str) -> None:
    """Advance the run until its slow call, which never returns: the parent kills this process during it."""
    store = open_store(target, lease=KILL_LEASE)
    slow_agent(folder, lambda: time.sleep(600)).run("go", store=store, run_id=RUN)


def _taker(target: str, folder: str) -> None:
    """Try to resume the run until its lease lets us; note when that happened, finish the run, write the result."""
    store = open_store(target, lease=KILL_LEASE)
    while True:
        try:
            run = slow_agent(folder).resume(store.load(RUN), store=store)
            break
        except RunLeasedError:
            _note(folder, "refused.txt", "x")
            time.sleep(0.02)
    Path(folder, "claimed_at.txt").write_text(repr(time.time()), encoding="utf-8")
    Path(folder, "result.json").write_text(run.finish().to_json(), encoding="utf-8")
    store.close()


def _wait_for(found: Callable[[], bool], seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not found():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


@pytest.mark.subprocess
def test_an_owner_killed_mid_call_frees_its_run_within_one_lease_and_no_finished_call_runs_again(
    store_target: str, tmp_path: Path
) -> None:
    """Leased while its owner lives (two leases into the call), taken within 1.5 leases of the kill; tick ran once."""
    folder = str(tmp_path)
    owner = child_process(_owner, store_target, folder)
    taker = child_process(_taker, store_target, folder)
    owner.start()
    try:
        _wait_for(lambda: bool(_lines(folder, "slow-started.txt")))
        started = time.monotonic()
        taker.start()
        _wait_for(lambda: bool(_lines(folder, "refused.txt")))  # the taker is up and trying
        time.sleep(max(started + 2 * KILL_LEASE - time.monotonic(), 0))
        assert isinstance(_try_claim(store_target, KILL_LEASE), RunLeasedError)  # the call outlived the lease
        killed_at = time.time()
        owner.kill()  # SIGKILL: no cleanup, the lease is not given up
        owner.join(60)
        taker.join(120)
    finally:
        for process in (owner, taker):
            if process.pid is not None and process.is_alive():
                process.kill()
    assert taker.exitcode == 0
    claimed_at = float(Path(folder, "claimed_at.txt").read_text(encoding="utf-8"))
    assert killed_at < claimed_at <= killed_at + 1.5 * KILL_LEASE, claimed_at - killed_at
    result = RunResult.from_json(Path(folder, "result.json").read_text(encoding="utf-8"))
    assert (result.reason, result.final) == ("done", "done")
    assert _lines(folder, "tick.txt") == ["t1"], "a completed tool call ran again"
    assert _lines(folder, "slow-done.txt") == ["s1"]
    assert _lines(folder, "slow-started.txt") == ["s1", "s1"]  # the killed call never finished: it ran again


# --- 2. a call three leases long keeps its lease ------------------------------------------------------------------

LEASE = 0.5


def _claims_during_the_call(target: str, seen: list[BaseException | None]) -> Callable[[], None]:
    """A slow call's work: three leases long, another owner trying to take the run over after each lease."""

    def work() -> None:
        for _ in range(3):
            time.sleep(LEASE)
            seen.append(_try_claim(target, LEASE))

    return work


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_call_three_leases_long_never_loses_its_lease(
    store_target: str, stores: Callable[..., Any], tmp_path: Path, driver: str
) -> None:
    """Another owner claiming during the call gets RunLeasedError naming the owner; the run then finishes normally."""
    seen: list[BaseException | None] = []
    agent = slow_agent(str(tmp_path), _claims_during_the_call(store_target, seen))
    store = stores(lease=LEASE)
    began = time.monotonic()
    if driver == "sync":
        run = agent.start("go", store=store, run_id=RUN)
        result = run.finish()
    else:
        result = asyncio.run(agent.arun("go", store=store, run_id=RUN))
    assert time.monotonic() - began >= 3 * LEASE
    assert [type(exc) for exc in seen] == [RunLeasedError] * 3, seen
    assert all(isinstance(exc, RunLeasedError) and exc.holder != "another-owner" for exc in seen)
    assert (result.reason, result.final) == ("done", "done")
    assert store.load(RUN)["state"] == "Done"
    assert _lines(str(tmp_path), "slow-done.txt") == ["s1"]


# --- 3. a heartbeat only for a stored run's call in flight ----------------------------------------------------------


def _beats(*run_ids: str) -> list[str]:
    """The heartbeat threads of these runs (an earlier test's interrupted run may still have one, for a lease)."""
    names = {f"{BEAT} {run_id}" for run_id in run_ids}
    return [thread.name for thread in threading.enumerate() if thread.name in names]


def test_a_sync_heartbeat_runs_only_while_a_stored_runs_call_is_in_flight(
    stores: Callable[..., Any], tmp_path: Path
) -> None:
    """A stored run's call has a heartbeat thread, which ends with the run; a run without a store starts no thread."""
    during: list[tuple[list[str], int]] = []
    agent = slow_agent(str(tmp_path), lambda: during.append((_beats("plain", "stored"), threading.active_count())))
    before = threading.active_count()
    agent.run("go", run_id="plain")
    assert during[0][0] == []
    assert during[0][1] <= before  # no thread started (an earlier test's may have ended meanwhile)
    agent.run("go", store=stores(), run_id="stored")
    assert during[1][0] == [f"{BEAT} stored"]
    _wait_for(lambda: _beats("stored") == [], 5.0)  # the run gave its lease up: its heartbeat thread ends


def test_an_async_heartbeat_task_runs_only_while_a_stored_runs_call_is_in_flight(
    stores: Callable[..., Any], tmp_path: Path
) -> None:
    """A stored run's calls have a heartbeat task, gone when the run ends; a run without a store starts no task."""
    tasks: list[list[str]] = []
    registry = ToolRegistry()

    async def look() -> str:
        """Note the tasks running during the call."""
        tasks.append(sorted(task.get_name() for task in asyncio.all_tasks() if task is not asyncio.current_task()))
        return "looked"

    registry.register(look)
    script = [tool_turn(tool_call("look", id="l1")), reply("done")]

    async def both() -> list[str]:
        await Agent(_Script(script), registry, clock=ManualClock()).arun("go", run_id="plain")
        await Agent(_Script(script), registry, clock=ManualClock()).arun("go", store=stores(), run_id="stored")
        await asyncio.sleep(0)  # a cancelled heartbeat is gone after one turn of the loop
        return [task.get_name() for task in asyncio.all_tasks() if task.get_name().startswith(BEAT)]

    assert asyncio.run(both()) == []
    assert tasks == [[], [f"{BEAT} stored"]]


class _Script:
    """A stateless scripted model: the reply is the one after as many as it already gave."""

    def __init__(self, responses: Sequence[ModelResponse]) -> None:
        self.responses = list(responses)

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return self.responses[sum(1 for m in messages if m.role == "assistant")]


# --- fencing: a renewal never takes back a run it lost -----------------------------------------------------------


@pytest.mark.slow
def test_keep_extends_a_live_owners_lease_past_its_length(stores: Callable[..., Any]) -> None:
    """Renewed with keep() every half lease, a run stays leased for three leases; unrenewed, it lapses."""
    store = stores(lease=0.4)
    run = slow_agent("unused").start("go", store=store, run_id=RUN)
    journal: Any = run._journal
    for _ in range(6):
        time.sleep(0.2)
        store.keep(RUN, owner=journal.owner, seq=journal.seq)
    with pytest.raises(RunLeasedError) as leased:
        stores(lease=0.4).claim(RUN, store.load(RUN), owner="another-owner")
    assert leased.value.holder == journal.owner
    time.sleep(0.5)
    stores(lease=0.4).claim(RUN, store.load(RUN), owner="another-owner")  # lapsed: taken over


def test_keep_never_takes_back_a_run_another_owner_took_over_or_one_given_up(
    stores: Callable[..., Any], tmp_path: Path
) -> None:
    """keep() is refused once another owner claimed the run (live or finished), and on a run the owner let go of."""
    store = stores(lease=0.2)
    run = slow_agent(str(tmp_path)).start("go", store=store, run_id=RUN)
    journal: Any = run._journal
    time.sleep(0.3)
    taker = slow_agent(str(tmp_path)).resume(store.load(RUN), store=stores(lease=0.2))
    with pytest.raises(RunLeasedError) as leased:
        store.keep(RUN, owner=journal.owner, seq=journal.seq)
    assert not leased.value.stale
    taker.finish()
    with pytest.raises(StaleRunError):
        store.keep(RUN, owner=journal.owner, seq=journal.seq)
    assert store.load(RUN)["state"] == "Done"
    # A run let go of at the owner's own version: renew() would take it back, keep() never does.
    store.renew(RUN, owner="someone", seq=store.load(RUN)["stored_seq"], release=True)
    with pytest.raises(StaleRunError):
        store.keep(RUN, owner="someone", seq=store.load(RUN)["stored_seq"])


def _steal(target: str) -> None:
    """Another party takes the run over behind the owner's back: a new version under a live lease of its own."""
    text = "UPDATE {} SET owner = 'thief', lease_until = {}, seq = seq + 1 WHERE run_id = '{}'"
    # Its write: every new version has its journal entry (a version without one is a corrupted store).
    entry = "INSERT INTO {} (run_id, seq, entry) SELECT run_id, seq, '{{}}' FROM {} WHERE run_id = '{}'"
    if is_url(target):
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(text.format("fsm_agent_runs", time.time() + 600, RUN).encode())
            conn.execute(entry.format("fsm_agent_journal", "fsm_agent_runs", RUN).encode())
    else:
        with contextlib.closing(sqlite3.connect(target, isolation_level=None)) as db:
            db.execute(text.format("runs", time.time() + 600, RUN))
            db.execute(entry.format("journal", "runs", RUN))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_renewal_refused_during_a_call_stops_the_run_writing(
    store_target: str, stores: Callable[..., Any], tmp_path: Path, driver: str
) -> None:
    """A run taken over mid-call learns it from its heartbeat during the call; its next checkpoint raises, unwritten."""
    runs: list[Any] = []
    noticed: list[BaseException | None] = []

    def work() -> None:
        _steal(store_target)
        journal = runs[0]._journal
        end = time.monotonic() + 3 * LEASE
        while journal.lost is None and time.monotonic() < end:
            time.sleep(0.01)
        noticed.append(journal.lost)

    store = stores(lease=LEASE)
    run = slow_agent(str(tmp_path), work).start("go", store=store, run_id=RUN)
    runs.append(run)
    finish = run.finish if driver == "sync" else lambda: asyncio.run(run.afinish())
    with pytest.raises(RunLeasedError) as refused:
        finish()
    assert isinstance(noticed[0], RunLeasedError), "the heartbeat did not notice during the call"
    assert refused.value is noticed[0]
    stored = store.load(RUN)
    stolen_at = stored["stored_seq"]
    assert not any(m["role"] == "tool" and m.get("tool_call_id") == "s1" for m in stored["messages"])
    assert _try_claim(store_target, LEASE) is not None  # still the thief's
    assert store.load(RUN)["stored_seq"] == stolen_at


def test_the_default_lease_frees_a_dead_owners_run_within_fifteen_seconds(tmp_path: Path) -> None:
    """The default lease is short (10 to 15 s): a call may last longer, the heartbeat keeps it."""
    assert 10 <= DEFAULT_LEASE <= 15
    with SqliteStore(tmp_path / "runs.db") as store:
        assert store.lease == DEFAULT_LEASE
