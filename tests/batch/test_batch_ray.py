"""Batches on a local Ray instance: dead workers retried and resumed, exactly-once tool calls, resuming, cancelling."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support.batch_agents import MODEL_LOG, TOOL_LOG, SlowToRestart, counts, factory, lines, tag
from support.batch_leases import cancel_while_leased, crash_leaving_leases
from support.pg_cluster import Cluster
from support.provider_server import ProviderServer, body
from support.sdk import skip_unless_installed

from fsm_agent import CancelToken, RunResult
from fsm_agent.batch import iter_batch, run_batch

pytestmark = pytest.mark.ray

skip_unless_installed("ray", reason="the ray extra is installed by `make test`")

TESTS = Path(__file__).resolve().parent.parent
LEASE = 1.0
"""Seconds a dead worker's run stays held before its retry takes it over; short, so the tests stay quick."""


def _questions(n: int) -> list[str]:
    return [f"question {i}" for i in range(n)]


@pytest.mark.usefixtures("cluster")
def test_runs_whose_worker_is_killed_end_as_if_uninterrupted_and_no_completed_call_repeats(tmp_path: Path) -> None:
    """50 runs, every tenth one's worker killed mid-tool-call: same results, each tool and model call made once.

    One run per actor at once (two actors, ``max_in_flight=2``): a killed
    actor had no other run in flight, whose call in flight would run again
    (see ``test_batch_ray_pool`` for actors running several runs at once).
    """
    questions = _questions(50)
    doomed = frozenset(f"{tag(q)}-1" for q in questions[::10])
    (tmp_path / "ref").mkdir()
    reference = run_batch(factory(tmp_path / "ref"), questions, store=tmp_path / "ref.db", executor="local",
                          progress=False)  # fmt: skip
    ledger = tmp_path / "ray"
    ledger.mkdir()
    make = factory(ledger, kill=doomed)
    results = run_batch(make, questions, store=tmp_path / "runs.db", progress=False, lease=LEASE, max_in_flight=2)
    assert [r.evidence for r in results if not r.ok] == []
    assert results == reference
    assert len(list(ledger.glob("killed-*"))) == len(doomed)
    tools, model = counts(ledger / TOOL_LOG), counts(ledger / MODEL_LOG)
    assert len(tools) == 50 * 3
    assert set(tools.values()) == {1}
    assert len(model) == 50 * 4
    assert set(model.values()) == {1}


# How long a killed worker takes to come back: at most 2 s on a quiet 2-core machine, 5-13 s with two CPU hogs
# beside it (the batch's runs sent to it meanwhile are refused, each in 1-2 s).  Six seconds more than its own
# restart: as slow as the quicker restarts under load, three refusals or more, enough to use up one retry.
SLOW_RESTART = 6.0


@pytest.mark.usefixtures("cluster")
def test_a_worker_slow_to_restart_costs_the_run_it_killed_no_retry(tmp_path: Path) -> None:
    """One worker, killed mid-run, back only seconds later: its run waits for it and ends as if uninterrupted.

    A run sent to a worker still restarting is refused; counted as a death, a
    slow restart (a busy machine) used up every retry in a few seconds.
    """
    questions = _questions(3)
    doomed = frozenset({f"{tag(questions[0])}-1"})
    results = run_batch(SlowToRestart(tmp_path, SLOW_RESTART, kill=doomed), questions, store=tmp_path / "runs.db",
                        progress=False, lease=LEASE, max_in_flight=1, max_retries=1)  # fmt: skip
    assert [r.evidence for r in results if not r.ok] == []
    assert [r.final for r in results] == [f"answer to {q}" for q in questions]
    assert len(list(tmp_path.glob("killed-*"))) == 1
    tools = counts(tmp_path / TOOL_LOG)
    assert len(tools) == 3 * 3
    assert set(tools.values()) == {1}


@pytest.mark.usefixtures("cluster")
def test_when_every_worker_is_killed_for_good_each_run_left_ends_as_an_error_saying_so(tmp_path: Path) -> None:
    """The pool's one worker killed so that Ray never restarts it: the batch ends, each run left says why.

    The killed run is not retried on a worker that will not come back, and
    the runs not yet started are not sent anywhere: each is an ``error``
    result naming the cause, and no tool call was made twice.
    """
    questions = _questions(3)
    doomed = frozenset({f"{tag(questions[0])}-1"})
    started = time.monotonic()
    results = run_batch(factory(tmp_path, kill=doomed, for_good=True), questions, store=tmp_path / "runs.db",
                        progress=False, lease=LEASE, max_in_flight=1, max_retries=3)  # fmt: skip
    assert [r.reason for r in results] == ["error"] * 3
    assert {r.evidence["error"] for r in results} == {"every worker of the batch died and Ray restarted none of them"}
    assert len(list(tmp_path.glob("killed-*"))) == 1
    assert counts(tmp_path / TOOL_LOG) == {f"{tag(questions[0])}-0": 1}  # the call before the kill, once
    assert time.monotonic() - started < 60  # not waiting on the killed call's sleep


@pytest.mark.usefixtures("cluster")
def test_a_run_whose_worker_dies_past_its_retries_ends_as_an_error_and_the_others_finish(tmp_path: Path) -> None:
    """A run that kills its worker at every attempt: tried ``max_retries + 1`` times, then an ``error`` saying so.

    The worker comes back each time, so the batch's other runs finish; the
    doomed run's calls before the fatal one were made once, resumed past.
    """
    questions = _questions(3)
    doomed = frozenset({f"{tag(questions[0])}-1"})
    results = run_batch(factory(tmp_path, kill=doomed, always=True), questions, store=tmp_path / "runs.db",
                        progress=False, lease=LEASE, max_in_flight=1, max_retries=1)  # fmt: skip
    assert results[0].reason == "error"
    assert results[0].evidence["error"] == "its worker died 2 times"
    assert [r.final for r in results[1:]] == [f"answer to {q}" for q in questions[1:]]
    assert (tmp_path / f"killed-{tag(questions[0])}-1").read_text() == "xx"  # two attempts, no third
    tools = counts(tmp_path / TOOL_LOG)
    assert tools[f"{tag(questions[0])}-0"] == 1
    assert f"{tag(questions[0])}-1" not in tools
    assert set(tools.values()) == {1}


@pytest.mark.usefixtures("cluster")
def test_a_half_finished_batch_on_ray_makes_no_model_call_for_its_finished_runs(tmp_path: Path) -> None:
    """The first ten runs finished earlier: running all twenty calls the model only for the ten new ones."""
    store = tmp_path / "runs.db"
    questions = _questions(20)
    first = run_batch(factory(tmp_path), questions[:10], store=store, progress=False)
    before = len(lines(tmp_path / MODEL_LOG))
    results = run_batch(factory(tmp_path), questions, store=store, progress=False)
    assert [r.evidence for r in results if not r.ok] == []
    assert results[:10] == first
    called = {key.split()[0] for key in lines(tmp_path / MODEL_LOG)[before:]}
    assert called == {tag(q) for q in questions[10:]}


@pytest.mark.usefixtures("cluster")
def test_results_on_ray_keep_input_order_and_stops_are_results(tmp_path: Path) -> None:
    """A stop on Ray is a result in its input's place, not an exception, and equals the local executor's."""
    inputs = ["loop 0", "question 1", "loop 2", "question 3"]
    results = run_batch(factory(tmp_path), inputs, store=tmp_path / "runs.db", progress=False, max_in_flight=2)
    assert [r.reason for r in results] == ["repeated_action", "done", "repeated_action", "done"], results
    local = run_batch(factory(tmp_path), inputs, store=tmp_path / "local.db", executor="local", progress=False)
    assert results == local


@pytest.mark.usefixtures("cluster")
def test_a_cancelled_ray_batch_reports_every_input_and_a_rerun_finishes_it(tmp_path: Path) -> None:
    """After cancel, runs in flight stop at their next check and report cancelled; rerunning finishes every run."""
    store = tmp_path / "runs.db"
    token = CancelToken()
    seen: list[RunResult] = []
    # A run (8 rounds of 0.5 s) takes longer than a task takes to hear the switch: with rounds of 0.2 s (1.6 s a
    # run) every run in flight once finished before hearing it, in a full suite beside two CPU hogs.
    make = factory(tmp_path, rounds=8, latency=0.5)
    for _, result in iter_batch(make, _questions(8), store=store, cancel=token, max_in_flight=4, lease=LEASE):
        seen.append(result)
        if len(seen) == 2:
            token.cancel("enough")
    assert len(seen) == 8
    stopped = [r for r in seen if r.reason == "cancelled" and r.evidence.get("started") is not False]
    assert stopped, "some run was in flight at the cancel"
    # Told by the batch's switch, each stopped at a check: Failed and checkpointed, its lease given up.
    assert all(r.snapshot is not None and r.snapshot["state"] == "Failed" for r in stopped)
    again = run_batch(make, _questions(8), store=store, progress=False, lease=LEASE)
    assert [r.evidence for r in again if not r.ok] == []
    executed = counts(tmp_path / TOOL_LOG)
    assert len(executed) == 8 * 8
    assert sum(n - 1 for n in executed.values()) <= 4  # only calls in flight at the cancel may run again


@pytest.mark.usefixtures("cluster")
def test_a_sqlite_store_with_a_remote_cluster_is_a_clear_error(tmp_path: Path) -> None:
    """Workers on other machines cannot open a SQLite file: refused before any run, naming the fix."""
    with pytest.raises(ValueError, match=r"SQLite file.*use a PostgreSQL store"):
        run_batch(factory(tmp_path), ["q"], store=tmp_path / "runs.db", ray_address="ray://10.0.0.1:10001",
                  progress=False)  # fmt: skip
    assert not lines(tmp_path / MODEL_LOG)


@pytest.mark.usefixtures("cluster")
def test_no_more_than_max_in_flight_tasks_are_submitted_at_once(tmp_path: Path) -> None:
    """Backpressure on Ray: a task is submitted only when fewer than max_in_flight are unfinished."""
    peak, live = 0, 0

    def started(_: object) -> None:
        nonlocal peak, live
        live += 1
        peak = max(peak, live)

    make = factory(tmp_path, latency=0.01)
    for _ in iter_batch(make, _questions(12), store=tmp_path / "runs.db", max_in_flight=3, on_start=started):
        live -= 1
    assert peak == 3


@pytest.mark.usefixtures("cluster")
def test_a_batch_on_ray_with_a_postgresql_store_survives_killed_workers(
    postgres_cluster: Cluster, tmp_path: Path
) -> None:
    """The cluster set-up: each worker opens the PostgreSQL store from its URL; killed runs resume, calls made once."""
    url = postgres_cluster.new_database(f"t_{uuid.uuid4().hex[:16]}")
    questions = _questions(10)
    doomed = frozenset(f"{tag(q)}-1" for q in questions[::5])
    results = run_batch(factory(tmp_path, kill=doomed), questions, store=url, progress=False, lease=LEASE,
                        max_in_flight=2)  # fmt: skip
    assert [r.evidence for r in results if not r.ok] == []
    assert [r.final for r in results] == [f"answer to {q}" for q in questions]
    assert len(list(tmp_path.glob("killed-*"))) == 2
    tools = counts(tmp_path / TOOL_LOG)
    assert len(tools) == 10 * 3
    assert set(tools.values()) == {1}


@pytest.mark.usefixtures("cluster")
def test_the_batch_command_starts_its_own_ray_unless_told_to_join_a_running_cluster(
    provider_server: ProviderServer, tmp_path: Path
) -> None:
    """A cluster running (RAY_ADDRESS names it): no --ray starts a local instance, --ray auto joins it; each says so."""
    import ray

    running = ray.get_runtime_context().gcs_address
    answer = copy.deepcopy(body("openai", "final_answer"))
    provider_server.queue(answer, answer)
    (tmp_path / "in.jsonl").write_text('"question"\n')
    model = ["--model", "openai:gpt-4o-mini", "--base-url", f"{provider_server.url}/v1", "--max-retries", "0"]
    environment = {**os.environ, "RAY_ADDRESS": running}

    def batch(name: str, *extra: str) -> list[str]:
        argv = ["batch", str(tmp_path / "in.jsonl"), *model, "--store", str(tmp_path / f"{name}.db"), "--quiet"]
        done = subprocess.run([sys.executable, "-m", "fsm_agent", *argv, *extra], env=environment,
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        # The pool's actors are restartable: none may be built from an object Ray could not rebuild (ray#53727).
        assert "constructor arguments in the object store" not in done.stderr
        return [line for line in done.stderr.splitlines() if line.startswith("ray: ")]

    # What it is about to do first (Ray takes seconds to start), then what it did, then the workers it starts.
    starting, alone, workers = batch("alone")
    assert starting == "ray: starting a local Ray instance ..."
    assert alone.startswith("ray: started a local Ray instance at ")
    assert running not in alone
    assert workers.startswith("ray: starting 1 worker, ")  # one input: one actor
    joining, joined, _ = batch("joined", "--ray", "auto")
    assert joining.startswith("ray: joining the running Ray cluster")
    assert joined.startswith(f"ray: joined the Ray cluster at {running} ")
    assert len(provider_server.bodies()) == 2


@pytest.mark.usefixtures("cluster")
def test_runs_a_dead_driver_leased_wait_in_line_on_ray_not_in_a_task(tmp_path: Path) -> None:
    """Eight runs leased by a dead driver, one per task slot: the others finish first, then they; calls made once."""
    questions, held = _questions(24), range(8)
    (tmp_path / "ref").mkdir()
    started = time.monotonic()
    reference = run_batch(factory(tmp_path / "ref"), questions, store=tmp_path / "ref.db", progress=False)
    # The dead leases must outlast the sixteen free runs, which take about as long as this reference batch: from
    # the crash to the last free run, 0.9-1.4 times the reference quiet (2.7-4.1 s), 0.5-1.7 times it with two CPU
    # hogs beside it on 2 cores (6.8-12.9 s).  Three times the reference leaves 1.8x over the worst ratio; 6 s at
    # least, as on a quiet machine before.  The held runs wait it out, so a fixed 40 s would slow every run.  The
    # rerun is given the same lease: a lease longer than its own it takes for a live holder's (``leased``).
    lease = max(6.0, 3 * (time.monotonic() - started))
    earliest = time.time() + lease  # no dead lease lapses before this
    dead = crash_leaving_leases(tmp_path, tmp_path / "runs.db", questions, held, lease)
    arrived: dict[int, float] = {}
    results = {}
    for item, result in iter_batch(factory(tmp_path), questions, store=tmp_path / "runs.db", max_in_flight=8,
                                   lease=lease):  # fmt: skip
        arrived[item.index] = time.time()
        results[item.index] = result
    assert [results[i] for i in range(24)] == reference
    assert all(arrived[i] >= earliest for i in held)
    assert all(arrived[i] < earliest for i in range(24) if i not in held), "a free run waited behind a leased one"
    tools, model = counts(tmp_path / TOOL_LOG), counts(tmp_path / MODEL_LOG)
    assert len(tools) == 24 * 3
    assert set(tools.values()) == {1}
    assert len(model) == 24 * 4
    assert set(model.values()) == {1}
    del dead


@pytest.mark.usefixtures("cluster")
def test_a_cancelled_rerun_on_ray_ends_the_runs_still_leased_as_cancelled_and_leaves_them_untouched(
    tmp_path: Path,
) -> None:
    """On Ray too: cancelled while the dead driver's leases are live, its runs end cancelled, unchanged in the store."""
    cancel_while_leased(tmp_path, executor="ray")
