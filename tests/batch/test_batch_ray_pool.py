"""Batches on Ray run on a pool of long-lived actors: few worker processes, bounded connections, killed actors' runs
finished, and a startup that says what it does."""

from __future__ import annotations

import functools
import io
import math
import os
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.batch_agents import TOOL_LOG, Script, _append, counts, factory, registry, tag
from support.pg_cluster import Cluster
from support.sdk import skip_unless_installed

from fsm_agent import Agent, Message, ModelResponse
from fsm_agent.batch import run_batch
from fsm_agent.testing import ManualClock
from fsm_agent.tools import JSONSchema

pytestmark = pytest.mark.ray

skip_unless_installed("ray", reason="the ray extra is installed by `make test`")

TESTS = Path(__file__).resolve().parent.parent
LEASE = 1.0
"""Seconds a dead actor's runs stay held before the pool takes them over again; short, so the tests stay quick."""

PIDS = "pids.log"


class PidScript(Script):
    """The batch tests' scripted model, also noting which process made each model call."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = next(m.content for m in messages if m.role == "user")
        _append(self.ledger / PIDS, f"{tag(question)} {os.getpid()}")
        return super().complete(messages, tools)


def pid_agent(ledger: str, latency: float = 0.0) -> Agent:
    """``scripted_agent`` whose model notes its process id per call."""
    where = Path(ledger)
    return Agent(PidScript(where, 3, latency), registry(where, frozenset()), max_steps=5, clock=ManualClock())


def _questions(n: int) -> list[str]:
    return [f"question {i}" for i in range(n)]


def test_a_batch_that_starts_its_own_ray_says_so_before_the_bar_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_batch with a progress stream: "starting a local Ray instance", what it started, its workers, then the bar."""
    import ray

    assert not ray.is_initialized(), "this test starts its own Ray: it runs before the module's cluster"
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # the workers Ray starts import the test agents
    shown = io.StringIO()
    results = run_batch(factory(tmp_path), _questions(3), store=tmp_path / "runs.db", progress=shown, max_in_flight=2)
    assert all(r.ok for r in results)
    assert not ray.is_initialized()
    said = [line for line in shown.getvalue().splitlines() if line.startswith("ray: ")]
    assert said[0] == "ray: starting a local Ray instance ..."
    assert said[1].startswith("ray: started a local Ray instance at ")
    assert said[2] == "ray: starting 2 workers, 1 run at once each"
    assert shown.getvalue().index(said[2]) < shown.getvalue().index("3/3 runs")


@pytest.mark.usefixtures("cluster")
def test_a_ray_batch_runs_on_a_pool_of_long_lived_workers(tmp_path: Path) -> None:
    """60 runs, 8 at once, on a two-CPU Ray: two worker processes ran every model call, each many runs."""
    questions = _questions(60)
    results = run_batch(functools.partial(pid_agent, str(tmp_path)), questions, store=tmp_path / "runs.db",
                        progress=False, max_in_flight=8)  # fmt: skip
    assert [r.evidence for r in results if not r.ok] == []
    calls = [line.split() for line in (tmp_path / PIDS).read_text().splitlines()]
    pids = {pid for _, pid in calls}
    assert len(pids) <= 2, pids  # a task per run spreads them over one worker process per task slot (8)
    runs_per_pid = {pid: len({run for run, p in calls if p == pid}) for pid in pids}
    assert sum(runs_per_pid.values()) == 60
    assert max(runs_per_pid.values()) >= 30, runs_per_pid  # long-lived: one process ran many runs
    assert os.getpid() not in {int(pid) for pid in pids}


@pytest.mark.usefixtures("cluster")
def test_a_killed_actors_runs_are_finished_by_the_pool_and_its_calls_are_made_once(tmp_path: Path) -> None:
    """Two actors of four runs each, two killed mid-tool-call: every run ends as if uninterrupted.

    The killed call is made once (its process died before it completed) and
    no call made before it is repeated; only a call the dead actor's other
    runs had in flight at the kill may run again: at most three per kill.
    """
    questions = _questions(24)
    doomed = frozenset(f"{tag(q)}-1" for q in (questions[3], questions[17]))
    (tmp_path / "ref").mkdir()
    reference = run_batch(factory(tmp_path / "ref"), questions, store=tmp_path / "ref.db", executor="local",
                          progress=False)  # fmt: skip
    ledger = tmp_path / "ray"
    ledger.mkdir()
    results = run_batch(factory(ledger, kill=doomed, latency=0.005), questions, store=tmp_path / "runs.db",
                        progress=False, lease=LEASE, max_in_flight=8)  # fmt: skip
    assert [r.evidence for r in results if not r.ok] == []
    assert results == reference
    assert len(list(ledger.glob("killed-*"))) == 2
    tools = counts(ledger / TOOL_LOG)
    assert len(tools) == 24 * 3
    assert all(tools[call] == 1 for call in doomed)
    assert sum(n - 1 for n in tools.values()) <= 2 * 3


def _connections(dsn: str, database: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (database,)
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.usefixtures("cluster")
def test_connections_per_worker_stay_bounded_on_postgresql(postgres_cluster: Cluster, tmp_path: Path) -> None:
    """Two actors of eight runs each: the database never sees more than 2 x (8 + 2) connections, plus the driver's."""
    database = f"t_{uuid.uuid4().hex[:16]}"
    url = postgres_cluster.new_database(database)
    in_flight, actors = 16, 2
    runs = math.ceil(in_flight / actors)
    peak, done = 0, threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.wait(0.05):
            peak = max(peak, _connections(url, database))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        results = run_batch(factory(tmp_path, latency=0.02), _questions(48), store=url, progress=False,
                            max_in_flight=in_flight)  # fmt: skip
    finally:
        done.set()
        watcher.join()
    assert [r.evidence for r in results if not r.ok] == []
    print(f"peak connections: {peak}")
    assert 0 < peak <= actors * (runs + 2) + 2, peak
    # The actors give theirs up as the batch ends (each closes its store, then is killed); a killed actor's
    # backends end a moment later, so they are waited for (a minute at most: far past any kill seen here).
    ended = time.monotonic()
    deadline = ended + 60
    while _connections(url, database) > 1:
        assert time.monotonic() < deadline, f"{_connections(url, database)} connections left a minute after the batch"
        time.sleep(0.1)
    print(f"connections given up {time.monotonic() - ended:.2f} s after the batch")
