"""``python -m fsm_agent runs fork``: a stored run forked at a transition and run, then listed and shown as a fork."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fork_agents import ADDED, AFTER_THE_CALL, BEFORE_THE_CALL, source_run

from fsm_agent import SqliteStore
from fsm_agent.__main__ import main

AGENT = ("--agent", "support.fork_agents:make")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    """A store file holding the finished run ``source`` (one call of ``add``); ``ADDED`` cleared after it."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as opened:
        source_run(opened)
    ADDED.clear()
    return str(path)


def test_a_fork_after_the_call_runs_to_its_answer_without_making_the_call_again(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """runs fork --at 3 prints the fork's answer (exit 0) and its id; list and show say where it came from."""
    code = main(["runs", "fork", "source", "--at", str(AFTER_THE_CALL), "--store", store, *AGENT, "--run-id", "f1"])
    out = capsys.readouterr()
    assert (code, out.out) == (0, "the sum is 5\n"), out.err
    assert f"forked source at {AFTER_THE_CALL} as f1" in out.err
    assert ADDED == []
    assert main(["runs", "list", "--store", store]) == 0
    lines = {line.split("\t")[0]: line.split("\t") for line in capsys.readouterr().out.splitlines()}
    assert lines["f1"][-1] == f"forked from source at {AFTER_THE_CALL}"
    assert len(lines["source"]) == len(lines["f1"]) - 1  # a run that is no fork has no such column
    assert main(["runs", "show", "f1", "--store", store]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[:2] == ["run f1: Done, reason done", f"forked from source at {AFTER_THE_CALL}"]


@pytest.mark.parametrize("again", [("--rerun", "call_0"), ("--rerun-all",)])
def test_rerun_makes_the_named_calls_again_instead_of_reusing_their_results(
    store: str, again: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """Forked before its call, the fork reuses the result; --rerun ID or --rerun-all make the call again."""
    at = str(BEFORE_THE_CALL)
    assert main(["runs", "fork", "source", "--at", at, "--store", store, *AGENT, "--quiet"]) == 0
    assert ADDED == []
    assert main(["runs", "fork", "source", "--at", at, "--store", store, *AGENT, "--quiet", *again]) == 0
    assert ADDED == [(2, 3)]
    assert capsys.readouterr().out == "the sum is 5\n" * 2


def test_what_cannot_be_forked_is_one_line_and_exit_1(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No such run, a transition past the end or below 0, a fork id taken: one line each, nothing run."""
    for arguments, said in (
        (["nope", "--at", "1"], "no run 'nope'"),
        (["source", "--at", "99"], "99"),
        (["source", "--at", "-1"], "--at must be a transition number, 0 or more, got -1"),
        (["source", "--at", "3", "--run-id", "source"], "source"),
    ):
        assert main(["runs", "fork", *arguments, "--store", store, *AGENT]) == 1, arguments
        err = capsys.readouterr().err
        assert err.startswith("error: "), err
        assert said in err, (arguments, err)
        assert err.count("\n") == 1, err
    assert ADDED == []
    with SqliteStore(store) as opened:
        assert [run.run_id for run in opened.list_runs()] == ["source"]


def test_a_fork_that_comes_to_a_call_awaiting_approval_stops_there_and_resumes(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fork whose agent holds add for approval pauses (exit 2, naming the call); runs resume --approve finishes it."""
    careful = ("--agent", "support.fork_agents:make_careful")
    code = main(["runs", "fork", "source", "--at", "0", "--store", store, *careful, "--run-id", "f", "--rerun-all"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "\npaused, waiting for decisions on: add (call_0) (--approve ID or --reject ID[=WHY])\n" in err
    assert ADDED == []
    assert main(["runs", "resume", "f", "--store", store, *careful, "--approve", "call_0", "--quiet"]) == 0
    assert capsys.readouterr().out == "the sum is 5\n"
    assert ADDED == [(2, 3)]
