"""``runs resume --approve/--reject``: a shell's decisions are checked before any is stored, retried and raced safely.

Both stores.  The agent module counts each tool call in a file, so a call
made by any process (or made twice) shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.office_cli import RUN, paused
from support.office_cli import resume as _resume
from support.office_cli import stored as _stored
from support.shared_runs import Effects, counted, office

from fsm_agent.persist import open_store

ROOT = Path(__file__).resolve().parents[2]


def _setup(store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str) -> Path:
    """The office run paused in ``store_target``; an agent module ``module:make`` logging its calls; the log's path."""
    return paused(store_target, tmp_path, monkeypatch, module, office(Effects())[0])


def test_an_unknown_call_id_given_first_stores_no_decision(
    store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--approve typo --approve mail``: exit 1 naming the typo; nothing stored, nothing run."""
    log = _setup(store_target, tmp_path, monkeypatch, "cli_office_a")
    before = _stored(store_target)
    assert _resume(store_target, "cli_office_a", "--approve", "typo=yes", "--approve", "mail=yes") == 1
    assert "'typo'" in capsys.readouterr().err
    assert _stored(store_target) == before
    assert counted(log) == Effects()


def test_an_unknown_call_id_given_last_stores_no_decision_either(
    store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--approve mail --approve typo``: the command fails on the typo, so the mail's approval must not be kept
    either (the person fixes the typo and runs it again; meanwhile a viewer shows a decision nobody confirmed)."""
    log = _setup(store_target, tmp_path, monkeypatch, "cli_office_b")
    before = _stored(store_target)
    assert _resume(store_target, "cli_office_b", "--approve", "mail=yes", "--approve", "typo=yes") == 1
    assert "'typo'" in capsys.readouterr().err
    assert counted(log) == Effects()
    assert _stored(store_target)["approvals"] == before["approvals"] == {}


def test_a_decision_the_store_refuses_leaves_the_other_decisions_of_the_command_unstored(
    store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``read`` was rejected in the viewer; ``--approve mail --approve read`` is refused on ``read``: mail stays
    undecided, as the command as a whole was refused."""
    log = _setup(store_target, tmp_path, monkeypatch, "cli_office_c")
    with open_store(store_target) as store:
        store.decide(RUN, "read", "private")
    assert _resume(store_target, "cli_office_c", "--approve", "mail=yes", "--approve", "read=yes") == 1
    assert "already decided (rejected: private)" in capsys.readouterr().err
    assert counted(log) == Effects()
    assert _stored(store_target)["approvals"] == {"read": "private"}


def test_a_retried_command_with_the_same_decisions_goes_on_and_mails_once(
    store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--approve mail`` leaves ``read`` waiting (exit 2); run again, then with ``--reject read``: mail sent once."""
    log = _setup(store_target, tmp_path, monkeypatch, "cli_office_d")
    for _ in range(2):
        assert _resume(store_target, "cli_office_d", "--approve", "mail=yes") == 2
        assert "waiting for decisions on: read_file (read)" in capsys.readouterr().err
        assert counted(log) == Effects()
    assert _resume(store_target, "cli_office_d", "--approve", "mail=yes", "--reject", "read=private") == 0
    assert "a person rejected this call to 'read_file': private" in capsys.readouterr().out
    assert _resume(store_target, "cli_office_d", "--approve", "mail=yes", "--reject", "read=private") == 1
    assert "not paused" in capsys.readouterr().err
    assert counted(log) == {"mail": 1}


@pytest.mark.subprocess
def test_two_shells_resuming_with_the_same_decisions_at_once_mail_once(
    store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``runs resume`` processes with the same decisions started together: the mail goes out exactly once."""
    log = _setup(store_target, tmp_path, monkeypatch, "cli_office_e")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "tests"), str(ROOT)])}
    command = [
        sys.executable,
        "-m",
        "fsm_agent",
        *("runs", "resume", RUN, "--store", store_target, "--agent", "cli_office_e:make", "--quiet"),
        *("--approve", "mail=yes", "--reject", "read=private"),
    ]
    shells = [
        subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    codes = []
    for shell in shells:
        _, err = shell.communicate(timeout=120)
        codes.append((shell.returncode, err))
    assert 0 in [code for code, _ in codes], codes
    for code, err in codes:
        assert code in (0, 1), err
        if code == 1:
            assert "Traceback" not in err, err
    assert counted(log) == {"mail": 1}
    assert _stored(store_target)["state"] == "Done"
