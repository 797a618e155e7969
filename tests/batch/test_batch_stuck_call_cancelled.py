"""Leaving a local batch while one run waits on a call that does not return: after the grace, its task is cancelled.

The run is checkpointed ``Failed``/``cancelled`` with its lease given up,
on SQLite and PostgreSQL, and the next pass resumes it: only the call that
was in flight is made again; every completed call, once.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from support.batch_leases import lease_free
from support.stuck_calls import QUESTIONS, calls, stuck_agent, wait_for_call

from fsm_agent.batch import batch_items, iter_batch, local, run_batch
from fsm_agent.persist import open_store

LONG_LEASE = 300.0


@pytest.mark.slow
def test_a_run_stuck_in_a_call_when_the_batch_is_left_is_cancelled_checkpointed_and_resumed(
    store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The others end; the batch is left; the stuck run is Failed/cancelled and free; the rerun makes one call again."""
    monkeypatch.setattr(local, "GRACE", 0.5)  # the stuck call never reaches a check: cancelled after the grace
    (tmp_path / "stuck.flag").touch()
    make = functools.partial(stuck_agent, str(tmp_path))
    seen = {}
    batch = iter_batch(make, QUESTIONS, store=store_target, executor="local", max_in_flight=3, lease=LONG_LEASE)
    for item, result in batch:
        seen[item.index] = result
        if len(seen) == 2:
            wait_for_call(tmp_path, "start 1-1")  # the runs share one loop, so it has: a check, not a wait
            break
    batch.close()
    assert sorted(seen) == [0, 2]
    assert all(r.reason == "done" for r in seen.values())
    stuck = batch_items(QUESTIONS)[1].run_id
    with open_store(store_target) as store:
        data = store.load(stuck)
    assert (data["state"], data.get("reason")) == ("Failed", "cancelled")
    assert lease_free(store_target, stuck), "the cancelled run's lease was kept"
    assert calls(tmp_path)["start 1-1"] == 1
    assert calls(tmp_path)["end 1-1"] == 0

    (tmp_path / "stuck.flag").unlink()
    again = run_batch(make, QUESTIONS, store=store_target, executor="local", lease=LONG_LEASE, progress=False)
    assert [r.final for r in again] == [f"answer to {q}" for q in QUESTIONS], [r.evidence for r in again]
    made = calls(tmp_path)
    assert made["start 1-1"] == 2  # the call in flight, made again
    assert {line: n for line, n in made.items() if line != "start 1-1"} == {
        f"{edge} {q}-{t}": 1
        for edge in ("start", "end")
        for q in (0, 1, 2)
        for t in (0, 1)
        if (q, t, edge) != (1, 1, "start")
    }
