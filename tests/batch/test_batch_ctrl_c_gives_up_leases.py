"""Ctrl-C on the ``batch`` command (``--local``), on SQLite and PostgreSQL: runs left ``cancelled``, leases given up.

The command exits 130; every run it began is either over or
``Failed``/``cancelled`` in the store and free for anyone to take at once,
so the same command run again finishes the batch, and no tool call that
completed is made again (the stop was gentle: each run stopped at a check).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.batch_agents import MODEL_LOG, TOOL_LOG, counts, lines
from support.batch_leases import lease_free

from fsm_agent.batch import batch_items
from fsm_agent.persist import open_store

pytestmark = pytest.mark.subprocess

TESTS = Path(__file__).resolve().parent.parent
QUESTIONS = [f"question {i}" for i in range(30)]
LONG_LEASE = 300.0


def _interruptible() -> None:
    """Ctrl-C's default action in the child: a suite started in the background ignores SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _command(tmp_path: Path, store: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fsm_agent", "batch", str(tmp_path / "in.jsonl"),
            "--agent", "support.batch_agents:cli_agent", "--store", store, "--local",
            "--out", str(tmp_path / "out.jsonl"), *extra]  # fmt: skip


def test_ctrl_c_leaves_every_begun_run_over_or_cancelled_and_free_and_the_same_command_finishes(
    store_target: str, tmp_path: Path
) -> None:
    """SIGINT mid-batch: exit 130; the store holds no live lease; the rerun ends every run done, calls made once."""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    env = {**os.environ, "PYTHONPATH": str(TESTS), "BATCH_LEDGER": str(tmp_path), "BATCH_LATENCY": "0.05"}
    batch = subprocess.Popen([*_command(tmp_path, store_target), "--max-in-flight", "4"], env=env,
                             stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible)  # fmt: skip
    deadline = time.monotonic() + 60
    while len(lines(tmp_path / MODEL_LOG)) < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    batch.send_signal(signal.SIGINT)
    _, err = batch.communicate(timeout=60)
    assert batch.returncode == 130, err
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(written) < len(QUESTIONS)
    assert all(row["reason"] == "done" for row in written)

    begun = []
    with open_store(store_target) as store:
        for item in batch_items(QUESTIONS):
            try:
                data = store.load(item.run_id)
            except KeyError:
                continue
            begun.append(item.run_id)
            assert data["state"] == "Done" or (data["state"], data.get("reason")) == ("Failed", "cancelled"), data
    assert begun
    assert [run_id for run_id in begun if not lease_free(store_target, run_id)] == [], "a lease outlived the command"
    assert set(counts(tmp_path / TOOL_LOG).values()) <= {1}

    again = subprocess.run(_command(tmp_path, store_target, "--quiet"), env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(row["index"] for row in rows) == list(range(len(QUESTIONS)))
    assert {row["reason"] for row in rows} == {"done"}
    tools = counts(tmp_path / TOOL_LOG)
    assert len(tools) == len(QUESTIONS) * 3
    assert set(tools.values()) == {1}, "a completed tool call was made again"
