"""``runs fork`` around pauses and refusals: a paused fork resumed or forked again, and what cannot be forked.

The source (``support.fork_agents``) made one ``add`` call; ``ADDED`` counts
every execution of it.  ``make_careful``'s agent holds ``add`` for a person.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fork_agents import ADDED, AFTER_THE_CALL, BEFORE_THE_CALL, source_run

from fsm_agent import SqliteStore
from fsm_agent.__main__ import main

CAREFUL = ("--agent", "support.fork_agents:make_careful")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    """A store file holding the finished run ``source`` (one call of ``add``); ``ADDED`` cleared after it."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as opened:
        source_run(opened)
    ADDED.clear()
    return str(path)


def held_fork(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``f``: the source forked before its call by the careful agent, paused on call_0 (exit 2)."""
    at = str(BEFORE_THE_CALL)
    assert main(["runs", "fork", "source", "--at", at, "--store", store, *CAREFUL, "--run-id", "f", "--quiet"]) == 2
    assert "call_0" in capsys.readouterr().err
    assert ADDED == []


def test_a_paused_fork_resumed_with_an_approval_takes_the_source_s_result(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """runs resume --approve on the paused fork answers with the source's result: add is not made again."""
    held_fork(store, capsys)
    assert main(["runs", "resume", "f", "--store", store, *CAREFUL, "--approve", "call_0", "--quiet"]) == 0
    assert capsys.readouterr().out == "the sum is 5\n"
    assert ADDED == []


def test_a_fork_of_a_paused_fork_approved_later_takes_the_source_s_result(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The paused fork forked again at its pause, then approved: the first source's result is taken, add not made."""
    held_fork(store, capsys)
    at = str(BEFORE_THE_CALL)  # the paused fork's last transition: its pause
    assert main(["runs", "fork", "f", "--at", at, "--store", store, *CAREFUL, "--run-id", "g", "--quiet"]) == 2
    capsys.readouterr()
    assert main(["runs", "resume", "g", "--store", store, *CAREFUL, "--approve", "call_0", "--quiet"]) == 0
    assert capsys.readouterr().out == "the sum is 5\n"
    assert ADDED == []


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--at", "6"], "ends the source in Done"),  # the source's last transition
        (["--at", str(AFTER_THE_CALL), "--rerun", "call_0"], "completed before the fork point"),
        (["--at", "0", "--rerun", "nope"], "never completed: nope"),
    ],
)
def test_a_fork_refused_is_one_line_exit_1_and_stores_nothing(
    store: str, arguments: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Forking at the end, or making again a call that is in the history already or never was: one line, no run."""
    agent = ("--agent", "support.fork_agents:make")
    assert main(["runs", "fork", "source", *arguments, "--store", store, *agent, "--run-id", "f"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: "), err
    assert said in err, err
    assert err.count("\n") == 1, err
    assert ADDED == []
    with SqliteStore(store) as opened:
        assert [run.run_id for run in opened.list_runs()] == ["source"]
