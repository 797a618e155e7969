"""A local batch whose whole process dies mid-batch, on SQLite and PostgreSQL: the next pass takes its runs over.

The batch runs in a child process; one tool call ends that process
(``os._exit``) while the batch has four runs in flight, so nothing is
given back: every lease it held must lapse.  The next pass, here, waits
those leases out and finishes every run.  The runs that had ended are
returned from the store without a call; in the others no completed call is
made again, but for a call in flight at the crash (at most one per run in
flight).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.batch_agents import MODEL_LOG, TOOL_LOG, counts, factory, tag
from support.store_cases import child_process

from fsm_agent.batch import batch_items, run_batch
from fsm_agent.persist import open_store

pytestmark = pytest.mark.subprocess

LEASE = 1.0
"""Seconds a dead process's leases outlive it: short, so the test stays quick."""

IN_FLIGHT = 4
QUESTIONS = [f"question {i}" for i in range(16)]
DOOMED = frozenset({f"{tag(QUESTIONS[9])}-1"})
"""The call that ends the batch's process: the tenth run's second tool call."""


def _crashing_batch(target: str, ledger: str) -> None:
    """The batch process: dies with ``DOOMED`` in flight (``os._exit`` in the tool)."""
    run_batch(factory(Path(ledger), kill=DOOMED, latency=0.01), QUESTIONS, store=target, executor="local",
              max_in_flight=IN_FLIGHT, lease=LEASE, progress=False)  # fmt: skip


def test_a_crashed_batch_process_leaves_runs_the_next_pass_takes_over_after_their_leases(
    store_target: str, tmp_path: Path
) -> None:
    """Every run ends done; the ended ones make no call; a completed call repeats only if it was in flight."""
    child = child_process(_crashing_batch, store_target, str(tmp_path))
    child.start()
    child.join(120)
    assert child.exitcode == 1, "the batch process died in the doomed call"
    assert (tmp_path / f"killed-{next(iter(DOOMED))}").exists()
    items = batch_items(QUESTIONS)
    with open_store(store_target) as store:
        ended = set()
        for item in items:
            try:
                state = store.load(item.run_id)["state"]
            except KeyError:
                continue
            if state in ("Done", "Failed"):
                ended.add(item.index)
    assert 9 not in ended
    before_model, before_tools = counts(tmp_path / MODEL_LOG), counts(tmp_path / TOOL_LOG)

    results = run_batch(factory(tmp_path, kill=DOOMED), QUESTIONS, store=store_target, executor="local",
                        max_in_flight=IN_FLIGHT, lease=LEASE, progress=False)  # fmt: skip

    assert [r.evidence for r in results if not r.ok] == []
    assert [r.final for r in results] == [f"answer to {q}" for q in QUESTIONS]
    model, tools = counts(tmp_path / MODEL_LOG), counts(tmp_path / TOOL_LOG)
    # The runs that had ended: not one call more.
    for index in ended:
        key = tag(QUESTIONS[index])
        assert {k: n for k, n in model.items() if k.startswith(key)} == {
            k: n for k, n in before_model.items() if k.startswith(key)
        }
    # Every call completed, each once, but for at most one call in flight per run the process had in flight.
    assert sorted(tools) == sorted(f"{tag(q)}-{turn}" for q in QUESTIONS for turn in range(3))
    assert tools[next(iter(DOOMED))] == 1
    assert sum(n - 1 for n in tools.values()) <= IN_FLIGHT - 1
    assert all(tools[call] == n for call, n in before_tools.items() if n == 1 and call.startswith(tag(QUESTIONS[9])))
