"""Shared stored runs keep their word: versioned writes, decisions that hold, no stale resume (both stores).

Two owners are the normal case: two people deciding at once, a retried
handler, a paused run object that someone else decided for.  Every test
counts side effects per call, not only results.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.shared_runs import CALLS, SECRET, Effects, counted, office

from fsm_agent import DecisionError, RunLeasedError, SqliteStore, StaleRunError
from fsm_agent.__main__ import main as cli
from fsm_agent.persist import StoreError, open_store

RUN = "job"


def _paused(store: Any, effects: Effects | None = None) -> dict[str, Any]:
    """A stored run paused before its two calls; its snapshot as the store has it."""
    agent, _ = office(effects if effects is not None else Effects())
    result = agent.run("tidy up", store=store, run_id=RUN)
    assert (result.reason, [c.id for c in result.pending]) == ("paused", list(CALLS))
    return store.load(RUN)


# --- every write is a compare-and-set ------------------------------------------------------------------------


def test_a_stale_snapshot_resumed_after_the_run_finished_is_refused_before_any_call(store_target: str) -> None:
    """Two handlers load one paused run; the first finishes it, the second's resume is refused and runs nothing."""
    effects = Effects()
    with open_store(store_target) as store:
        _paused(store)
        first, second = store.load(RUN), store.load(RUN)
        agent, _ = office(effects)
        result = agent.resume(first, approvals={"read": False, "mail": True}, store=store).finish()
        assert (result.reason, effects) == ("done", {"mail": 1})
        done = store.load(RUN)
        late, late_model = office(effects)
        with pytest.raises(StaleRunError, match=r"moved on to version \d+ since version \d+ was read") as info:
            late.resume(second, approvals={"read": False, "mail": True}, store=store)
        assert (info.value.expected, info.value.found) == (second["stored_seq"], done["stored_seq"])
        assert (effects["mail"], late_model.calls) == (1, 0)
        assert store.load(RUN) == done


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_retried_handler_resuming_the_paused_result_twice_sends_one_email(store_target: str, driver: str) -> None:
    """``resume(paused.snapshot, approvals, store)`` twice (the documented pattern, retried): the second is refused."""
    effects = Effects()
    with open_store(store_target) as store:
        agent, model = office(effects)
        paused = agent.run("tidy up", store=store, run_id=RUN)

        def handle() -> Any:
            run = agent.resume(paused.snapshot, approvals={"read": "no", "mail": True}, store=store)
            return run.finish() if driver == "sync" else asyncio.run(run.afinish())

        assert handle().reason == "done"
        with pytest.raises(StaleRunError):
            handle()
    assert effects == {"mail": 1}
    assert model.calls == 2


def test_a_snapshot_never_read_from_the_store_cannot_replace_a_stored_run(store_target: str) -> None:
    """A snapshot without a stored version (run elsewhere, or edited) is refused over a run the store holds."""
    with open_store(store_target) as store:
        stored = _paused(store)
        unversioned = {k: v for k, v in stored.items() if k != "stored_seq"}
        agent, model = office(Effects())
        with pytest.raises(StaleRunError, match="was not read from the store"):
            agent.resume(unversioned, store=store)
        with pytest.raises(StaleRunError, match="was not read from the store"):
            store.save(RUN, unversioned)
        assert (model.calls, store.load(RUN)) == (0, stored)


def test_save_writes_only_over_the_version_it_read_and_returns_the_next(store_target: str) -> None:
    """``save`` is a compare-and-set: the loaded version is written once, the next save names the returned version."""
    with open_store(store_target) as store:
        loaded = _paused(store)
        version = store.save(RUN, loaded)
        assert version == loaded["stored_seq"] + 1
        with pytest.raises(StaleRunError):
            store.save(RUN, loaded)
        assert store.save(RUN, {**loaded, "stored_seq": version}) == version + 1
        store.delete(RUN)
        with pytest.raises(StaleRunError, match="was deleted"):
            store.save(RUN, {**loaded, "stored_seq": version + 1})
        with pytest.raises(KeyError):
            store.load(RUN)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_paused_run_object_decided_for_elsewhere_is_refused_before_its_call_runs(
    store_target: str, driver: str
) -> None:
    """A person decides in the store while the paused run object still lives; going on, it is refused, no call made."""
    effects = Effects()
    with open_store(store_target) as store:
        agent, model = office(effects)
        run = agent.start("tidy up", store=store, run_id=RUN)
        assert run.finish().reason == "paused"
        store.decide(RUN, "read", "not the secrets")
        run.decide({"read": True, "mail": True})
        with pytest.raises(StaleRunError):
            run.finish() if driver == "sync" else asyncio.run(run.afinish())
        assert (effects, model.calls) == (Effects(), 1)
        assert store.load(RUN)["approvals"] == {"read": "not the secrets"}


# --- decisions are part of the run ---------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_agent_without_approve_keeps_an_undecided_call_waiting(store_target: str, driver: str) -> None:
    """Resumed by an agent built without ``approve=``, the run stays paused; its undecided calls never run."""
    effects = Effects()
    with open_store(store_target) as store:
        _paused(store)
        store.decide(RUN, "mail", True)
        plain, model = office(effects, approve=False)
        run = plain.resume(store.load(RUN), store=store)
        result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
        assert (result.reason, [c.id for c in result.pending]) == ("paused", ["read"])
        assert run.paused
        assert (effects, model.calls) == (Effects(), 0)
        store.decide(RUN, "read", False)
        resumed = plain.resume(store.load(RUN), store=store)
        done = resumed.finish() if driver == "sync" else asyncio.run(resumed.afinish())
    assert done.reason == "done"
    assert effects == {"mail": 1}
    assert SECRET not in model.shown


def test_a_paused_snapshot_from_before_to_approve_holds_back_every_undecided_call() -> None:
    """An older paused snapshot (no ``to_approve``) resumed without ``approve=`` runs none of its undecided calls."""
    agent, _ = office(Effects())
    old = agent.run("tidy up").snapshot
    assert old is not None
    old = {k: v for k, v in old.items() if k != "to_approve"}
    effects = Effects()
    plain, _ = office(effects, approve=False)
    assert plain.resume(old).finish().reason == "paused"
    assert plain.resume(old, approvals={"read": False, "mail": True}).finish().reason == "done"
    assert effects == {"mail": 1}


def test_a_decision_holds_against_a_different_one(store_target: str) -> None:
    """A second decision on a call is refused, in the store and on a resumed run, naming the first; no call runs."""
    effects = Effects()
    with open_store(store_target) as store:
        _paused(store)
        store.decide(RUN, "read", "private")
        with pytest.raises(DecisionError, match=r"already decided \(rejected: private\)"):
            store.decide(RUN, "read", True)
        agent, model = office(effects)
        with pytest.raises(ValueError, match="already decided"):
            agent.resume(store.load(RUN), approvals={"read": True, "mail": True}, store=store)
        assert (effects, model.calls, store.load(RUN)["approvals"]) == (Effects(), 0, {"read": "private"})


@pytest.mark.parametrize(
    ("setup", "call", "why"),
    [
        ("done", "read", "not paused"),
        ("paused", "nope", "not a pending call"),
        ("decided", "read", "already decided"),
    ],
)
def test_store_decide_refuses_what_is_not_a_decision_to_take(
    store_target: str, setup: str, call: str, why: str
) -> None:
    """Not paused, not pending, or decided already: a DecisionError saying which, and the run is as it was."""
    with open_store(store_target) as store:
        _paused(store)
        if setup == "decided":
            store.decide(RUN, "read", True)
        if setup == "done":
            office(Effects())[0].resume(store.load(RUN), approvals={"read": True, "mail": True}, store=store).finish()
        before = store.load(RUN)
        with pytest.raises(DecisionError, match=why):
            store.decide(RUN, call, False)
        assert store.load(RUN) == before
        with pytest.raises(KeyError, match="no run 'other'"):
            store.decide("other", "read", True)


def test_store_decide_refuses_a_run_someone_is_advancing(store_target: str) -> None:
    """While a resumed run holds its lease, a decision is a RunLeasedError (the call is already being dealt with)."""
    with open_store(store_target) as store:
        _paused(store)
        run = office(Effects())[0].resume(store.load(RUN), approvals={"read": True}, store=store)
        assert not run.paused
        with pytest.raises(RunLeasedError, match="is being advanced by"):
            store.decide(RUN, "mail", True)


@pytest.mark.parametrize("trial", range(8))
def test_two_people_deciding_at_once_in_the_store_both_decisions_are_kept(store_target: str, trial: int) -> None:
    """Two threads decide the two calls at the same moment: both decisions are stored, none lost."""
    with open_store(store_target) as store:
        _paused(store)
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def decide(call_id: str, decision: bool | str) -> None:
            start.wait()
            try:
                store.decide(RUN, call_id, decision)
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                errors.append(exc)

        threads = [threading.Thread(target=decide, args=a) for a in (("read", "secret"), ("mail", True))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        data = store.load(RUN)
        assert (data["approvals"], data["paused"]) == ({"read": "secret", "mail": True}, True)


# --- through the viewer, and the chain that sent a rejected call -----------------------------------------------


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(
        f"{url.rstrip('/')}/api/decide?id={RUN}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow
def test_two_people_deciding_through_the_viewer_never_let_a_rejected_call_run(
    store_target: str, tmp_path: Path
) -> None:
    """Reject the read while approving the mail at the same moment, many times: both kept, the secret never sent."""
    pytest.importorskip("uvicorn", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")
    from support.ui_runs import Viewer

    with open_store(store_target) as store:
        viewer = Viewer(store, allow_decisions=True)
        try:
            for _ in range(30):
                _paused(store)
                start = threading.Barrier(2)
                codes: list[int] = []

                def decide(body: dict[str, Any], _start: threading.Barrier = start, _codes: list[int] = codes) -> None:
                    _start.wait()
                    _codes.append(_post(viewer.url, body))

                bodies = ({"call_id": "read", "approve": False, "why": "secret"}, {"call_id": "mail", "approve": True})
                threads = [threading.Thread(target=decide, args=(b,)) for b in bodies]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                assert codes == [200, 200]
                assert store.load(RUN)["approvals"] == {"read": "secret", "mail": True}
                effects = Effects()
                plain, model = office(effects, approve=False)
                assert plain.resume(store.load(RUN), store=store).finish().reason == "done"
                assert effects == {"mail": 1}
                assert SECRET not in model.shown
                store.delete(RUN)
        finally:
            viewer.close()


# --- the command line --------------------------------------------------------------------------------------


AGENT_MODULE = """
from pathlib import Path
import os
from support.shared_runs import Effects, office

def make():
    return office(Effects(Path(os.environ["OFFICE_EFFECTS"])), approve=False)[0]
"""


DECIDED = ("--approve", "mail=yes", "--approve", "read=no")


def _paused_file(tmp_path: Path) -> str:
    """A SQLite store holding the paused office run; its path."""
    db = str(tmp_path / "runs.db")
    with SqliteStore(db) as store:
        _paused(store)
    return db


def _cli_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str) -> tuple[str, Path]:
    log = tmp_path / "effects.txt"
    (tmp_path / f"{module}.py").write_text(AGENT_MODULE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OFFICE_EFFECTS", str(log))
    return _paused_file(tmp_path), log


def test_runs_resume_with_agent_runs_the_user_s_approved_tool_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runs resume --agent MODULE:FUNCTION --approve`` uses the user's tools; the rejected read never runs."""
    db, log = _cli_setup(tmp_path, monkeypatch, "office_agent_a")
    code = cli(["runs", "resume", RUN, "--store", db, "--agent", "office_agent_a:make", "--quiet", *DECIDED])
    assert code == 0, capsys.readouterr().err
    assert counted(log) == {"mail": 1}
    assert "mailed boss" in capsys.readouterr().out


def test_runs_resume_without_a_decision_exits_2_naming_the_waiting_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No ``--approve`` for a waiting call: exit 2, the calls named, nothing run (the agent has no approve=)."""
    db, log = _cli_setup(tmp_path, monkeypatch, "office_agent_b")
    code = cli(["runs", "resume", RUN, "--store", db, "--agent", "office_agent_b:make", "--approve", "mail=yes"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "still paused, waiting for decisions on: read_file (read)" in err
    assert counted(log) == Effects()


def test_runs_resume_refuses_a_run_whose_tools_the_agent_lacks_before_using_a_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the built-in tools, a run waiting on ``send_email`` is refused (exit 1) and its stored run untouched."""
    db, _ = _cli_setup(tmp_path, monkeypatch, "office_agent_c")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with SqliteStore(db) as store:
        before = store.load(RUN)
    code = cli(
        [
            "runs",
            "resume",
            RUN,
            "--store",
            db,
            "--model",
            "openai:gpt-4o-mini",
            "--base-url",
            "http://127.0.0.1:9",
            *DECIDED,
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "read_file, send_email, which this agent's tools do not have" in err
    assert "--agent MODULE:FUNCTION" in err
    with SqliteStore(db) as store:
        assert store.load(RUN) == before


def test_runs_resume_wants_a_model_or_an_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Neither ``--model`` nor ``--agent`` (or both): one line, exit 1."""
    db = _paused_file(tmp_path)
    assert cli(["runs", "resume", RUN, "--store", db]) == 1
    assert "one of the arguments --model --agent is required" in capsys.readouterr().err
    assert cli(["runs", "resume", RUN, "--store", db, "--model", "openai:m", "--agent", "m:f"]) == 1
    assert "not allowed with argument" in capsys.readouterr().err


def test_runs_show_prints_each_pending_call_s_arguments_and_decision_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nobody approves blind: arguments, decision state, and no raw control character from the model."""
    db = _paused_file(tmp_path)
    with SqliteStore(db) as store:
        store.decide(RUN, "mail", "not \x1b[2J today")
    assert cli(["runs", "show", RUN, "--store", db]) == 0
    out = capsys.readouterr().out
    assert 'read_file (read) {"path": "secret.txt"}: awaiting a decision' in out
    assert 'send_email (mail) {"to": "boss"}: rejected: not \\x1b[2J today' in out
    assert "\x1b" not in out


# --- store= takes what the rest takes ----------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["run", "arun", "start", "resume"])
def test_store_accepts_a_path_or_url_like_the_command_line(store_target: str, entry: str) -> None:
    """``store="runs.db"`` or a ``postgresql://`` URL works in run, arun, start and resume; the run is stored."""
    effects = Effects()
    agent, _ = office(effects)
    if entry == "run":
        result = agent.run("tidy up", store=store_target, run_id=RUN)
    elif entry == "arun":
        result = asyncio.run(agent.arun("tidy up", store=store_target, run_id=RUN))
    elif entry == "start":
        result = agent.start("tidy up", store=store_target, run_id=RUN).finish()
    else:
        paused = agent.run("tidy up", store=store_target, run_id=RUN)
        result = agent.resume(paused, approvals={"read": False, "mail": True}, store=store_target).finish()
    with open_store(store_target) as store:
        stored = store.load(RUN)
    assert (stored["state"], stored["paused"]) == (("Done", False) if entry == "resume" else ("ExecuteTool", True))
    assert result.reason == ("done" if entry == "resume" else "paused")
    assert stored["stored_seq"] == (result.snapshot or {}).get("stored_seq", stored["stored_seq"])


def test_store_given_as_an_unusable_path_is_one_store_error_naming_it() -> None:
    """A ``store=`` path SQLite cannot open is a StoreError naming it, before any model call."""
    agent, model = office(Effects())
    with pytest.raises(StoreError, match=r"/proc/nonexistent/runs\.db cannot be used as a run store"):
        agent.run("tidy up", store="/proc/nonexistent/runs.db", run_id=RUN)
    assert model.calls == 0


def test_runs_resume_escapes_the_call_ids_it_quotes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An ``--approve`` id naming no call is one escaped line: no ESC or BEL reaches the terminal."""
    db = _paused_file(tmp_path)
    hostile = "\x1b]0;pwned\x07"
    code = cli(
        [
            *("runs", "resume", RUN, "--store", db, "--agent", "support.shared_runs:make_office"),
            *("--approve", f"{hostile}=yes"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert "is not a pending call of the run" in err
    assert "\\x1b]0;pwned\\x07" in err
    assert "\x1b" not in err
    assert "\x07" not in err


def test_runs_resume_records_decisions_in_the_store_and_a_decision_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--approve`` goes through ``store.decide``: kept even when the resume then fails; a different one refused."""
    db = _paused_file(tmp_path)
    with SqliteStore(db) as store:
        store.decide(RUN, "read", "private")
    agent = ["runs", "resume", RUN, "--store", db, "--agent", "support.shared_runs:make_office"]
    assert cli([*agent, "--approve", "mail=yes", "--max-steps", "0"]) == 1
    assert "max_steps" in capsys.readouterr().err
    assert cli([*agent, "--approve", "read=yes"]) == 1
    assert "already decided (rejected: private)" in capsys.readouterr().err
    with SqliteStore(db) as store:
        assert store.load(RUN)["approvals"] == {"read": "private", "mail": True}
    assert cli([*agent, "--reject", "read=private", "--quiet"]) == 0, capsys.readouterr().err
    assert "a person rejected this call to 'read_file': private" in capsys.readouterr().out
