"""``SqliteStore``'s awaited writes, committed in groups by one writer thread, each plan's failure its own.

Real SQLite files.  To put chosen plans into one batch, a test holds the
store's lock while the writer thread waits for it with one plan taken
(``_one_batch``), queues the plans, then lets the writer go: it takes them
all at once.  Transactions are counted by the ``COMMIT``\\ s the connection
runs (``set_trace_callback``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from support.writer_waits import until

from fsm_agent import RunExistsError, RunLeasedError, SqliteStore
from fsm_agent.persist import plans
from fsm_agent.persist.sqlite_writer import BATCH
from fsm_agent.persist.store import StoreError
from fsm_agent.testing.store_kit import entry, fresh_snapshot


def _statements(store: SqliteStore) -> list[str]:
    """Every statement the store's connection runs from now on, in order."""
    seen: list[str] = []
    store._db.set_trace_callback(seen.append)
    return seen


def _rows(path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows read from ``path`` on a connection of the test's own."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(sql, params).fetchall()


async def _one_batch(store: SqliteStore, *writes: Coroutine[Any, Any, Any]) -> list[Any]:
    """Run ``writes`` in one batch of the writer (after a plug batch of one read); what each returned or raised."""
    writer = store._writer
    store._lock.acquire()
    try:
        plug = asyncio.ensure_future(store.alist_runs())
        await asyncio.sleep(0)  # the plug is queued
        await until(writer._jobs.empty)  # taken: the writer now waits for the lock
        tasks = [asyncio.ensure_future(write) for write in writes]
        await until(lambda: writer._jobs.qsize() == len(writes))
    finally:
        store._lock.release()
    await plug
    return await asyncio.gather(*tasks, return_exceptions=True)


def _between(store: SqliteStore, plan: plans.Plan[Any]) -> list[Any]:
    """``plan`` in one batch between the creations of runs ``before`` and ``after``: what each of the three gave."""
    return asyncio.run(
        _one_batch(
            store,
            store.acreate("before", fresh_snapshot("before"), owner="o"),
            store._arun(plan),
            store.acreate("after", fresh_snapshot("after"), owner="o"),
        )
    )


def _leased(store: SqliteStore, run_id: str, owner: str) -> None:
    store.create(run_id, fresh_snapshot(run_id), owner=owner)


def test_many_concurrent_async_writers_of_distinct_runs_all_land(tmp_path: Path) -> None:
    """Three hundred runs created by as many tasks at once are all stored, in fewer transactions than writes."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        seen = _statements(store)

        async def create_all() -> list[int]:
            ids = [f"r{i}" for i in range(300)]
            return await asyncio.gather(*(store.acreate(i, fresh_snapshot(i), owner=i) for i in ids))

        assert asyncio.run(create_all()) == [1] * 300
    assert _rows(path, "SELECT count(*) FROM runs") == [(300,)]
    assert _rows(path, "SELECT count(*) FROM runs WHERE owner = run_id") == [(300,)]
    assert 300 / BATCH <= seen.count("COMMIT") < 300, "the writes were committed in batches"


def test_a_batch_holds_many_plans_in_one_transaction(tmp_path: Path) -> None:
    """Plans queued together are run in one BEGIN IMMEDIATE ... COMMIT, each inside its own savepoint."""
    with SqliteStore(tmp_path / "runs.db") as store:
        seen = _statements(store)
        created = asyncio.run(
            _one_batch(store, *(store.acreate(f"r{i}", fresh_snapshot(f"r{i}"), owner="o") for i in range(5)))
        )
        assert created == [1] * 5
        batch = seen[seen.index("BEGIN IMMEDIATE") :]
        assert [s for s in batch if s in ("BEGIN IMMEDIATE", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"]
        assert batch.count("SAVEPOINT plan") == 5
        assert seen.count("COMMIT") == 2, "the plug's transaction and the batch's"


def test_two_owners_claiming_one_run_in_one_batch_exactly_one_wins(tmp_path: Path) -> None:
    """Two claims of one free run in one transaction: the first wins, the other is refused, the winner is stored."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        _leased(store, "shared", "first")
        store.renew("shared", owner="first", seq=1, release=True)
        loaded = store.load("shared")
        seen = _statements(store)
        outcomes = asyncio.run(
            _one_batch(store, store.aclaim("shared", loaded, owner="b"), store.aclaim("shared", loaded, owner="c"))
        )
        assert seen.count("COMMIT") == 2, "both claims ran in one transaction"
    assert outcomes[0] == 2
    assert isinstance(outcomes[1], RunLeasedError)
    assert outcomes[1].holder == "b"
    assert _rows(path, "SELECT owner, seq FROM runs WHERE run_id = 'shared'") == [("b", 2)]


def test_a_plan_raising_in_a_batch_rolls_back_only_its_own_statements(tmp_path: Path) -> None:
    """A duplicate run id and an append failing after its fencing update fail alone; their neighbours are stored."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        _leased(store, "taken", "owner")
        _leased(store, "jammed", "owner")
        base = store.load("jammed")
        # A journal row already at version 2: the append's update matches, then its insert breaks the key.
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("INSERT INTO journal (run_id, seq, entry) VALUES ('jammed', 2, '{}')")
        outcomes = asyncio.run(
            _one_batch(
                store,
                store.acreate("before", fresh_snapshot("before"), owner="o"),
                store.acreate("taken", fresh_snapshot("taken"), owner="thief"),
                store.aappend(entry("jammed", 2, base, "lost"), owner="owner"),
                store.acreate("after", fresh_snapshot("after"), owner="o"),
            )
        )
    assert outcomes[0] == outcomes[3] == 1
    assert isinstance(outcomes[1], RunExistsError)
    assert isinstance(outcomes[2], sqlite3.IntegrityError)
    assert _rows(path, "SELECT run_id, owner, seq FROM runs ORDER BY run_id") == [
        ("after", "o", 1),
        ("before", "o", 1),
        ("jammed", "owner", 1),  # its update was rolled back with its failed insert
        ("taken", "owner", 1),
    ]


def test_a_refused_commit_fails_every_plan_of_its_batch(tmp_path: Path) -> None:
    """A COMMIT SQLite refuses (a deferred foreign key left broken) fails all the batch held; the store goes on."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        store._db.execute("PRAGMA foreign_keys = ON")
        store._db.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        store._db.execute("CREATE TABLE child (parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)")

        def orphan() -> plans.Plan[None]:
            yield "INSERT INTO child VALUES (1)", ()

        outcomes = _between(store, orphan())
        assert all(isinstance(o, sqlite3.IntegrityError) and "FOREIGN KEY" in str(o) for o in outcomes), outcomes
        assert asyncio.run(store.acreate("next", fresh_snapshot("next"), owner="o")) == 1
    assert _rows(path, "SELECT run_id FROM runs") == [("next",)]


def test_a_plan_ending_the_transaction_fails_those_before_it_and_the_rest_run_anew(tmp_path: Path) -> None:
    """A plan whose statement ends the whole transaction: it and the plans before it fail, the plans after it commit."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:

        def rollback() -> plans.Plan[None]:
            yield "ROLLBACK", ()

        outcomes = _between(store, rollback())
    assert [type(o) for o in outcomes[:2]] == [sqlite3.OperationalError] * 2
    assert outcomes[2] == 1
    assert _rows(path, "SELECT run_id FROM runs") == [("after",)]


def test_closing_with_writes_queued_fails_them_and_does_not_hang(tmp_path: Path) -> None:
    """close() lets the batch in hand commit, fails the queued writes with a StoreError, and refuses new ones."""
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    writer = store._writer

    async def close_midway() -> list[Any]:
        store._lock.acquire()
        taken = asyncio.ensure_future(store.acreate("taken", fresh_snapshot("taken"), owner="o"))
        await asyncio.sleep(0)
        await until(writer._jobs.empty)
        queued = [asyncio.ensure_future(store.acreate(f"q{i}", fresh_snapshot(f"q{i}"), owner="o")) for i in range(3)]
        await until(lambda: writer._jobs.qsize() == 3)
        threading.Timer(0.2, store._lock.release).start()  # the writer gets the lock while close() waits for it
        store.close()
        results = await asyncio.wait_for(asyncio.gather(taken, *queued, return_exceptions=True), 10)
        with pytest.raises(StoreError, match="closed"):
            await store.acreate("late", fresh_snapshot("late"), owner="o")
        return results

    results = asyncio.run(close_midway())
    assert results[0] == 1
    assert all(isinstance(r, StoreError) and "closed" in str(r) for r in results[1:])
    assert _rows(path, "SELECT run_id FROM runs") == [("taken",)]


def test_a_cancelled_caller_withdraws_its_queued_write_and_the_writer_goes_on(tmp_path: Path) -> None:
    """A write cancelled while queued never runs; the ones beside it and after it are stored."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:

        async def cancel_one() -> list[Any]:
            async def cancelled() -> None:
                task = asyncio.ensure_future(store.acreate("cancelled", fresh_snapshot("cancelled"), owner="o"))
                await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

            outcomes = await _one_batch(store, store.acreate("kept", fresh_snapshot("kept"), owner="o"), cancelled())
            outcomes.append(await store.acreate("later", fresh_snapshot("later"), owner="o"))
            return outcomes

        assert asyncio.run(cancel_one()) == [1, None, 1]
    assert _rows(path, "SELECT run_id FROM runs ORDER BY run_id") == [("kept",), ("later",)]


def test_one_store_serves_successive_event_loops_and_several_threads(tmp_path: Path) -> None:
    """The same store awaited from two asyncio.run calls, then from four threads each running its own loop."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        assert asyncio.run(store.acreate("one", fresh_snapshot("one"), owner="o")) == 1
        assert asyncio.run(store.aload("one"))["run_id"] == "one"

        async def create(prefix: str) -> None:
            await asyncio.gather(*(store.acreate(f"{prefix}{i}", fresh_snapshot("x"), owner="o") for i in range(25)))

        threads = [threading.Thread(target=asyncio.run, args=(create(f"t{n}-"),)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert _rows(path, "SELECT count(*) FROM runs") == [(101,)]


def test_sync_and_async_writes_interleave_on_one_store(tmp_path: Path) -> None:
    """Appends to one run awaited, to another run from a thread's sync calls, at once: every version is stored."""
    with SqliteStore(tmp_path / "runs.db") as store:
        _leased(store, "awaited", "a")
        _leased(store, "synced", "s")
        bases = {run_id: store.load(run_id) for run_id in ("awaited", "synced")}

        def sync_appends() -> None:
            for seq in range(2, 32):
                store.append(entry("synced", seq, bases["synced"], seq), owner="s")

        async def both() -> None:
            thread = asyncio.ensure_future(asyncio.to_thread(sync_appends))
            for seq in range(2, 32):
                await store.aappend(entry("awaited", seq, bases["awaited"], seq), owner="a")
            await thread

        asyncio.run(both())
        for run_id in bases:
            stored = store.load(run_id)
            assert (stored["stored_seq"], stored["evidence"]) == (31, {"mark": 31})
