"""The ``runs`` commands in a shell while another process runs a stored run and saves it as it goes.

The other process is a real Python child over the same SQLite file.  Its
tool appends each call id it completes to a file, so a call made twice
shows as two lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.ui_runs import finished

from fsm_agent import Agent, SqliteStore
from fsm_agent.testing import FakeModel, demo_registry, tool_call, tool_turn

pytestmark = pytest.mark.subprocess

TESTS = Path(__file__).resolve().parents[1]

CHILD = """
import sys, time
from pathlib import Path
from fsm_agent import Agent, SqliteStore, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

db, folder, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
tools = ToolRegistry()

@tools.register
def post(text: str, call_id: str) -> str:
    \"\"\"Post a note; waits for the go file first.\"\"\"
    (folder / "entered").touch()
    deadline = time.monotonic() + 60
    while not (folder / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(folder / "calls", "a", encoding="utf-8") as calls:
        calls.write(call_id + "\\n")
    return "posted"

store = SqliteStore(db)
if mode == "start":
    model = FakeModel(tool_turn(tool_call("post", id="n1", text="hello")), reply("posted it"))
    Agent(model, tools).run("post hello", store=store, run_id="live")
else:  # resume the paused run "waiting", approving its call
    model = FakeModel(reply("posted after approval"))
    agent = Agent(model, tools, approve={"post"})
    agent.resume(store.load("waiting"), approvals={"n1": True}, store=store).finish()
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m fsm_agent ARGS`` in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "fsm_agent", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, env=env)


def child(db: Path, folder: Path, mode: str) -> subprocess.Popen[str]:
    """The other process: runs ``live`` (``start``) or resumes ``waiting`` (``resume``), its tool held on ``go``."""
    return subprocess.Popen([sys.executable, "-c", CHILD, str(db), str(folder), mode], text=True)


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def calls(folder: Path) -> list[str]:
    path = folder / "calls"
    return path.read_text(encoding="utf-8").split() if path.exists() else []


def test_runs_show_list_and_export_read_a_run_another_process_is_running_and_leave_it_to_finish(
    tmp_path: Path,
) -> None:
    """Mid-call in the other process: shown as where it is, reason running, listed, exported; then it ends whole."""
    db = tmp_path / "runs.db"
    SqliteStore(db).close()
    running = child(db, tmp_path, "start")
    try:
        wait_for(tmp_path / "entered")
        shown = cli("runs", "show", "live", "--store", str(db))
        listed = cli("runs", "list", "--store", str(db))
        exported = cli("runs", "export", "live", "--out", str(tmp_path / "live.json"), "--store", str(db))
        pruned = cli("runs", "prune", "--older-than", "0", "--store", str(db))
        (tmp_path / "go").touch()
        assert running.wait(60) == 0
    finally:
        (tmp_path / "go").touch()
        running.wait(60)
    assert shown.returncode == 0, shown.stderr
    # Where its last checkpoint left it (written around calls, not at every transition): not over, no reason yet.
    state = shown.stdout.splitlines()[0].removeprefix("run live: ").removesuffix(", reason running")
    assert state in ("AwaitModel", "CheckTruncation", "Dispatch", "ExecuteTool"), shown.stdout
    assert [line.split("\t")[:3] for line in listed.stdout.splitlines()] == [["live", state, "-"]]
    assert exported.returncode == 0, exported.stderr
    assert pruned.stdout == "deleted 0 finished runs\n"
    assert calls(tmp_path) == ["n1"]
    with SqliteStore(db) as store:
        ended = store.load("live")
    assert (ended["state"], ended["final"]) == ("Done", "posted it")


def test_runs_list_pages_followed_while_another_process_resumes_a_run_list_every_run_once(tmp_path: Path) -> None:
    """Page 1, then the other process resumes an older paused run to its end, then the pages "more runs" names."""
    db = tmp_path / "runs.db"
    with SqliteStore(db) as store:
        held = FakeModel(tool_turn(tool_call("post", id="n1", text="hello")))
        registry = demo_registry()

        @registry.register
        def post(text: str) -> str:
            """Never called here (the call waits for approval)."""
            raise AssertionError(text)

        assert Agent(held, registry, approve={"post"}).run("post", store=store, run_id="waiting").reason == "paused"
        for n in range(4):
            finished(store, f"answered-{n}")
        every = {run.run_id for run in store.list_runs()}
    seen: list[str] = []
    offset = 0
    (tmp_path / "go").touch()
    while True:
        page = cli("runs", "list", "--limit", "2", "--offset", str(offset), "--store", str(db))
        assert page.returncode == 0, page.stderr
        seen.extend(line.split("\t")[0] for line in page.stdout.splitlines())
        if offset == 0:  # between the first page and the next, the other process takes the paused run on
            assert child(db, tmp_path, "resume").wait(60) == 0
        if not page.stderr:
            break
        offset = int(page.stderr.rsplit(" ", 1)[1])
    assert calls(tmp_path) == ["n1"]
    assert sorted(seen) == sorted(every), seen
