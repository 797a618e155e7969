"""A decision the run refuses is a ``DecisionError`` wherever it is given; a malformed one stays a plain error.

A store's ``decide`` always said ``DecisionError`` for a decision that came
too late or clashed with one taken; a run object, ``Agent.resume`` and
``Session.resume`` said a plain ``ValueError``, the class a malformed
decision has too, so an app could not answer the one 409 and the other 400.
Now each refusal by what the run holds is a ``DecisionError`` (still a
``ValueError``) naming the first call refused and the run's id; nothing is
kept, and no call is made.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.shared_runs import Effects, office

from fsm_agent import Agent, AgentRun, DecisionError, RunResult, Session, SqliteStore


def _paused(effects: Effects) -> tuple[Agent, AgentRun]:
    """The office agent and its run, paused on ``read`` and ``mail`` (no store)."""
    agent, _ = office(effects)
    run = agent.start("go")
    assert run.finish().reason == "paused"
    return agent, run


def _held(run: AgentRun) -> dict[str, Any]:
    """What the run holds, but the time it has been running (a paused run's clock goes on)."""
    held = run.snapshot()
    held["counters"].pop("elapsed")
    return held


def _refused(run: AgentRun, approvals: dict[str, bool | str]) -> DecisionError:
    before = _held(run)
    with pytest.raises(DecisionError) as refused:
        run.decide(approvals)
    assert _held(run) == before  # nothing kept, the good decisions beside it neither
    return refused.value


def test_a_decision_on_a_run_that_ended_names_its_call_and_the_run() -> None:
    effects = Effects()
    _, run = _paused(effects)
    run.decide({"read": True, "mail": "no"})
    assert run.finish().reason == "done"
    refused = _refused(run, {"mail": True})
    assert (refused.run_id, refused.call_id) == (run.run_id, "mail")
    assert str(refused).startswith(f"no decision taken on call 'mail' of run {run.run_id!r}: the run already finished")
    assert "was already rejected: no" in str(refused)
    assert effects == {"read": 1}


def test_a_decision_that_clashes_with_the_one_taken_is_refused() -> None:
    _, run = _paused(Effects())
    run.decide({"read": "not yours"})
    refused = _refused(run, {"mail": True, "read": True})
    assert (refused.call_id, refused.why) == (
        "read",
        "tool call 'read' was already decided (rejected: not yours); a decision holds",
    )
    run.decide({"read": "not yours"})  # the same decision again is no clash


def test_a_decision_on_a_call_no_one_is_asked_about_is_refused() -> None:
    effects = Effects()
    agent, _ = office(effects, approve=False)
    run = agent.start("go")
    run.advance()  # the model's reply: both calls pending, neither held back
    assert [call.id for call in run.position.calls.pending] == ["read", "mail"]
    refused = _refused(run, {"mail": False})
    assert refused.call_id == "mail"
    assert (
        refused.why
        == "tool call 'mail': it needs no approval, so there is nothing to decide (held back for a decision: none)"
    )
    assert effects == {}


def test_a_decision_on_a_call_the_run_does_not_hold_is_refused_naming_that_call() -> None:
    _, run = _paused(Effects())
    refused = _refused(run, {"read": True, "ghost": True})
    assert (refused.run_id, refused.call_id) == (run.run_id, "ghost")
    assert refused.why.startswith("no pending tool call has id 'ghost' (pending: read, mail)")


def test_deciding_nothing_on_a_run_that_ended_is_nothing() -> None:
    _, run = _paused(Effects())
    run.decide({"read": True, "mail": True})
    run.finish()
    before = _held(run)
    run.decide({})
    assert _held(run) == before


@pytest.mark.parametrize(
    ("decision", "error"), [("yes", ValueError), (1, TypeError)], ids=["reads-as-approval", "not-a-decision"]
)
def test_a_malformed_decision_stays_the_requests_error_not_a_refusal(decision: Any, error: type[Exception]) -> None:
    _, run = _paused(Effects())
    with pytest.raises(error) as raised:
        run.decide({"read": decision})
    assert not isinstance(raised.value, DecisionError)


def _resumed(agent: Agent, driver: str, source: Any, store: SqliteStore, approvals: dict[str, Any]) -> RunResult:
    if driver == "sync":
        return agent.resume(source, store=store, approvals=approvals).finish()

    async def go() -> RunResult:
        return await (await agent.aresume(source, store=store, approvals=approvals)).afinish()

    return asyncio.run(go())


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_decision_that_reaches_a_stored_run_another_resume_finished_names_the_run(
    tmp_path: Path, driver: str
) -> None:
    """Two tabs: the first resumes the run to its end; the second tab's resume is refused, nothing called again."""
    effects = Effects()
    agent, _ = office(effects)
    with SqliteStore(tmp_path / "runs.db") as store:
        assert agent.run("go", store=store, run_id="job").reason == "paused"
        stale = store.load("job")  # what the second tab read
        assert _resumed(agent, driver, stale, store, {"read": True, "mail": True}).reason == "done"
        with pytest.raises(DecisionError) as refused:
            _resumed(agent, driver, store.load("job"), store, {"mail": "stop"})
        with pytest.raises(ValueError, match="reads as an approval") as malformed:
            _resumed(agent, driver, store.load("job"), store, {"mail": "yes"})
    assert (refused.value.run_id, refused.value.call_id) == ("job", "mail")
    assert "there is nothing to resume: tool call 'mail' was already approved" in str(refused.value)
    assert not isinstance(malformed.value, DecisionError)
    assert effects == {"read": 1, "mail": 1}


def test_a_sessions_late_decision_names_the_turn(tmp_path: Path) -> None:
    effects = Effects()
    agent, _ = office(effects)
    with SqliteStore(tmp_path / "chat.db") as store:
        first, second = Session(agent, store, "s1"), Session(agent, store, "s1")  # two tabs, one conversation
        assert first.run("go").reason == "paused"
        assert second.resume({"read": True, "mail": False}).reason == "done"
        with pytest.raises(DecisionError) as refused:
            first.resume({"mail": True})
    assert (refused.value.run_id, refused.value.call_id) == (first.turn_id(1), "mail")
    assert str(refused.value).endswith(
        "tool call 'mail' was already rejected, and a decision holds: this one (approved) was not taken"
    )
    assert effects == {"read": 1}


def test_a_late_decision_on_a_turn_whose_resume_ended_in_a_stop_names_the_turn(tmp_path: Path) -> None:
    """Two tabs: the first approves, the call runs and the turn stops on ``max_steps``; the second tab is late."""
    effects = Effects()
    agent, _ = office(effects, max_steps=1, on_stop={"max_steps": "return"})
    with SqliteStore(tmp_path / "chat.db") as store:
        first, second = Session(agent, store, "s1"), Session(agent, store, "s1")
        assert first.run("go").reason == "paused"
        assert second.resume({"read": True, "mail": "no"}).reason == "max_steps"
        stopped = store.load("s1/1")
        refusals = []
        for late in (
            lambda: first.resume({"read": "no"}),
            lambda: agent.resume(store.load("s1/1"), store=store, approvals={"read": True}),
        ):
            with pytest.raises(DecisionError) as refused:
                late()
            refusals.append(refused.value)
        assert store.load("s1/1") == stopped
    assert "and a decision holds: this one (rejected: no) was not taken" in refusals[0].why
    for refused in refusals:
        assert (refused.run_id, refused.call_id) == ("s1/1", "read")
        assert refused.why.startswith("no pending tool call has id 'read' (pending: none): tool call 'read' was")
        assert refused.why.endswith("; the run has stopped (max_steps)")
    assert effects == {"read": 1}
