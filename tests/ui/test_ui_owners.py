"""The run viewer's decisions racing another owner of the run: a resume in this process, and ``runs resume --approve``.

Each trial pauses the office run (two calls held back: ``read`` and
``mail``), then the viewer rejects ``mail`` at the moment another owner
approves it and goes on; later every trial, so both sides win some races.
Whoever wins, one decision is kept, the rejected call never runs, and an
approved one runs once (SQLite and PostgreSQL, both drivers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.app_owners import decide, staggered
from support.shared_runs import SECRET, Effects, counted, office
from support.ui_runs import Viewer

from fsm_agent import RunLeasedError, StaleRunError
from fsm_agent.__main__ import main as cli
from fsm_agent.persist import open_store

pytest.importorskip("uvicorn", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

TRIALS = 8
REJECT_MAIL = {"call_id": "mail", "approve": False, "why": "not to the boss"}


@pytest.fixture
def viewed(store_target: str) -> Iterator[tuple[Any, Viewer]]:
    """The store and a viewer over it that takes decisions."""
    with open_store(store_target) as store:
        viewer = Viewer(store, allow_decisions=True)
        try:
            yield store, viewer
        finally:
            viewer.close()


def _paused(store: Any, run_id: str) -> None:
    agent, _ = office(Effects())
    result = agent.run("tidy up", store=store, run_id=run_id)
    assert (result.reason, [c.id for c in result.pending]) == ("paused", ["read", "mail"])


def _reject(url: str, run_id: str) -> Any:
    return lambda: decide(url, run_id, REJECT_MAIL)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_viewer_rejection_racing_a_resume_that_approves_keeps_one_decision_and_runs_mail_at_most_once(
    viewed: tuple[Any, Viewer], driver: str
) -> None:
    """Either the viewer's rejection is kept and nothing runs, or the resume's approval is and mail runs once."""
    store, viewer = viewed
    for trial in range(TRIALS):
        run_id = f"race-{driver}-{trial}"
        _paused(store, run_id)
        effects = Effects()
        agent, model = office(effects)

        def go(run_id: str = run_id, agent: Any = agent) -> Any:
            run = agent.resume(store.load(run_id), approvals={"read": "private", "mail": True}, store=store)
            return run.finish() if driver == "sync" else asyncio.run(run.afinish())

        resumed, (status, page) = staggered(go, _reject(viewer.url, run_id), trial, TRIALS)
        stored = store.load(run_id)
        assert SECRET not in model.shown
        assert effects["read"] == 0
        if status == 200:
            assert isinstance(resumed, StaleRunError | RunLeasedError | ValueError), resumed
            assert (stored["paused"], stored["approvals"]) == (True, {"mail": "not to the boss"})
            assert (effects, model.calls) == (Effects(), 0)
        else:
            assert status == 409, page
            assert not isinstance(resumed, BaseException), resumed
            assert (resumed.reason, stored["state"]) == ("done", "Done")
            assert "mailed boss" in resumed.final
            assert (effects, model.calls) == ({"mail": 1}, 1)


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_viewer_approval_repeated_by_a_racing_resume_runs_mail_once(viewed: tuple[Any, Viewer], driver: str) -> None:
    """The viewer approves mail while a resume approves it too: the same decision twice runs the call once at most."""
    store, viewer = viewed
    for trial in range(TRIALS):
        run_id = f"same-{driver}-{trial}"
        _paused(store, run_id)
        effects = Effects()
        agent, _ = office(effects)

        def go(run_id: str = run_id, agent: Any = agent) -> Any:
            run = agent.resume(store.load(run_id), approvals={"read": False, "mail": True}, store=store)
            return run.finish() if driver == "sync" else asyncio.run(run.afinish())

        def approve(run_id: str = run_id) -> tuple[int, dict[str, Any]]:
            return decide(viewer.url, run_id, {"call_id": "mail", "approve": True})

        resumed, (status, page) = staggered(go, approve, trial, TRIALS)
        stored = store.load(run_id)
        if isinstance(resumed, BaseException):
            assert isinstance(resumed, StaleRunError | RunLeasedError), resumed
            assert status == 200, page
            assert (stored["paused"], stored["approvals"], effects) == (True, {"mail": True}, Effects())
            agent, _ = office(effects)
            done = agent.resume(stored, approvals={"read": False}, store=store).finish()
            assert done.reason == "done"
        else:
            assert resumed.reason == "done"
            assert status in (200, 409), page
        assert effects == {"mail": 1}
        assert store.load(run_id)["state"] == "Done"


AGENT_MODULE = """
import os
from pathlib import Path

from support.shared_runs import Effects, office


def make():
    return office(Effects(Path(os.environ["OWNERS_EFFECTS"])), approve=False)[0]
"""


def test_runs_resume_approve_racing_a_viewer_rejection_keeps_one_decision_and_runs_mail_at_most_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fsm-agent runs resume --approve mail`` while the viewer rejects mail: the winner's decision alone acts."""
    log = tmp_path / "effects.txt"
    (tmp_path / "owners_agent.py").write_text(AGENT_MODULE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OWNERS_EFFECTS", str(log))
    db = str(tmp_path / "runs.db")
    with open_store(db) as store:
        viewer = Viewer(store, allow_decisions=True)
        try:
            sent = 0
            for trial in range(TRIALS):
                run_id = f"cli-{trial}"
                _paused(store, run_id)
                command = ["runs", "resume", run_id, "--store", db, "--agent", "owners_agent:make", "--quiet"]
                command += ["--approve", "mail=yes", "--reject", "read=private"]
                code, (status, page) = staggered(lambda c=command: cli(c), _reject(viewer.url, run_id), trial, TRIALS)
                capsys.readouterr()
                stored = store.load(run_id)
                if status == 200:
                    assert code != 0
                    assert stored["approvals"]["mail"] == "not to the boss"
                    assert stored["state"] != "Done"
                else:
                    assert status == 409, page
                    assert (code, stored["state"]) == (0, "Done")
                    sent += 1
                assert counted(log) == ({"mail": sent} if sent else {})
        finally:
            viewer.close()
