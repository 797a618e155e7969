"""The viewer's fork endpoints: re-run from a transition, two runs compared, a run saved as a test."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs the extra: there a missing one fails the import below
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

from starlette.testclient import TestClient
from support.fork_agents import ADDED, AFTER_THE_CALL, BEFORE_THE_CALL, make, make_twice, source_run

from fsm_agent import Agent, SqliteStore
from fsm_agent.ui import create_app
from fsm_agent.ui.app import viewer_mode
from fsm_agent.ui.forks import NO_AGENT

BASE = "http://127.0.0.1:8765"
JSON = {"content-type": "application/json"}
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    """A store holding one finished run, ``source``, that called ``add`` once; ``ADDED`` cleared after it."""
    with SqliteStore(tmp_path / "runs.db") as opened:
        source_run(opened)
        ADDED.clear()
        yield opened


def client(store: Any, agent: Agent | None = None, spec: str | None = None) -> TestClient:
    """A test client for a viewer over ``store`` that re-runs with ``agent``, if given."""
    return TestClient(create_app(store, agent=agent, agent_spec=spec), base_url=BASE)


def rerun(viewer: TestClient, run_id: str, at: object) -> Any:
    """POST a re-run of ``run_id`` from transition ``at``, as the page sends it."""
    return viewer.post("/api/fork", params={"id": run_id}, json={"at": at}, headers={"origin": BASE})


def finished(viewer: TestClient, run_id: str) -> dict[str, Any]:
    """The run's page once its fork thread has driven it to its end (at most 15 s)."""
    deadline = time.monotonic() + 15
    while (page := viewer.get("/api/run", params={"id": run_id}).json())["live"]:
        assert time.monotonic() < deadline, f"the fork {run_id} never finished"
        time.sleep(0.02)
    return page  # type: ignore[no-any-return]


# --- re-run from here ----------------------------------------------------------------------------------


def test_a_rerun_after_a_completed_call_does_not_make_it_again(store: SqliteStore) -> None:
    """Forked after its add call, the fork finishes with the call's result and the tool is not executed."""
    viewer = client(store, make())
    answer = rerun(viewer, "source", AFTER_THE_CALL)
    assert answer.status_code == 201
    fork = answer.json()
    assert (fork["source"], fork["at"]) == ("source", AFTER_THE_CALL)
    page = finished(viewer, fork["run_id"])
    assert (page["state"], page["final"], page["forked_from"]) == ("Done", "the sum is 5", ["source", AFTER_THE_CALL])
    assert ADDED == []
    listed = {run["run_id"]: run["forked_from"] for run in viewer.get("/api/runs").json()["runs"]}
    assert listed == {"source": None, fork["run_id"]: ["source", AFTER_THE_CALL]}


def test_a_rerun_before_the_call_reuses_the_source_s_result(store: SqliteStore) -> None:
    """Forked before its add call, the fork's call takes the recorded result (reused_from) instead of running."""
    viewer = client(store, make())
    fork = rerun(viewer, "source", BEFORE_THE_CALL).json()
    finished(viewer, fork["run_id"])
    steps = store.load(fork["run_id"])["steps"]
    assert [step.get("reused_from") for step in steps if step["kind"] == "tool_call"] == ["source/call_0"]
    assert ADDED == []


def test_without_an_agent_the_viewer_says_how_to_rerun_and_refuses(store: SqliteStore) -> None:
    """The config says re-runs are off and why; a re-run is 403 with that reason and stores nothing."""
    viewer = client(store)
    config = viewer.get("/api/config").json()
    assert (config["can_fork"], config["fork_refusal"]) == (False, NO_AGENT)
    assert "--agent MODULE:FUNCTION" in NO_AGENT
    refused = rerun(viewer, "source", AFTER_THE_CALL)
    assert (refused.status_code, refused.json()["error"]) == (403, NO_AGENT)
    assert [run.run_id for run in store.list_runs()] == ["source"]
    assert client(store, make()).get("/api/config").json()["can_fork"] is True


@pytest.mark.parametrize(
    ("decisions", "agent", "mode"),
    [
        (False, False, "read-only"),
        (True, False, "decisions allowed"),
        (False, True, "re-runs allowed"),
        (True, True, "decisions and re-runs allowed"),
    ],
)
def test_the_viewer_is_called_read_only_only_when_it_neither_decides_nor_reruns(
    store: SqliteStore, decisions: bool, agent: bool, mode: str
) -> None:
    """A viewer built with an agent stores forks, so its header never says read-only; the command says the same."""
    assert viewer_mode(decisions, agent) == mode
    app = create_app(store, allow_decisions=decisions, hosts=["testserver"], agent=make() if agent else None)
    assert TestClient(app).get("/api/config").json()["mode"] == mode


def test_a_rerun_must_be_json_from_the_viewer_s_origin_with_a_transition_number(store: SqliteStore) -> None:
    """A form post is 415, another origin 403, a bad at 400, no run 404, a transition past the end 409."""
    viewer = client(store, make())
    assert viewer.post("/api/fork", params={"id": "source"}, data={"at": "3"}).status_code == 415
    foreign = {"origin": "https://attacker.example"} | JSON
    assert viewer.post("/api/fork", params={"id": "source"}, json={"at": 3}, headers=foreign).status_code == 403
    for at in (-1, True, "3", 1.5, None):
        assert rerun(viewer, "source", at).status_code == 400, at
    assert viewer.post("/api/fork", params={"id": "source"}, json={}, headers=JSON).status_code == 400
    assert rerun(viewer, "nope", 1).status_code == 404
    past = rerun(viewer, "source", 99)
    assert past.status_code == 409
    assert "transition 99" in past.json()["error"]
    assert [run.run_id for run in store.list_runs()] == ["source"]
    assert ADDED == []


def test_an_agent_on_any_host_is_refused() -> None:
    """With every Host answered a rebound page could re-run: an agent needs named hosts, as decisions do."""
    with pytest.raises(ValueError, match="agent needs the host names"):
        create_app(object(), agent=make(), hosts=None)  # type: ignore[arg-type]


# --- compare ---------------------------------------------------------------------------------------------


def test_compare_marks_the_first_edge_and_message_where_a_fork_left_its_source(store: SqliteStore) -> None:
    """A fork that calls add once more parts from its source at the edge into ExecuteTool, and at that reply."""
    viewer = client(store, make_twice())
    fork = rerun(viewer, "source", AFTER_THE_CALL).json()["run_id"]
    finished(viewer, fork)
    body = viewer.get("/api/compare", params={"a": "source", "b": fork}).json()
    a, b = body["a"], body["b"]
    assert (a["run_id"], b["run_id"], b["forked_from"]) == ("source", fork, ["source", AFTER_THE_CALL])
    first = body["first_edge"]
    assert [e["dest"] for e in a["edges"][first:]] == ["Done"]
    assert [e["dest"] for e in b["edges"][first : first + 1]] == ["ExecuteTool"]
    assert [e["dest"] for e in a["edges"][:first]] == [e["dest"] for e in b["edges"][:first]]
    message = body["first_message"]
    assert a["messages"][:message] == b["messages"][:message]
    assert (a["messages"][message]["content"], b["messages"][message]["tool_calls"][0]["id"]) == (
        "the sum is 5",
        "call_1",
    )
    assert (b["final"], ADDED) == ("twice: 6", [(3, 3)])


def test_compare_of_a_run_with_itself_finds_no_difference_and_of_a_missing_run_is_404(store: SqliteStore) -> None:
    """Equal runs have no first difference; a run not in the store is named in a 404."""
    viewer = client(store)
    same = viewer.get("/api/compare", params={"a": "source", "b": "source"}).json()
    assert (same["first_edge"], same["first_message"]) == (None, None)
    missing = viewer.get("/api/compare", params={"a": "source", "b": "gone"})
    assert (missing.status_code, missing.json()["error"]) == (404, "no run 'gone' in this store")
    assert viewer.get("/compare", params={"a": "source", "b": "source"}).status_code == 200


# --- save as test -----------------------------------------------------------------------------------------


def saved(viewer: TestClient, run_id: str) -> zipfile.ZipFile:
    """The zip "Save as test" downloads for ``run_id``."""
    answer = viewer.get("/api/test", params={"id": run_id})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/zip"
    return zipfile.ZipFile(io.BytesIO(answer.content))


@pytest.mark.subprocess
def test_a_run_saved_as_a_test_replays_green_with_the_viewer_s_agent(store: SqliteStore, tmp_path: Path) -> None:
    """The zip's pytest file imports the --agent factory and passes against the recording beside it."""
    archive = saved(client(store, make(), "support.fork_agents:make"), "source")
    assert sorted(archive.namelist()) == ["recordings/test_source.json", "test_source.py"]
    text = archive.read("test_source.py").decode("utf-8")
    assert "from support.fork_agents import make" in text
    assert "FILL IN" not in text
    archive.extractall(tmp_path / "saved")
    outcome = pytest_in(tmp_path / "saved")
    assert outcome.returncode == 0, outcome.stdout
    assert "1 passed" in outcome.stdout
    assert ADDED == []  # replayed: the tool's recorded result came back, the tool was not run


@pytest.mark.subprocess
def test_without_an_agent_the_saved_test_marks_the_line_to_fill_in(tmp_path: Path) -> None:
    """No --agent: the file says FILL IN and, run as it is, fails with that message; a hostile id stays text."""
    run_id = 'x"""\nimport os; os.exit(3)  # \u202e'
    with SqliteStore(tmp_path / "runs.db") as opened:
        source_run(opened, run_id)
        archive = saved(client(opened), run_id)
    name = "test_x_import_os_os_exit_3"
    assert sorted(archive.namelist()) == [f"recordings/{name}.json", f"{name}.py"]
    text = archive.read(f"{name}.py").decode("utf-8")
    assert "# FILL IN: return the agent that made this run" in text
    assert f"RUN_ID = {run_id!r}" in text
    archive.extractall(tmp_path / "saved")
    outcome = pytest_in(tmp_path / "saved")
    assert outcome.returncode == 1, outcome.stdout
    assert "NotImplementedError: fill in make_agent() with the agent that made run" in outcome.stdout


def test_saving_a_run_not_in_the_store_is_404(store: SqliteStore) -> None:
    """No such run: 404 naming it, no zip."""
    answer = client(store).get("/api/test", params={"id": "gone"})
    assert (answer.status_code, answer.json()["error"]) == (404, "no run 'gone' in this store")


def pytest_in(folder: Path) -> subprocess.CompletedProcess[str]:
    """Run pytest on ``folder`` in a child process that can import this suite's ``support`` package."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)]
    return subprocess.run(command, capture_output=True, text=True, cwd=folder, env=env, timeout=120, check=False)


def test_ui_with_an_agent_that_cannot_be_imported_is_one_line(
    store: SqliteStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """ui --agent naming no importable module is exit 1 with one line naming the flag, nothing served."""
    from fsm_agent.__main__ import main as cli

    assert cli(["ui", "--store", str(store.path), "--agent", "no_such_module_here:make"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ui: --agent: cannot import 'no_such_module_here'"), err
    assert err.count("\n") == 1
