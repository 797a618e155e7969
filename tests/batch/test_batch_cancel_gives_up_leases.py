"""A local batch cancelled mid-way, on SQLite and PostgreSQL: its runs end ``cancelled`` with their leases given up.

The next pass over the same store takes every cancelled run over at once
(nobody holds it), finishes it, and makes no completed tool call again: the
cancel was gentle, each run stopped at a check with its calls' outcomes
stored.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.batch_agents import MODEL_LOG, TOOL_LOG, counts, factory, tag
from support.batch_leases import lease_free

from fsm_agent import CancelToken, RunResult
from fsm_agent.batch import iter_batch, run_batch
from fsm_agent.batch.items import batch_items
from fsm_agent.persist import open_store

QUESTIONS = [f"question {i}" for i in range(10)]
LONG_LEASE = 300.0
"""Far longer than the test: a lease that was not given up would still be live when the store is probed."""


@pytest.mark.slow
def test_a_cancelled_local_batch_leaves_its_runs_cancelled_and_free_and_the_next_pass_finishes_them(
    store_target: str, tmp_path: Path
) -> None:
    """Cancel after two results: every input has a result, each started run is Failed/cancelled and unleased."""
    token = CancelToken()
    seen: dict[int, RunResult] = {}
    make = factory(tmp_path, rounds=6, latency=0.02)
    batch = iter_batch(make, QUESTIONS, store=store_target, executor="local", max_in_flight=3, cancel=token,
                       lease=LONG_LEASE)  # fmt: skip
    for item, result in batch:
        assert item.index not in seen
        seen[item.index] = result
        if len(seen) == 2:
            token.cancel("enough")
    assert sorted(seen) == list(range(len(QUESTIONS)))
    assert {r.reason for r in seen.values()} <= {"done", "cancelled"}
    cut = [i for i, r in seen.items() if r.reason == "cancelled" and r.evidence.get("started") is not False]
    assert cut, "some run was in flight at the cancel"
    items = batch_items(QUESTIONS)
    with open_store(store_target) as store:
        for i in cut:
            data = store.load(items[i].run_id)
            assert (data["state"], data.get("reason")) == ("Failed", "cancelled")
    assert all(lease_free(store_target, items[i].run_id) for i in cut), "a cancelled run's lease was not given up"
    # Every tool call that completed so far, once each.
    assert set(counts(tmp_path / TOOL_LOG).values()) <= {1}

    again = run_batch(make, QUESTIONS, store=store_target, executor="local", max_in_flight=3, lease=LONG_LEASE,
                      progress=False)  # fmt: skip
    assert [r.reason for r in again] == ["done"] * len(QUESTIONS), [r.evidence for r in again]
    assert [r.final for r in again] == [f"answer to {q}" for q in QUESTIONS]
    tools = counts(tmp_path / TOOL_LOG)
    assert sorted(tools) == sorted(f"{tag(q)}-{turn}" for q in QUESTIONS for turn in range(6))
    assert set(tools.values()) == {1}, "a completed tool call was made again"
    # The runs that ended before the cancel were not called again by the second pass.
    model = counts(tmp_path / MODEL_LOG)
    done_first = [i for i, r in seen.items() if r.reason == "done"]
    assert all(model[f"{tag(QUESTIONS[i])} {turn}"] == 1 for i in done_first for turn in range(7))
