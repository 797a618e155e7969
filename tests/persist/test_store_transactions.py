"""One store transaction per I/O boundary (``every="call"``): counted on both stores, and safe to die at each one.

A run of M model calls and T tool calls writes with ``every="call"`` when it
is created, right before each call (the write that also holds the lease for
that call) and when it finishes or pauses: at most M + T + 2 transactions,
whatever the number of transitions.  Counted on SQLite by the ``COMMIT``\\ s its
connection runs (every write is ``BEGIN IMMEDIATE`` ... ``COMMIT``, every read
``BEGIN`` ... ``COMMIT``), on PostgreSQL by the test database's
``pg_stat_database.xact_commit`` (read from another database, so the reading
adds nothing), sync and async.  A process killed (``os._exit``) right after
each of those writes resumes in a new process to the result of a run never
stopped, with each tool call made exactly once, the calls of a parallel batch
included.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.store_cases import durable_calls, in_child, tick_agent, tick_registry

from fsm_agent import Agent, Message, ModelResponse, RunLeasedError, RunResult, Usage
from fsm_agent.drivers.read_back import stored_result
from fsm_agent.persist import SqliteStore, is_url, open_store
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

DRIVERS = ("sync", "async")
K = 6
"""Tool turns of the counted run: K + 1 model calls and K tool calls, 4K + 3 transitions."""


# --- counting transactions ------------------------------------------------------------------------------------


class _CountingDb:
    """A SQLite connection that counts the transactions it commits."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.commits = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            self.commits += 1
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def _xact_commit(dsn: str) -> int:
    """The transactions PostgreSQL counted in ``dsn``'s database, less one per connection made to it, once settled.

    Each new connection's start-up is a transaction of its own (catalog
    reads), whoever opens it (a pool, the async connections of a loop):
    ``sessions`` counts those, so what is left is the store's work.  Read from
    the ``postgres`` database, so the reading itself counts nowhere here.
    """
    import psycopg

    database = dsn.rsplit("/", 1)[1]
    admin = dsn.rsplit("/", 1)[0] + "/postgres"
    query = "SELECT xact_commit - sessions FROM pg_stat_database WHERE datname = %s"
    last, seen = -1, 0
    with psycopg.connect(admin, autocommit=True) as conn:
        # An autoanalyze of the store's tables commits in their database too (pg_cluster turns autovacuum off).
        assert conn.execute("SHOW autovacuum").fetchone() == ("off",), "autovacuum's transactions would be counted"
        # A backend reports its counts when it goes idle (at most once a second) or exits: wait until they settle.
        for _ in range(100):
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(query, (database,)).fetchone()
            count = int(row[0]) if row is not None else 0
            seen = seen + 1 if count == last else 0
            if seen >= 4:
                return count
            last = count
            time.sleep(0.3)
    return last


def _transactions(target: str, every: str, driver: str, run_id: str) -> tuple[int, RunResult]:
    """The store transactions one run of ``tick_agent(K)`` made, and its result.

    On PostgreSQL, psycopg's automatic preparation of a statement a
    connection repeats (``prepare_threshold``) is turned off: it is a
    transaction of its own once per connection, not per run (a pooled
    worker's connections prepare once for all its runs).
    """
    if is_url(target):
        store: Any = open_store(target, every=every)  # its tables are made (or found) before counting starts
        store._connect["prepare_threshold"] = None
        before = _xact_commit(target)
    else:
        store = SqliteStore(target, every=every)
        counting = store._db = _CountingDb(store._db)
    agent = tick_agent(K)
    if driver == "sync":
        result = agent.run("go", store=store, run_id=run_id)
    else:
        result = asyncio.run(agent.arun("go", store=store, run_id=run_id))
    store.close()  # its connections exit, so the server counted all they did
    return (_xact_commit(target) - before if is_url(target) else counting.commits), result


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_writing_every_call_makes_at_most_one_transaction_per_call_plus_two(
    store_target: str, driver: str
) -> None:
    """Model calls + tool calls + 2 store transactions at most (every="transition": one per transition), same run."""
    calls = (K + 1) + K
    count, result = _transactions(store_target, "call", driver, "counted")
    each, same = _transactions(store_target, "transition", driver, "each")
    assert result == same == tick_agent(K).start("go", run_id="counted").finish()
    assert each >= len(result.trace) > calls + 2, "the run has more transitions than calls, each one written"
    assert count <= calls + 2, f"{count} store transactions for {calls} calls"
    with open_store(store_target) as store:
        stored, compared = store.load("counted"), store.load("each")
        listed = {run.run_id: (run.state, run.paused, run.steps) for run in store.list_runs()}
    assert len(listed) == 2
    assert listed["counted"] == listed["each"] == ("Done", False, K + 1)
    assert {k: v for k, v in stored.items() if k not in ("run_id", "start_id", "stored_seq")} == {
        k: v for k, v in compared.items() if k not in ("run_id", "start_id", "stored_seq")
    }


# --- dying at each write -------------------------------------------------------------------------------------

KILLED = 3
LEASE = 0.5


class Pairs:
    """K tool turns of two ``tick`` calls each (a parallel batch for the async driver), then an answer."""

    def __init__(self, k: int) -> None:
        self.k = k

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        given = sum(1 for m in messages if m.role == "assistant")
        if given < self.k:
            calls = [tool_call("tick", id=f"t{given}{half}", n=2 * given + i) for i, half in enumerate("ab")]
            return tool_turn(*calls, content="two", usage=Usage(3, 2))
        return reply(f"done after {given}", usage=Usage(3, 2))


def _agent(kind: str, counter: str | None = None) -> Agent:
    if kind == "ticks":
        return tick_agent(KILLED, counter)
    return Agent(Pairs(KILLED), tick_registry(counter), clock=ManualClock(), max_steps=KILLED + 1)


def _calls(kind: str) -> list[str]:
    if kind == "ticks":
        return [f"t{i}" for i in range(KILLED)]
    return [f"t{i}{half}" for i in range(KILLED) for half in "ab"]


def _dying(target: str, kill_at: int, written: Path) -> Any:
    """An every="call" store whose process dies right after its ``kill_at``-th journal write, noting each one."""
    store: Any = open_store(target, lease=LEASE, every="call")
    real_append = store.append
    count = [0]

    def append(entry: Any, *, owner: str) -> None:
        real_append(entry, owner=owner)
        noted()

    def noted() -> None:
        count[0] += 1
        with written.open("a", encoding="utf-8") as file:
            file.write(f"{count[0]}\n")
        if count[0] == kill_at:
            os._exit(9)

    async def aappend(entry: Any, *, owner: str) -> None:
        await real_aappend(entry, owner=owner)
        noted()

    real_aappend = store.aappend
    store.append, store.aappend = append, aappend
    return store


def _killed_at(target: str, kind: str, driver: str, counter: str, written: str, kill_at: int) -> None:
    store = _dying(target, kill_at, Path(written))
    agent = _agent(kind, counter)
    if driver == "sync":
        agent.run("go", store=store, run_id="cut")
    else:
        asyncio.run(agent.arun("go", store=store, run_id="cut"))


def _resumed(target: str, kind: str, driver: str, counter: str) -> RunResult:
    """Take the run over once the dead owner's lease lapsed, and finish it, writing every call."""
    with open_store(target, lease=LEASE, every="call") as store:
        if store.load("cut")["state"] == "Done":
            return stored_result(_agent(kind, counter), store.load("cut"))  # killed right after its last write
        while True:
            try:
                run = _agent(kind, counter).resume(store.load("cut"), store=store)
                break
            except RunLeasedError:
                time.sleep(0.05)
        return run.finish() if driver == "sync" else asyncio.run(run.afinish())


@pytest.mark.subprocess
@pytest.mark.parametrize(("kind", "driver"), [("ticks", "sync"), ("ticks", "async"), ("pairs", "async")])
def test_a_run_killed_right_after_each_write_resumes_to_the_same_result_with_each_call_made_once(
    store_target: str, tmp_path: Path, kind: str, driver: str
) -> None:
    """os._exit after the n-th write, for every n: the resumed run equals a run never stopped; no call ran twice."""
    whole = _agent(kind).start("go", run_id="cut").finish()
    kill_at = 1
    while True:
        case = tmp_path / f"at{kill_at}"
        case.mkdir()
        target = store_target if is_url(store_target) else str(case / "runs.db")
        if is_url(store_target):
            with open_store(target) as store:
                store.delete("cut")
        counter, written = case / "calls.txt", case / "written.txt"
        code = in_child(_killed_at, target, kind, driver, str(counter), str(written), kill_at)
        if code == 0:
            break  # the run finished before its kill_at-th write: every write was a cut point
        assert code == 9
        before = counter.read_text(encoding="utf-8").split() if counter.exists() else []
        with open_store(target) as store:
            durable = durable_calls(store.load("cut"))
        result = _resumed(target, kind, driver, str(counter))
        assert result == whole, f"killed after write {kill_at}"
        calls = counter.read_text(encoding="utf-8").split()
        assert sorted(set(calls)) == sorted(_calls(kind)), f"killed after write {kill_at}: a tool call never ran"
        # Made again: exactly the calls that had returned without their outcome written yet (a batch's sibling
        # finishing while the write of another's outcome was under way); never one the store held.
        again = sorted(calls[len(before) :])
        assert again == sorted(set(_calls(kind)) - durable), f"killed after write {kill_at}"
        kill_at += 1
    writes = kill_at - 1
    assert writes <= len(_calls(kind)) + KILLED + 2, f"{writes} journal writes"
    assert writes >= KILLED + 1, "a write per call at least (the cut points cover every call)"
