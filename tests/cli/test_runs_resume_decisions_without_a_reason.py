"""``runs resume --reject ID``: the same as a stored ``""``; a call the run does not hold back takes no decision.

Both stores.  The agent module counts each tool call in a file, so a call
made by any process (or made twice) shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.office_cli import RUN, paused
from support.office_cli import resume as _resume
from support.office_cli import stored as _stored
from support.shared_runs import Effects, counted, office_registry
from support.shared_runs import Office as OfficeModel

from fsm_agent import Agent
from fsm_agent.persist import open_store


def _setup(store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, held: set[str]) -> Path:
    """The office run paused in ``store_target``, the ``held`` tools held back; an agent module ``module:make`` (no
    ``approve=``) logging its calls; the log's path."""
    return paused(
        store_target, tmp_path, monkeypatch, module, Agent(OfficeModel(), office_registry(Effects()), approve=held)
    )


def test_reject_without_a_reason_after_an_empty_reason_was_stored_goes_on_and_the_call_never_runs(
    store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``read`` rejected from Python with ``""``; ``--reject read --approve mail`` is the same rejection again: the
    run goes on, the read never runs, the mail once, and the model is told "no reason given"."""
    log = _setup(store_target, tmp_path, monkeypatch, "cli_office_f", {"read_file", "send_email"})
    with open_store(store_target) as store:
        store.decide(RUN, "read", "")
    assert _resume(store_target, "cli_office_f", "--reject", "read", "--approve", "mail") == 0
    assert "a person rejected this call to 'read_file': no reason given" in capsys.readouterr().out
    assert counted(log) == {"mail": 1}


@pytest.mark.parametrize("decision", [("--reject", "mail"), ("--approve", "mail=no"), ("--approve", "mail")])
def test_a_decision_on_a_call_the_run_does_not_hold_back_is_refused_and_nothing_is_stored(
    store_target: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    decision: tuple[str, str],
) -> None:
    """Only ``read`` is held back: a decision on ``mail`` (with one on ``read`` beside it) is exit 1 saying it needs
    no approval; nothing is stored and nothing runs."""
    log = _setup(store_target, tmp_path, monkeypatch, "cli_office_g", {"read_file"})
    before = _stored(store_target)
    assert _resume(store_target, "cli_office_g", "--approve", "read", *decision) == 1
    err = capsys.readouterr().err
    assert "no decision taken on call 'mail'" in err
    assert "it needs no approval, so there is nothing to decide (held back for a decision: read)" in err
    assert _stored(store_target) == before
    assert counted(log) == Effects()


@pytest.mark.parametrize(
    "given", [("--reject", "mail=  not to the boss "), ("--approve", "mail=no:   ")], ids=["padded", "blank"]
)
def test_a_rejection_reason_given_on_the_command_line_is_stored_and_told_as_typed_spaces_and_all(
    store_target: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    given: tuple[str, str],
) -> None:
    """The text after ``=`` (or ``no:``) is the reason the model is told, as ``agent.decide`` keeps it: not trimmed
    into another reason or into "no reason given"; the mail never runs, the read once."""
    why = given[1].partition("=")[2].removeprefix("no:")
    log = _setup(store_target, tmp_path, monkeypatch, "cli_office_h", {"read_file", "send_email"})
    assert _resume(store_target, "cli_office_h", "--approve", "read", *given) == 0
    assert f"a person rejected this call to 'send_email': {why}\"" in capsys.readouterr().out  # its JSON's end
    assert counted(log) == {"read": 1}
