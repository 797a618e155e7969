"""``SqliteStore``'s ends: ``aclose`` and ``async with`` on a running loop, and a child process forked from its owner.

Real SQLite files and real forks (multiprocessing's fork start method, so
the child ends with ``os._exit`` and never runs pytest's teardown).  A test
holds the store's lock to keep the writer thread waiting with a write taken,
as in test_sqlite_group_commit.py.  A file's ``-wal`` is deleted by the last
connection to close, so its absence says no connection is left open.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.writer_waits import until

from fsm_agent import SqliteStore
from fsm_agent.persist import plans
from fsm_agent.persist.store import StoreError
from fsm_agent.testing.store_kit import fresh_snapshot

FORK = multiprocessing.get_context("fork")


def _rows(path: Path) -> list[str]:
    """The run ids stored in ``path``, read on a connection of the test's own."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [row[0] for row in db.execute("SELECT run_id FROM runs ORDER BY run_id")]


def _writer_threads(path: Path) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == f"fsm_agent writer {path}"]


def _wal(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _create(store: SqliteStore, run_id: str) -> asyncio.Future[int]:
    return asyncio.ensure_future(store.acreate(run_id, fresh_snapshot(run_id), owner="o"))


async def _queue_behind_one(store: SqliteStore, run_ids: list[str]) -> list[asyncio.Future[int]]:
    """With the store's lock held: the first write taken by the waiting writer, the others queued behind it."""
    writer = store._writer
    taken = _create(store, run_ids[0])
    await asyncio.sleep(0)  # queued
    await until(writer._jobs.empty)
    queued = [_create(store, run_id) for run_id in run_ids[1:]]
    await until(lambda: writer._jobs.qsize() == len(queued))
    return [taken, *queued]


@contextlib.contextmanager
def _lock_held(store: SqliteStore) -> Iterator[Callable[[], bool]]:
    """Hold the store's lock; let it go by calling what this yields (True) or, if the loop is stuck, after 10 s."""
    freed = threading.Lock()

    def free() -> bool:
        if not freed.acquire(blocking=False):
            return False  # let go already, by the timer
        store._lock.release()
        return True

    store._lock.acquire()
    safety = threading.Timer(10, free)
    safety.start()
    try:
        yield free
    finally:
        safety.cancel()
        free()


# --- aclose -----------------------------------------------------------------------------------------------------


def test_aclose_with_writes_queued_commits_the_one_taken_and_fails_the_rest(tmp_path: Path) -> None:
    """aclose lets the write in progress commit, fails the queued ones with a StoreError, then the store goes on."""
    path = tmp_path / "runs.db"
    store = SqliteStore(path)

    async def aclose_midway() -> list[Any]:
        with _lock_held(store) as free:
            writes = await _queue_behind_one(store, ["taken", "q1", "q2", "q3"])
            closing = asyncio.ensure_future(store.aclose())
            await until(lambda: all(write.done() for write in writes[1:]))
            free()
            await closing
        assert _writer_threads(path) == []
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
        outcomes.append(await store.acreate("later", fresh_snapshot("later"), owner="o"))  # opened again
        return outcomes

    outcomes = asyncio.run(aclose_midway())
    assert outcomes[0] == outcomes[-1] == 1
    assert all(isinstance(o, StoreError) and "closed" in str(o) for o in outcomes[1:-1])
    assert _rows(path) == ["later", "taken"]
    store.close()


def test_aclose_on_a_running_loop_lets_other_tasks_run_while_it_waits(tmp_path: Path) -> None:
    """While aclose waits for the writer's batch, the loop keeps ticking another task (it never joins the thread)."""
    path = tmp_path / "runs.db"
    store = SqliteStore(path)

    async def tick_while_closing() -> list[bool]:
        with _lock_held(store) as free:
            writes = await _queue_behind_one(store, ["taken"])
            closing = asyncio.ensure_future(store.aclose())
            seen: list[bool] = []
            for _ in range(50):
                await asyncio.sleep(0)
                seen.append(closing.done())
            assert free()  # by this task, not the timer: the loop ran while aclose waited
            await closing
        await asyncio.gather(*writes)
        return seen

    assert asyncio.run(tick_while_closing()) == [False] * 50
    assert _rows(path) == ["taken"]
    store.close()


def test_the_writer_s_aclose_returns_once_its_thread_has_ended(tmp_path: Path) -> None:
    """GroupWriter.aclose waits, awaited, for the batch in hand and the thread's end, not just its own bookkeeping."""
    store = SqliteStore(tmp_path / "runs.db")

    async def aclose_the_writer() -> tuple[list[bool], bool]:
        writer = store._writer
        with _lock_held(store) as free:
            writes = await _queue_behind_one(store, ["taken"])
            thread = writer._thread
            closing = asyncio.ensure_future(writer.aclose())
            seen: list[bool] = []
            for _ in range(20):
                await asyncio.sleep(0)
                seen.append(closing.done())
            free()
            await closing
        alive = thread is not None and thread.is_alive()
        await asyncio.gather(*writes)
        return seen, alive

    assert asyncio.run(aclose_the_writer()) == ([False] * 20, False)
    store.close()


def test_after_aclose_no_writer_thread_and_no_connection_remain(tmp_path: Path) -> None:
    """aclose ends the writer thread and closes the file (its WAL is gone); the store's next use opens it again."""
    path = tmp_path / "runs.db"
    store = SqliteStore(path)

    async def write_then_aclose() -> None:
        await asyncio.gather(*(store.acreate(f"r{i}", fresh_snapshot(f"r{i}"), owner="o") for i in range(20)))
        assert _writer_threads(path)
        await store.aclose()

    asyncio.run(write_then_aclose())
    assert (_writer_threads(path), _wal(path).exists()) == ([], False)
    assert store.load("r7")["run_id"] == "r7"
    store.close()


def test_async_with_closes_the_store_for_good(tmp_path: Path) -> None:
    """Leaving ``async with store`` closes it as close() does: no thread, no open file, awaited writes refused."""
    path = tmp_path / "runs.db"

    async def use() -> SqliteStore:
        async with SqliteStore(path) as store:
            await store.acreate("r", fresh_snapshot("r"), owner="o")
        with pytest.raises(StoreError, match="closed"):
            await store.acreate("late", fresh_snapshot("late"), owner="o")
        return store

    store = asyncio.run(use())
    assert (_writer_threads(path), _wal(path).exists(), _rows(path)) == ([], False, ["r"])
    with pytest.raises(sqlite3.ProgrammingError):
        store.load("r")


# --- os.fork ----------------------------------------------------------------------------------------------------


def _forked(target: Callable[[], None]) -> multiprocessing.process.BaseProcess:
    """``target`` started in a forked child."""
    process = FORK.Process(target=target)
    process.start()
    return process


def _in_fork_hook(thread: threading.Thread) -> bool:
    """Whether ``thread`` is in ``SqliteStore``'s hook before a fork (waiting for the store's lock)."""
    frame = sys._current_frames().get(thread.ident or 0)
    return frame is not None and frame.f_code.co_name == "_before_fork"


def _exit_code(process: multiprocessing.process.BaseProcess) -> int | None:
    """The child's exit code, None if it hung (it is then killed)."""
    process.join(30)
    if process.exitcode is None:
        process.kill()
        process.join()
    return process.exitcode


def test_a_forked_child_writes_on_its_own_and_leaves_the_parents_queued_writes_alone(tmp_path: Path) -> None:
    """A child forked with writes queued commits its own awaited write; the parent's each commit once, in it.

    The fork waits for the store's lock, so it happens with the writer
    holding one write and three queued; that write then keeps the parent's
    writer busy until the child has exited, so a child that ran the parent's
    queued writes would store them first and the parent's would find them
    there.
    """
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    store.create("before", fresh_snapshot("before"), owner="o")
    go = threading.Event()
    processes: list[multiprocessing.process.BaseProcess] = []

    def busy() -> plans.Plan[None]:
        go.wait(30)
        yield "SELECT 1", ()

    def child() -> None:
        assert asyncio.run(store.acreate("child", fresh_snapshot("child"), owner="c")) == 1
        store.close()

    async def fork_with_writes_queued() -> tuple[int | None, list[Any]]:
        # A plain thread: a child forked from an asyncio worker thread exits 1 on Python 3.11 whatever it ran.
        forking = threading.Thread(target=lambda: processes.append(_forked(child)))
        with _lock_held(store) as free:
            forking.start()
            await until(lambda: _in_fork_hook(forking))  # the fork waits for the lock, ahead of the writer
            writer = store._writer
            writes = [asyncio.ensure_future(store._arun(busy(), write=False))]  # no write lock on the file
            await until(lambda: writer._thread is not None and writer._jobs.empty())
            writes += [_create(store, run_id) for run_id in ("p1", "p2", "p3")]
            await until(lambda: writer._jobs.qsize() == 3)
            free()
        await asyncio.to_thread(forking.join, 30)
        exit_code = await asyncio.to_thread(_exit_code, processes[0])
        go.set()
        return exit_code, await asyncio.gather(*writes, return_exceptions=True)

    safety = threading.Timer(60, go.set)
    safety.start()
    try:
        exit_code, outcomes = asyncio.run(fork_with_writes_queued())
    finally:
        safety.cancel()
    assert (exit_code, outcomes) == (0, [None, 1, 1, 1])
    assert _rows(path) == ["before", "child", "p1", "p2", "p3"]
    assert store.load("child")["run_id"] == "child"
    store.close()


def test_the_parent_closing_its_store_loses_none_of_its_forked_childs_writes(tmp_path: Path) -> None:
    """The parent reads the child's write then closes; the child writes again: both stay stored.

    A child's connection opened beside one inherited from the parent would
    take no file locks, and the parent's close would delete the WAL holding
    the child's later write.
    """
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    store.create("before", fresh_snapshot("before"), owner="o")
    wrote, closed = FORK.Event(), FORK.Event()

    def child() -> None:
        asyncio.run(store.acreate("first", fresh_snapshot("first"), owner="c"))
        wrote.set()
        assert closed.wait(30)
        asyncio.run(store.acreate("second", fresh_snapshot("second"), owner="c"))
        store.close()

    process = _forked(child)
    assert wrote.wait(30)
    assert store.load("first")["run_id"] == "first"
    store.close()
    closed.set()
    assert _exit_code(process) == 0
    assert _rows(path) == ["before", "first", "second"]
