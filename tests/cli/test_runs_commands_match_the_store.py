"""``runs show``, ``runs list`` and ``runs resume`` as processes, checked against what the store holds.

- ``runs show`` prints every transition (numbered as ``runs fork --at`` takes
  them), the evidence, and each pending call with where its decision stands.
- ``runs list`` pages, with and without filters, give exactly the store's
  ``list_runs(order="created")`` rows, each once, and say where the next
  page starts (a cursor, or the next offset for a page asked by offset).
- ``runs resume`` of a run another process holds is refused in one line
  naming the holder (exit 1), and changes nothing.
- Exit codes as docs/reference/cli.md states them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.fork_agents import make_careful
from support.ui_runs import finished, live, paused, stopped

from fsm_agent import SqliteStore
from fsm_agent.cli.terminal import printable
from fsm_agent.persist.cursor import RunCursor

pytestmark = pytest.mark.subprocess

TESTS = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m fsm_agent ARGS`` in a process of its own, able to import this suite's ``support`` package."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "fsm_agent", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, env=env)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store with a stopped, a finished and a paused run, and seven more that answered."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        stopped(store)
        finished(store)
        paused(store, [])
        for i in range(7):
            finished(store, f"more-{i}")
    return path


def test_runs_show_prints_every_transition_and_the_evidence(db: Path) -> None:
    """One numbered line per stored transition, with its guard or reason, then the evidence as stored."""
    with SqliteStore(db) as store:
        data = store.load("stopped")
    shown = cli("runs", "show", "stopped", "--store", str(db))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "run stopped: Failed, reason max_steps"
    edges = [line for line in lines if line.startswith("  ")]
    expected = []
    for i, edge in enumerate(data["trace"]):
        label = edge["reason"] or edge["guard"]
        expected.append(f"  {i:3} {edge['source']} -> {edge['dest']}" + (f" [{label}]" if label else ""))
    assert edges == expected
    evidence = next(line for line in lines if line.startswith("evidence: "))
    assert json.loads(evidence.removeprefix("evidence: ")) == json.loads(json.dumps(data["evidence"]))


def test_runs_show_of_a_paused_run_names_each_pending_call_and_its_decision(db: Path) -> None:
    """The pending call with its arguments, awaiting a decision; once approved, approved."""
    before = cli("runs", "show", "paused", "--store", str(db))
    assert before.returncode == 0, before.stderr
    assert before.stdout.splitlines()[0] == "run paused: awaiting approval, reason paused"
    pending = before.stdout.split("pending:\n", 1)[1].splitlines()[0]
    assert pending.startswith("  send_email (call_mail) ")
    assert json.loads(pending.split(") ", 1)[1].rsplit(": ", 1)[0]) == {"to": "boss@example.com", "body": "the report"}
    assert pending.endswith(": awaiting a decision")
    with SqliteStore(db) as store:
        store.decide("paused", "call_mail", True)
    after = cli("runs", "show", "paused", "--store", str(db))
    assert after.stdout.split("pending:\n", 1)[1].splitlines()[0].endswith(": approved")


def listed(out: str) -> list[list[str]]:
    return [line.split("\t") for line in out.splitlines()]


@pytest.mark.parametrize("paging", ["after", "offset"])
@pytest.mark.parametrize("filters", [(), ("--reason", "done"), ("--state", "Done")])
def test_runs_list_pages_give_the_store_s_rows_each_once(db: Path, filters: tuple[str, ...], paging: str) -> None:
    """Pages of three, following "more runs: --after CURSOR" (or "--offset N"), walk the listing in order, each once."""
    with SqliteStore(db) as store:
        state = filters[1] if filters[:1] == ("--state",) else None
        reason = filters[1] if filters[:1] == ("--reason",) else None
        rows = store.list_runs(state=state, reason=reason, order="created")
    seen: list[list[str]] = []
    start = ["--offset", "0"] if paging == "offset" else []
    while True:
        page = cli("runs", "list", *filters, "--limit", "3", *start, "--store", str(db))
        assert page.returncode == 0, page.stderr
        seen.extend(listed(page.stdout))
        if not page.stderr:
            break
        last = seen[-1][0]
        if paging == "offset":
            assert page.stderr == f"more runs: --offset {len(seen)}\n"
        else:
            cursor = next(RunCursor.of(run) for run in rows if run.run_id == last)
            assert page.stderr == f"more runs: --after {cursor}\n"
        start = page.stderr.removeprefix("more runs: ").split()
    assert [row[0] for row in seen] == [run.run_id for run in rows]
    for row, run in zip(seen, rows, strict=True):
        calls = f"{run.tool_calls} tool call{'' if run.tool_calls == 1 else 's'}"
        state_shown = "awaiting approval" if run.paused else run.state
        assert row[1:5] == [state_shown, run.reason or "-", calls, f"{run.tokens} tokens"]


def test_runs_resume_of_a_run_another_process_holds_is_refused_in_one_line(tmp_path: Path) -> None:
    """While a run goes on in this process, ``runs resume`` elsewhere exits 1 naming the lease; the run is untouched."""
    db = tmp_path / "runs.db"
    with SqliteStore(db) as store:
        model, thread = live(store)
        deadline = time.monotonic() + 30
        while not any(run.run_id == "live" for run in store.list_runs()):
            assert time.monotonic() < deadline, "the live run was never stored"
            time.sleep(0.02)
        before = store.load("live")
        refused = cli("runs", "resume", "live", "--agent", "support.fork_agents:make", "--quiet", "--store", str(db))
        assert refused.returncode == 1
        assert refused.stdout == ""
        line = refused.stderr.strip()
        assert "\n" not in line
        assert line.startswith("error: run 'live' is being advanced by ")
        assert "lease until" in line
        assert line.endswith(
            "if that owner is gone (a crash, a Ctrl-C), its lease lapses then and the run can be taken over"
        )
        assert store.load("live")["trace"] == before["trace"]
        model.release(3)
        thread.join(30)
        assert not thread.is_alive()
        assert store.load("live")["final"] == "done at last"


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("runs", "show", "stopped"), 0),
        (("runs", "show", "nowhere"), 1),
        (("runs", "list", "--limit", "0"), 1),
        (("runs", "list", "--state", "Sleeping"), 1),
        (("runs", "export", "nowhere", "--out", "-"), 1),
        (("runs", "resume", "finished", "--agent", "support.fork_agents:make", "--quiet"), 1),
        (("runs", "resume", "paused", "--agent", "support.ui_runs:nothing_here", "--quiet"), 1),
        (("runs", "fork", "finished", "--at", "99", "--agent", "support.fork_agents:make", "--quiet"), 1),
        (("runs", "prune", "--older-than", "soon"), 1),
    ],
)
def test_runs_exit_codes_are_as_the_reference_says(db: Path, args: tuple[str, ...], code: int) -> None:
    """0 done; 1 a set-up or usage error, one line on stderr naming what is at fault."""
    answered = cli(*args, "--store", str(db))
    assert answered.returncode == code, answered.stderr
    if code == 1:
        assert len(answered.stderr.strip().splitlines()) == 1, answered.stderr
        assert answered.stderr.startswith("error: ")


def test_runs_resume_of_a_paused_run_without_a_decision_exits_2_naming_the_call(tmp_path: Path) -> None:
    """A call still waiting for a decision keeps the run paused: exit 2, the call named (cli.md, notes)."""
    db = tmp_path / "runs.db"
    with SqliteStore(db) as store:
        make_careful().run("what is 2 + 3?", store=store, run_id="careful")
        assert store.load("careful")["paused"]
    agent = ("--agent", "support.fork_agents:make_careful", "--quiet")
    held = cli("runs", "resume", "careful", *agent, "--store", str(db))
    assert held.returncode == 2, held.stderr
    assert "call_0" in held.stderr
    approved = cli("runs", "resume", "careful", "--approve", "call_0", *agent, "--store", str(db))
    assert approved.returncode == 0, approved.stderr
    assert printable(approved.stdout.strip()) == "the sum is 5"
