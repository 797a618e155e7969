"""What a store's write survives: its PostgreSQL server killed outright (SIGKILL), a frozen SQLite writer.

The PostgreSQL tests run on a cluster of their own (they kill it). Its WAL
writer waits 10 s between rounds and its background writer writes no pages,
so a commit the server acknowledged without writing its WAL (the fast mode,
``synchronous_commit=False``) stays only in the server's memory for seconds,
and killing the server within milliseconds of the checkpoint loses it every
time (33 runs of 33 while this was written), instead of once in a while.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.pg_killable import KillableCluster, process_state
from support.store_cases import tick_agent

from fsm_agent.persist import PostgresStore, SqliteStore


def _calls_after_a_server_kill(cluster: KillableCluster, tmp_path: Path, **options: Any) -> list[str]:
    """Run until the first tool call's outcome is written, kill the server, restart it, resume: the calls made."""
    counter = tmp_path / "calls.txt"
    agent = tick_agent(3, str(counter))
    store = PostgresStore(cluster.dsn, lease=1.0, **options)
    run = agent.start("go", store=store, run_id="r")
    with psycopg_connection(cluster.dsn) as conn:
        conn.execute("CHECKPOINT")  # the run's creation is on disk, whatever the store's commit mode
    while not run.trace or run.trace[-1].source != "ExecuteTool":
        run.advance()  # every="call": the advance that ran the tool wrote its outcome before returning
    cluster.kill()
    assert counter.read_text().split() == ["t0"]
    store.close()  # its connections went with the server
    cluster.restart()
    time.sleep(1.5)  # the killed owner's 1 s lease lapses
    with PostgresStore(cluster.dsn) as resumed:
        result = agent.resume(resumed.load("r"), store=resumed).finish()
    assert result.final == "tick: done after 3"
    return counter.read_text().split()


def psycopg_connection(dsn: str) -> Any:
    """An autocommit connection to ``dsn``."""
    import psycopg

    return psycopg.connect(dsn, autocommit=True)


@pytest.mark.postgres
def test_by_default_a_postgres_checkpoint_survives_the_server_being_killed(
    killable: KillableCluster, tmp_path: Path
) -> None:
    """Default PostgresStore: a tool outcome written just before the server is SIGKILLed is kept; no call repeats."""
    assert _calls_after_a_server_kill(killable, tmp_path) == ["t0", "t1", "t2"]


@pytest.mark.postgres
def test_synchronous_commit_false_can_lose_the_last_checkpoint_to_a_server_kill(
    killable: KillableCluster, tmp_path: Path
) -> None:
    """synchronous_commit=False (the fast mode): the outcome written just before the kill is lost; its call repeats."""
    assert _calls_after_a_server_kill(killable, tmp_path, synchronous_commit=False) == ["t0", "t0", "t1", "t2"]


HOLDER = """
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("holding", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
db.execute("ROLLBACK")
"""
"""Another process that takes the file's write lock and freezes (SIGSTOP) until it is continued."""


@contextlib.contextmanager
def frozen_writer(path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process frozen while it holds ``path``'s write lock; SIGCONT lets it roll back and exit."""
    with subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "holding\n"
            deadline = time.monotonic() + 30
            while process_state(holder.pid) != "T":
                assert time.monotonic() < deadline, "the writer did not freeze"
                time.sleep(0.01)
            yield holder
        finally:
            holder.kill()


def _thaw(holder: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(holder.pid, signal.SIGCONT)


@contextlib.contextmanager
def _thawed_after(holder: subprocess.Popen[str], seconds: float) -> Iterator[None]:
    """Continue the frozen writer after ``seconds`` (in a timer thread), whatever the test does meanwhile."""
    timer = threading.Timer(seconds, _thaw, (holder,))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()


@pytest.mark.subprocess
def test_opening_a_new_sqlite_file_waits_for_a_frozen_writer_instead_of_failing(tmp_path: Path) -> None:
    """A file another process holds mid-transaction (not yet WAL): the store waits for it, then opens and works."""
    path = tmp_path / "runs.db"
    with frozen_writer(path) as holder, _thawed_after(holder, 1.5):
        started = time.monotonic()
        with SqliteStore(path) as store:
            waited = time.monotonic() - started
            result = tick_agent(1).run("go", store=store, run_id="r")
    assert waited >= 1.0  # it waited for the writer (measured: 1.5 s), where it used to fail at once
    assert result.final == "tick: done after 1"
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


@pytest.mark.subprocess
def test_a_current_sqlite_store_opens_beside_a_frozen_writer_and_its_writes_wait_for_it(tmp_path: Path) -> None:
    """A store file at the current schema opens at once while another process is frozen holding the write lock."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as first:
        tick_agent(1).run("go", store=first, run_id="before")
    with frozen_writer(path) as holder, _thawed_after(holder, 4.0):
        started = time.monotonic()
        with SqliteStore(path) as store:
            opened = time.monotonic() - started
            assert [run.run_id for run in store.list_runs()] == ["before"]  # reads need no write lock
            result = tick_agent(1).run("go", store=store, run_id="after")  # its writes wait for the writer
            written = time.monotonic() - started
    assert opened < 2.5  # measured: a few ms; it used to wait for the writer (here 4 s)
    assert written >= 3.9  # the run's first write waited until the writer was continued and rolled back
    assert result.final == "tick: done after 1"
