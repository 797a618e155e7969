"""``runs fork`` given an id already taken: one line that says what to do with this command, nothing run or stored.

fork-a-run.md: bad input "is a ``ForkError``, ``TypeError`` or ``ValueError``
before anything is stored or called"; the command line says it in one line.
``runs fork`` has ``--run-id`` and no way to overwrite, and ``Agent.fork``
takes no ``overwrite=``: advice to start the run with ``overwrite=True`` is
advice the user cannot follow here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fork_agents import ADDED, AFTER_THE_CALL, source_run

from fsm_agent import SqliteStore
from fsm_agent.__main__ import main


def test_runs_fork_onto_a_taken_id_asks_for_another_run_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both the source's own id and an earlier fork's: exit 1, one line naming --run-id, no add made, no run stored."""
    store = str(tmp_path / "runs.db")
    with SqliteStore(store) as opened:
        source_run(opened)
    ADDED.clear()
    agent = ("--agent", "support.fork_agents:make")
    at = str(AFTER_THE_CALL)
    assert main(["runs", "fork", "source", "--at", at, "--store", store, *agent, "--run-id", "f1", "--quiet"]) == 0
    capsys.readouterr()
    for taken in ("source", "f1"):
        assert main(["runs", "fork", "source", "--at", at, "--store", store, *agent, "--run-id", taken]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: "), err
        assert err.count("\n") == 1, err
        assert "overwrite=True" not in err, err
        assert "--run-id" in err, err
    assert ADDED == []
    with SqliteStore(store) as opened:
        assert sorted(run.run_id for run in opened.list_runs()) == ["f1", "source"]
