"""A tool that calls ``sys.exit`` in one run of a batch: the batch stops as at a Ctrl-C, and no run stays leased.

On the local executor the ``SystemExit`` reaches the caller (the program
asked to exit), after the other runs in flight stopped at their next check,
checkpointed and free; the exiting run is left as a Ctrl-C in a call leaves
it (written, unfinished, its lease left to lapse), and a rerun finishes it.
On Ray the exit came from a worker: that run is an ``error``, the batch goes on.
"""

from __future__ import annotations

import functools
import gc
import logging
from pathlib import Path

import pytest
from support.batch_agents import TOOL_LOG, counts, factory, tag
from support.batch_audit import EXITED, exiting_agent
from support.batch_leases import PROBE_LEASE, lease_free

from fsm_agent.batch import batch_items, run_batch
from fsm_agent.persist import open_store

QUESTIONS = [f"question {i}" for i in range(4)]


def _destroyed_pending(caplog: pytest.LogCaptureFixture) -> list[str]:
    gc.collect()  # a task destroyed pending is reported as it is collected
    return [r.getMessage() for r in caplog.records if "destroyed but it is pending" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.parametrize("paired", [False, True], ids=["one-call", "parallel-calls"])
def test_a_tool_calling_sys_exit_leaves_no_run_of_the_local_batch_leased(
    paired: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The exit is raised; the other runs are ``cancelled`` and free; the exiting one is unfinished, its call unmade."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    store = str(tmp_path / "runs.db")
    make = functools.partial(exiting_agent, str(tmp_path), QUESTIONS[0], paired)
    # The lease outlasts the test: a lease not given up is still live when probed.
    with pytest.raises(SystemExit) as exited:
        run_batch(make, QUESTIONS, store=store, executor="local", max_in_flight=4, progress=False, lease=PROBE_LEASE)
    assert exited.value.code == 3
    assert (tmp_path / EXITED).exists()
    items = batch_items(QUESTIONS)
    with open_store(store) as opened:
        stored = [opened.load(item.run_id) for item in items]
    assert [(data["state"], data["reason"]) for data in stored[1:]] == [("Failed", "cancelled")] * 3
    assert all("SystemExit" in data["evidence"]["why"] for data in stored[1:])
    assert [i for i in range(1, 4) if not lease_free(store, items[i].run_id)] == [], "runs left leased"
    # The exiting run: as a Ctrl-C in a call leaves a run, written at the call, its lease left to lapse.
    assert stored[0]["state"] == "ExecuteTool"
    assert f"{tag(QUESTIONS[0])}-1" in [call["id"] for call in stored[0]["pending"]]
    assert not lease_free(store, items[0].run_id)
    assert f"{tag(QUESTIONS[0])}-1" not in counts(tmp_path / TOOL_LOG)
    assert _destroyed_pending(caplog) == []


@pytest.mark.slow
def test_a_rerun_after_a_tool_exited_takes_the_cut_run_over_once_its_lease_lapsed(tmp_path: Path) -> None:
    """Every run ends ``done``, and no call that completed before the exit is made again."""
    store = str(tmp_path / "runs.db")
    make = functools.partial(exiting_agent, str(tmp_path), QUESTIONS[0])
    with pytest.raises(SystemExit):
        run_batch(make, QUESTIONS, store=store, executor="local", max_in_flight=4, progress=False, lease=1.0)
    again = run_batch(factory(tmp_path), QUESTIONS, store=store, executor="local", progress=False, lease=1.0)
    assert [r.final for r in again] == [f"answer to {q}" for q in QUESTIONS]
    made = counts(tmp_path / TOOL_LOG)
    assert sorted(made) == sorted(f"{tag(q)}-{turn}" for q in QUESTIONS for turn in range(3))
    assert set(made.values()) == {1}, "a completed tool call was made again"


@pytest.mark.ray
@pytest.mark.usefixtures("cluster")
@pytest.mark.parametrize("paired", [False, True], ids=["one-call", "parallel-calls"])
def test_a_tool_calling_sys_exit_on_ray_is_that_runs_error_and_the_batch_goes_on(tmp_path: Path, paired: bool) -> None:
    """The exit came from a worker, not the program: that run is an ``error`` left unfinished; the others end done.

    Also from one call of a parallel batch, which would end the worker's event loop were it raised out of the
    call's own task (the other runs on that worker then never returning).
    """
    store = str(tmp_path / "runs.db")
    make = functools.partial(exiting_agent, str(tmp_path), QUESTIONS[0], paired)
    results = run_batch(make, QUESTIONS, store=store, max_in_flight=4, progress=False, lease=PROBE_LEASE)
    assert [r.reason for r in results] == ["error", "done", "done", "done"]
    assert results[0].evidence["type"] == "SystemExit"
    assert "left unfinished" in results[0].evidence["error"]
    items = batch_items(QUESTIONS)
    with open_store(store) as opened:
        assert opened.load(items[0].run_id)["state"] == "ExecuteTool"
    assert [i for i in range(1, 4) if not lease_free(store, items[i].run_id)] == []
