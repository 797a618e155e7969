"""Batches rerun after a driver crash: runs the dead driver still leases wait in line, not in an executor slot."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
from support.batch_agents import MODEL_LOG, TOOL_LOG, counts, factory
from support.batch_leases import cancel_while_leased, crash_leaving_leases, numbered_questions

from fsm_agent.batch import iter_batch, run_batch

SLOTS = 8
"""Runs at once: the executor slots a dead driver's leased runs could take up."""

LATENCY = 0.01
"""Seconds per model call of the scripted model."""


def _clean_rate(where: Path, questions: list[str]) -> float:
    """Runs per second of a batch into a fresh store."""
    start = time.perf_counter()
    results = run_batch(factory(where, latency=LATENCY), questions, store=where / "runs.db", executor="local",
                        max_in_flight=SLOTS, progress=False)  # fmt: skip
    elapsed = time.perf_counter() - start
    assert all(r.ok for r in results)
    return len(questions) / elapsed


def _rerun_rate(where: Path, questions: list[str], held: range, lease: float) -> float:
    """Runs per second of a rerun after a crash, over the runs the dead driver did not hold, while it still held its.

    The loop is left once those runs are done: the held ones are still
    leased then, and end ``cancelled`` (a later rerun resumes them).
    """
    dead = crash_leaving_leases(where, where / "runs.db", questions, held, lease)
    free = len(questions) - len(held)
    start, finished = time.perf_counter(), 0
    batch = iter_batch(factory(where, latency=LATENCY), questions, store=where / "runs.db", executor="local",
                       max_in_flight=SLOTS)  # fmt: skip
    try:
        for item, result in batch:
            if item.index not in held:
                assert result.ok, result.evidence
                finished += 1
            if finished == free:
                break
        elapsed = time.perf_counter() - start
    finally:
        batch.close()
    del dead
    return free / elapsed


@pytest.mark.slow
def test_a_rerun_after_a_driver_crash_keeps_the_throughput_of_a_clean_batch(tmp_path: Path) -> None:
    """Eight runs leased by a dead driver for 5 s: the other runs go at least 2/3 as fast as a clean batch's."""
    questions = numbered_questions(64)
    held = range(0, 2 * SLOTS, 2)  # among the first runs taken: on the old code, every slot slept on one
    clean, rerun = [], []
    for round_ in range(3):
        (tmp_path / f"clean{round_}").mkdir()
        (tmp_path / f"rerun{round_}").mkdir()
        clean.append(_clean_rate(tmp_path / f"clean{round_}", questions))
        rerun.append(_rerun_rate(tmp_path / f"rerun{round_}", questions, held, lease=5.0))
    ratio = statistics.median(clean) / statistics.median(rerun)
    assert ratio <= 1.5, f"clean {clean} runs/s, rerun {rerun} runs/s"


@pytest.mark.slow
def test_leased_runs_finish_once_their_leases_lapse_with_the_results_of_a_clean_batch(tmp_path: Path) -> None:
    """The dead driver's runs resume after their leases, the others before; same results, each call made once."""
    questions = numbered_questions(16)
    held, lease = range(4), 1.5
    (tmp_path / "ref").mkdir()
    reference = run_batch(factory(tmp_path / "ref"), questions, store=tmp_path / "ref.db", executor="local",
                          max_in_flight=4, progress=False)  # fmt: skip
    earliest = time.time() + lease  # no dead lease lapses before this
    dead = crash_leaving_leases(tmp_path, tmp_path / "runs.db", questions, held, lease)
    arrived: dict[int, float] = {}
    results = {}
    for item, result in iter_batch(factory(tmp_path), questions, store=tmp_path / "runs.db", executor="local",
                                   max_in_flight=4):  # fmt: skip
        arrived[item.index] = time.time()
        results[item.index] = result
    assert [results[i] for i in range(16)] == reference
    assert all(arrived[i] >= earliest for i in held)
    assert all(arrived[i] < earliest for i in range(16) if i not in held), "a free run waited behind a leased one"
    tools, model = counts(tmp_path / TOOL_LOG), counts(tmp_path / MODEL_LOG)
    assert len(tools) == 16 * 3
    assert set(tools.values()) == {1}
    assert len(model) == 16 * 4
    assert set(model.values()) == {1}
    del dead


def test_a_cancelled_rerun_ends_the_runs_still_leased_as_cancelled_and_leaves_them_untouched(tmp_path: Path) -> None:
    """Cancelled while the dead driver's leases are live: its runs end cancelled (leased), unchanged in the store."""
    cancel_while_leased(tmp_path, executor="local")
