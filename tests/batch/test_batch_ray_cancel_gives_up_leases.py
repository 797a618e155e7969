"""A batch on Ray cancelled mid-way, on SQLite and PostgreSQL: runs end ``cancelled`` with their leases given up.

Each actor hears the batch's switch and stops its runs at their next check,
checkpointed; nobody holds them after, so the next pass takes every one
over at once (the lease here is far longer than the test) and finishes it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from support.batch_agents import TOOL_LOG, counts, factory, tag
from support.batch_leases import lease_free
from support.sdk import skip_unless_installed
from support.stuck_calls import QUESTIONS as STUCK
from support.stuck_calls import calls, stuck_agent, wait_for_call

from fsm_agent import CancelToken, RunResult
from fsm_agent.batch import batch_items, iter_batch, on_ray, run_batch
from fsm_agent.persist import open_store

pytestmark = pytest.mark.ray

skip_unless_installed("ray", reason="the ray extra is installed by `make test`")

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
LONG_LEASE = 300.0
"""Far longer than the test: a lease not given up would still be live when the store is probed."""
ROUNDS = 8
QUESTIONS = [f"question {i}" for i in range(6)]


@pytest.mark.usefixtures("cluster")
def test_a_cancelled_ray_batch_gives_up_its_leases_and_the_next_pass_finishes_every_run(
    store_target: str, tmp_path: Path
) -> None:
    """Cancel after the first result: runs in flight are Failed/cancelled and free; the rerun makes no call twice."""
    # Runs of 8 rounds of 0.3 s: longer than an actor takes to hear the switch (a second), so some are cut.
    make = factory(tmp_path, rounds=ROUNDS, latency=0.3)
    token, seen = CancelToken(), dict[int, RunResult]()
    for item, result in iter_batch(make, QUESTIONS, store=store_target, cancel=token, max_in_flight=4,
                                   lease=LONG_LEASE):  # fmt: skip
        assert item.index not in seen
        seen[item.index] = result
        token.cancel("enough")
    assert sorted(seen) == list(range(len(QUESTIONS)))
    assert {r.reason for r in seen.values()} <= {"done", "cancelled"}
    cut = [i for i, r in seen.items() if r.reason == "cancelled" and r.evidence.get("started") is not False]
    assert cut, "some run was in flight at the cancel"
    items = batch_items(QUESTIONS)
    with open_store(store_target) as store:
        assert all(store.load(items[i].run_id)["state"] == "Failed" for i in cut)
    assert [i for i in cut if not lease_free(store_target, items[i].run_id)] == [], "leases kept after the cancel"
    assert set(counts(tmp_path / TOOL_LOG).values()) <= {1}

    again = run_batch(make, QUESTIONS, store=store_target, progress=False, lease=LONG_LEASE, max_in_flight=4)
    assert [r.evidence for r in again if not r.ok] == []
    tools = counts(tmp_path / TOOL_LOG)
    assert sorted(tools) == sorted(f"{tag(q)}-{turn}" for q in QUESTIONS for turn in range(ROUNDS))
    assert set(tools.values()) == {1}, "a completed tool call was made again"


@pytest.mark.usefixtures("cluster")
def test_a_ray_run_stuck_in_a_call_past_the_grace_is_cancelled_checkpointed_free_and_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while one run waits on a call that never returns: its task is cancelled after the grace.

    It is reported ``cancelled`` from its checkpoint, nobody holds it, and
    the next pass makes only that call again.
    """
    monkeypatch.setattr(on_ray, "GRACE", 0.5)
    (tmp_path / "stuck.flag").touch()
    make = functools.partial(stuck_agent, str(tmp_path))
    store = str(tmp_path / "runs.db")
    token, seen = CancelToken(), dict[int, RunResult]()
    for item, result in iter_batch(make, STUCK, store=store, cancel=token, max_in_flight=3, lease=LONG_LEASE):
        seen[item.index] = result
        if len(seen) == 2:
            # Its actor may start it only after the others have ended (a slow actor start on a busy machine):
            # cancelled before it began, it would rightly end "not started", which is not what this test holds.
            wait_for_call(tmp_path, "start 1-1")
            token.cancel("enough")
    assert sorted(seen) == [0, 1, 2]
    assert [seen[i].reason for i in (0, 1, 2)] == ["done", "cancelled", "done"], seen[1].evidence
    assert seen[1].snapshot is not None
    stuck = batch_items(STUCK)[1].run_id
    with open_store(store) as opened:
        data = opened.load(stuck)
    assert (data["state"], data.get("reason")) == ("Failed", "cancelled")
    assert lease_free(store, stuck), "the cancelled run's lease was kept"

    (tmp_path / "stuck.flag").unlink()
    again = run_batch(make, STUCK, store=store, lease=LONG_LEASE, progress=False, max_in_flight=3)
    assert [r.final for r in again] == [f"answer to {q}" for q in STUCK], [r.evidence for r in again]
    made = calls(tmp_path)
    assert made["start 1-1"] == 2  # the call in flight, made again
    assert {line: n for line, n in made.items() if line != "start 1-1"} == {
        f"{edge} {q}-{t}": 1
        for edge in ("start", "end")
        for q in (0, 1, 2)
        for t in (0, 1)
        if (q, t, edge) != (1, 1, "start")
    }
