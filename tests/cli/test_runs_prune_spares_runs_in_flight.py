"""``runs prune --older-than AGE`` as a process: only finished runs last saved longer ago than AGE go.

docs/reference/cli.md: "Delete the finished (Done or Failed) runs last saved
longer ago than --older-than."  A run paused for approval, or one still in
flight (a process holds it), is never deleted, however old its last save;
a finished run saved more recently than AGE stays too.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.ui_runs import GatedModel, finished, paused, stopped

from fsm_agent import Agent, SqliteStore
from fsm_agent.testing import demo_registry, reply, tool_call, tool_turn

pytestmark = pytest.mark.subprocess

DAY = 86400.0


def backdate(db: Path, run_id: str, days: float) -> None:
    """Make the run's last save ``days`` ago, as if it had been saved then."""
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE runs SET updated = ? WHERE run_id = ?", (time.time() - days * DAY, run_id))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m fsm_agent ARGS`` in a process of its own."""
    command = [sys.executable, "-m", "fsm_agent", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_prune_deletes_only_finished_runs_older_than_asked(tmp_path: Path) -> None:
    """Old Done and old Failed go; a recent Done, an old paused run and an old run in flight stay, and goes on."""
    db = tmp_path / "runs.db"
    with SqliteStore(db) as store:
        finished(store, "old-done")
        stopped(store, "old-failed")
        finished(store, "new-done")
        paused(store, [], "old-paused")
        model = GatedModel([tool_turn(tool_call("add", a=1, b=2)), reply("three")])
        agent = Agent(model, demo_registry())
        outcome: list[object] = []
        thread = threading.Thread(
            target=lambda: outcome.append(agent.run("go", store=store, run_id="old-in-flight")), daemon=True
        )
        thread.start()
        deadline = time.monotonic() + 30
        while not any(run.run_id == "old-in-flight" for run in store.list_runs()):
            assert time.monotonic() < deadline, "the run in flight was never stored"
            time.sleep(0.02)
        for run_id in ("old-done", "old-failed", "old-paused", "old-in-flight"):
            backdate(db, run_id, 10)
        backdate(db, "new-done", 1)
        try:
            pruned = cli("runs", "prune", "--older-than", "7d", "--store", str(db))
        finally:
            model.release(2)
            thread.join(30)
        assert (pruned.returncode, pruned.stdout, pruned.stderr) == (0, "deleted 2 finished runs\n", "")
        left = {run.run_id: run.state for run in store.list_runs()}
        assert left == {"old-in-flight": "Done", "old-paused": "ExecuteTool", "new-done": "Done"}
        assert [getattr(result, "final", None) for result in outcome] == ["three"]
        again = cli("runs", "prune", "--older-than", "7d", "--store", str(db))
        assert (again.returncode, again.stdout) == (0, "deleted 0 finished runs\n")
