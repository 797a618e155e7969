"""Bad input at the command line is one line naming the flag, exit 1, before anything is written or run.

Each test drives ``main([...])`` in this process with a user's agent module
(a scripted model, a tool that counts its calls) written to the working
directory, so a tool run or a file written by a refused command is seen.
"""

from __future__ import annotations

import importlib
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import SqliteStore
from fsm_agent.__main__ import main

AGENT = textwrap.dedent(
    '''
    from fsm_agent import Agent
    from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

    calls = []


    def add(a: int, b: int) -> int:
        """Add two numbers."""
        calls.append((a, b))
        return a + b


    def script():
        return FakeModel(tool_turn(tool_call("add", id="c1", a=20, b=22)), reply("forty-two"))


    def careful():
        return Agent(script(), [add], approve={"add"})


    def short():
        return Agent(script(), [add], max_steps=1)


    def plain():
        return Agent(script(), [add])
    '''
)


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module in the working directory with the agents above, under a name no other test imported."""
    name = f"user_agent_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(AGENT, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _calls(module: str) -> list[Any]:
    return importlib.import_module(module).calls  # type: ignore[no-any-return]


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


# --- run ----------------------------------------------------------------------------------------------------


def test_run_with_an_agent_that_pauses_for_approval_reports_the_pause(
    module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run --agent`` whose agent has ``approve=``: the run pauses, and the command says on what, as resume does."""
    store = tmp_path / "runs.db"
    code = main(["run", "q", "--agent", f"{module}:careful", "--quiet", "--store", str(store), "--run-id", "p1"])
    assert code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("paused, waiting for decisions on: add (c1) ")
    assert f"runs resume p1 --store {store} --agent {module}:careful --approve ID or --reject ID[=WHY]" in line
    assert _calls(module) == []
    with SqliteStore(store) as opened:
        assert opened.load("p1")["paused"]


def test_run_that_pauses_without_a_store_says_it_was_not_kept(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Without ``--store`` nothing can be resumed: the pause line says so instead of naming a resume."""
    assert main(["run", "q", "--agent", f"{module}:careful", "--quiet"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("paused, waiting for decisions on: add (c1) (not kept without --store")
    assert _calls(module) == []


def test_run_with_a_diagram_it_cannot_draw_is_refused_before_the_run(
    module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--diagram out.gif``: no format has that suffix; one line naming --diagram, exit 1, the tool never called."""
    code = main(["run", "q", "--agent", f"{module}:plain", "--quiet", "--diagram", "out.gif"])
    err = capsys.readouterr().err
    assert code == 1
    assert "--format" not in err
    assert "--diagram" in _one_error_line(err)
    assert _calls(module) == []


# --- runs ---------------------------------------------------------------------------------------------------


@pytest.fixture
def stopped(module: str, tmp_path: Path) -> Path:
    """A store holding run ``m1``, stopped on max_steps after its one tool call."""
    store = tmp_path / "runs.db"
    assert main(["run", "q", "--agent", f"{module}:short", "--quiet", "--store", str(store), "--run-id", "m1"]) == 2
    return store


@pytest.mark.parametrize(("flag", "value"), [("--max-steps", "0"), ("--timeout", "-1"), ("--token-budget", "0")])
def test_runs_resume_with_an_invalid_new_limit_names_the_flag_not_the_snapshot(
    module: str, stopped: Path, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new limit out of range is the user's mistake: the line names the flag, and does not say the run is bad."""
    before = SqliteStore(stopped).load("m1")
    capsys.readouterr()
    code = main(["runs", "resume", "m1", "--agent", f"{module}:short", flag, value, "--quiet", "--store", str(stopped)])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 1
    assert "snapshot" not in line
    assert flag.removeprefix("--").replace("-", "_") in line or flag in line
    with SqliteStore(stopped) as opened:
        assert opened.load("m1")["stored_seq"] == before["stored_seq"]


def test_runs_resume_with_a_decision_on_an_unknown_call_writes_nothing(
    module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--approve zz`` on a run paused on c1: one line naming zz and the pending calls; the run is unchanged."""
    store = tmp_path / "runs.db"
    with SqliteStore(store) as opened:
        importlib.import_module(module).careful().run("q", store=opened, run_id="p1")
        before = opened.load("p1")
    code = main(["runs", "resume", "p1", "--agent", f"{module}:careful", "--approve", "zz", "--store", str(store)])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 1
    assert "'zz'" in line
    assert "pending: c1" in line
    with SqliteStore(store) as opened:
        after = opened.load("p1")
    assert (after["stored_seq"], after["approvals"], after["paused"]) == (before["stored_seq"], {}, True)
    assert _calls(module) == []


def test_runs_export_to_a_directory_is_one_line(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out DIR`` (a directory, not a file): one line naming --out, exit 1."""
    capsys.readouterr()
    before = sorted(tmp_path.iterdir())
    try:
        code = main(["runs", "export", "m1", "--out", str(tmp_path), "--store", str(stopped)])
    except OSError as exc:
        pytest.fail(f"traceback instead of one line: {exc!r}")
    assert code == 1
    assert "--out" in _one_error_line(capsys.readouterr().err)
    assert sorted(tmp_path.iterdir()) == before


def test_runs_show_with_a_diagram_it_cannot_draw_names_a_flag_it_has(
    stopped: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runs show m1 --diagram out.gif``: the error names --diagram only, and the exit code says it failed."""
    capsys.readouterr()
    code = main(["runs", "show", "m1", "--diagram", "out.gif", "--store", str(stopped)])
    out, err = capsys.readouterr()
    assert "--format" not in err
    assert "--diagram out.gif" in _one_error_line(err)
    assert out == ""
    assert code == 1


@pytest.mark.parametrize("state", ["failed", "Faild", "awaiting approval"])
def test_runs_list_with_a_state_no_run_can_be_in_is_refused(
    stopped: Path, state: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --state that is no state of the machine is a usage error naming the states, not an empty listing."""
    capsys.readouterr()
    code = main(["runs", "list", "--state", state, "--store", str(stopped)])
    assert code == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "Failed" in line
    if state == "awaiting approval":  # how the listing shows a paused run: pointed at the state it is stored in
        assert "--state ExecuteTool" in line


@pytest.mark.parametrize(
    "flags",
    [["--limit", "99999999999999999999"], ["--limit", str(2**63 - 1)], ["--offset", str(2**63)], ["--limit", "0"]],
)
def test_runs_list_with_a_page_no_store_can_take_is_one_line(
    stopped: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A --limit or --offset past what the databases' 64-bit integers hold is a usage error, not a traceback."""
    capsys.readouterr()
    assert main(["runs", "list", *flags, "--store", str(stopped)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"--limit must be from 1 to {2**63 - 2} and --offset from 0 to {2**63 - 1}" in line


@pytest.mark.parametrize(("run_id", "shown"), [("two\nlines", "two\\nlines"), ("a\tb", "a\\tb")])
def test_runs_list_shows_a_run_id_holding_a_newline_or_tab_on_its_one_line_escaped(
    module: str, tmp_path: Path, run_id: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No store refuses such an id; the listing keeps one line per run and its columns, the id's escaped."""
    store = tmp_path / "runs.db"
    assert main(["run", "q", "--agent", f"{module}:short", "--quiet", "--store", str(store), "--run-id", run_id]) == 2
    assert f"run id {shown} (in " in capsys.readouterr().err
    assert main(["runs", "list", "--store", str(store)]) == 0
    (row,) = capsys.readouterr().out.splitlines()
    columns = row.split("\t")
    assert (len(columns), columns[0], columns[1:3]) == (6, shown, ["Failed", "max_steps"])


# --- batch --------------------------------------------------------------------------------------------------


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    path = tmp_path / "inputs.jsonl"
    path.write_text('"q1"\n"q2"\n', encoding="utf-8")
    return path


def test_batch_with_a_negative_task_retries_names_that_flag(
    module: str, inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--task-retries -1``: one line naming --task-retries (not max_retries, the SDK's --max-retries), exit 1."""
    store = tmp_path / "batch.db"
    args = ["batch", str(inputs), "--agent", f"{module}:plain", "--local", "--quiet", "--store", str(store)]
    code = main([*args, "--task-retries", "-1"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 1
    assert "task-retries" in line or "task_retries" in line
    assert "max_retries" not in line
    assert _calls(module) == []


@pytest.mark.parametrize("bad", [["--max-in-flight", "0"], ["--task-retries", "-1"]])
def test_batch_refused_for_a_bad_flag_leaves_the_out_file_and_store_untouched(
    module: str, inputs: Path, tmp_path: Path, bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused batch must not truncate last time's --out results, nor create a store file."""
    out, store = tmp_path / "results.jsonl", tmp_path / "batch.db"
    out.write_text('{"previous": "results"}\n', encoding="utf-8")
    args = ["batch", str(inputs), "--agent", f"{module}:plain", "--local", "--quiet", "--store", str(store)]
    code = main([*args, "--out", str(out), *bad])
    _one_error_line(capsys.readouterr().err)
    assert code == 1
    assert _calls(module) == []
    assert out.read_text(encoding="utf-8") == '{"previous": "results"}\n'
    assert not store.exists()


# --- check --------------------------------------------------------------------------------------------------


def test_check_write_tests_to_an_existing_file_is_one_line(
    module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--write-tests test_paths.py`` (a file, where a directory is wanted): one line naming the flag, exit 1."""
    target = tmp_path / "test_paths.py"
    target.write_text("# mine\n", encoding="utf-8")
    try:
        code = main(["check", f"{module}:short", "--write-tests", str(target)])
    except OSError as exc:
        pytest.fail(f"traceback instead of one line: {exc!r}")
    err = capsys.readouterr().err
    assert code == 1
    assert "--write-tests" in err.strip().splitlines()[-1]
    assert target.read_text(encoding="utf-8") == "# mine\n"
