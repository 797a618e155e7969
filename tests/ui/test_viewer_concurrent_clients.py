"""Two people deciding the same paused call through one served viewer at once, and bad decisions sent to it.

The viewer is served over HTTP on a real store (SQLite and PostgreSQL);
clients are httpx clients in threads released together by one barrier.
Whatever the order the store takes them in, exactly one decision stands,
every other different one is a 409 naming it, and the run, resumed (by
both drivers, and by two owners at once), runs an approved call once and a
rejected one never: each execution is counted per call id, each model
call too.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.app_owners import JOIN, at_once
from support.shared_runs import Effects, office
from support.viewer_clients import Shown, decide_all, follow, post, served

from fsm_agent import RunLeasedError
from fsm_agent.core.approval import describe_decision
from fsm_agent.persist import open_store

pytest.importorskip("uvicorn", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

TRIALS = 10
APPROVE = {"call_id": "mail", "approve": True}


def _paused(store: Any, run_id: str) -> None:
    agent, model = office(Effects())
    result = agent.run("tidy up", store=store, run_id=run_id)
    assert (result.reason, [c.id for c in result.pending], model.calls) == ("paused", ["read", "mail"], 1)


def _resume(agent: Any, store: Any, run_id: str, driver: str) -> Any:
    """The run resumed from the store with ``read`` rejected, finished by ``driver``."""
    run = agent.resume(store.load(run_id), approvals={"read": False}, store=store)
    return run.finish() if driver == "sync" else asyncio.run(run.afinish())


def _standing(answers: list[tuple[int, Any]], bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """The one decision taken (200); every other is a 409 naming it as the decision that stands."""
    taken = [body for (status, _), body in zip(answers, bodies, strict=True) if status == 200]
    assert len(taken) == 1, answers
    stood = taken[0]
    words = describe_decision(True if stood["approve"] else stood.get("why") or False)
    for (status, page), body in zip(answers, bodies, strict=True):
        if body is not stood:
            assert status == 409, (status, page)
            assert page["error"] == (
                f"no decision taken on call 'mail' of run {page_run(page)!r}: it was already decided ({words})"
            )
    return stood


def page_run(page: dict[str, Any]) -> str:
    """The run a 409's message names."""
    return str(page["error"].split(" of run ", 1)[1].split("'")[1])


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_approval_and_a_rejection_at_once_leave_one_decision_and_mail_runs_once_or_never(
    store_target: str, driver: str
) -> None:
    """Approve and Reject pressed at once in two tabs: one stands, the other is a 409 naming it; resumed, it acts."""
    bodies = [APPROVE, {"call_id": "mail", "approve": False, "why": "not to the boss"}]
    outcomes = set()
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        for trial in range(TRIALS):
            run_id = f"two-{driver}-{trial}"
            _paused(store, run_id)
            version = store.load(run_id)["stored_seq"]
            answers = decide_all(viewer.url, run_id, bodies)
            stood = _standing(answers, bodies)
            stored = store.load(run_id)
            assert stored["approvals"] == {"mail": True if stood["approve"] else "not to the boss"}
            assert (stored["stored_seq"], stored["paused"]) == (version + 1, True)  # one write, still paused
            effects = Effects()
            agent, model = office(effects)
            result = _resume(agent, store, run_id, driver)
            assert (result.reason, model.calls) == ("done", 1)
            assert effects == ({"mail": 1} if stood["approve"] else {})
            outcomes.add(stood["approve"])
        assert not logged.records
    assert outcomes  # which side wins is the machine's; each trial held exactly one


@pytest.mark.slow
def test_four_different_decisions_at_once_keep_exactly_one_and_name_it_to_the_other_three(store_target: str) -> None:
    """An approval and three rejections with different reasons, at once: one stands, three 409s naming it."""
    bodies = [APPROVE, *({"call_id": "mail", "approve": False, "why": f"reason {i}"} for i in range(3))]
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        for trial in range(TRIALS):
            run_id = f"four-{trial}"
            _paused(store, run_id)
            version = store.load(run_id)["stored_seq"]
            stood = _standing(decide_all(viewer.url, run_id, bodies), bodies)
            stored = store.load(run_id)
            assert stored["approvals"] == {"mail": True if stood["approve"] else stood["why"]}
            assert stored["stored_seq"] == version + 1
        assert not logged.records


@pytest.mark.slow
def test_the_same_approval_twice_at_once_is_taken_once_and_both_clients_are_shown_it(store_target: str) -> None:
    """Two tabs approve the same call at once: both 200 with the approval (the second wrote nothing), mail runs once."""
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        for trial in range(TRIALS):
            run_id = f"same-{trial}"
            _paused(store, run_id)
            version = store.load(run_id)["stored_seq"]
            answers = decide_all(viewer.url, run_id, [APPROVE, APPROVE])
            assert [status for status, _ in answers] == [200, 200], answers
            assert all(page["approvals"] == {"mail": True} for _, page in answers)
            assert all(page["version"] == version + 1 for _, page in answers)
            assert store.load(run_id)["stored_seq"] == version + 1
            effects = Effects()
            agent, model = office(effects)
            assert _resume(agent, store, run_id, "sync").reason == "done"
            assert (effects, model.calls) == ({"mail": 1}, 1)
        assert not logged.records


@pytest.mark.slow
def test_decisions_on_the_two_calls_at_once_are_both_kept(store_target: str) -> None:
    """One tab rejects ``read`` as another approves ``mail``: both decisions are in the store, neither lost."""
    bodies = [{"call_id": "read", "approve": False, "why": "private"}, APPROVE]
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        for trial in range(TRIALS):
            run_id = f"both-{trial}"
            _paused(store, run_id)
            version = store.load(run_id)["stored_seq"]
            answers = decide_all(viewer.url, run_id, bodies)
            assert [status for status, _ in answers] == [200, 200], answers
            stored = store.load(run_id)
            assert (stored["approvals"], stored["stored_seq"]) == ({"read": "private", "mail": True}, version + 2)
            effects = Effects()
            agent, model = office(effects)
            run = agent.resume(stored, store=store)
            assert run.finish().reason == "done"
            assert (effects, model.calls) == ({"mail": 1}, 1)
        assert not logged.records


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_two_owners_resuming_a_decided_run_at_once_run_the_approved_call_once(store_target: str, driver: str) -> None:
    """After a viewer approval, two owners resume at once: one finishes, the other is refused; mail ran once."""
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        for trial in range(TRIALS // 2):
            run_id = f"owners-{driver}-{trial}"
            _paused(store, run_id)
            assert post(viewer.url, "/api/decide", run_id, APPROVE)[0] == 200
            effects = Effects()
            owners = [office(effects), office(effects)]
            loaded = store.load(run_id)  # both owners read the same version, then go on at once

            def go(agent: Any, loaded: dict[str, Any] = loaded) -> Any:
                run = agent.resume(loaded, approvals={"read": False}, store=store)
                return run.finish() if driver == "sync" else asyncio.run(run.afinish())

            first, second = at_once(*(lambda a=agent: go(a) for agent, _ in owners))
            done = [r for r in (first, second) if not isinstance(r, BaseException)]
            refused = [r for r in (first, second) if isinstance(r, BaseException)]
            assert [r.reason for r in done] == ["done"], (first, second)
            assert all(isinstance(r, RunLeasedError) for r in refused), refused
            assert effects == {"mail": 1}
            assert sum(model.calls for _, model in owners) == 1
            assert store.load(run_id)["state"] == "Done"
        assert not logged.records


BAD = [
    pytest.param({"call_id": "mail", "approve": False, "why": {"x": 1}}, 400, "why must be text", id="why-not-text"),
    pytest.param({"call_id": "mail", "approve": False, "why": 7}, 400, "why must be text", id="why-a-number"),
    pytest.param({"call_id": 5, "approve": True}, 400, "call_id must be text", id="call-id-a-number"),
    pytest.param({"call_id": None, "approve": True}, 400, "call_id must be text", id="call-id-null"),
    pytest.param({"approve": True}, 400, "a decision is {call_id, approve: true|false, why}", id="no-call-id"),
    pytest.param({"call_id": "mail", "approve": "yes"}, 400, "approve must be true or false", id="approve-a-text"),
    pytest.param([1], 400, "a decision is {call_id, approve: true|false, why}", id="not-an-object"),
    pytest.param(
        {"call_id": "mail", "approve": False, "why": "yes"},
        400,
        "'yes' reads as an approval",
        id="why-reads-as-approval",
    ),
    pytest.param({"call_id": "zzz", "approve": True}, 409, "it is not a pending call of the run", id="unknown-call"),
]


@pytest.mark.parametrize(("body", "status", "says"), BAD)
def test_a_malformed_decision_is_a_specific_4xx_and_changes_nothing(
    store_target: str, body: Any, status: int, says: str
) -> None:
    """Each bad body is refused with its own status and words; the stored run is as it was, version included."""
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        _paused(store, "bad")
        before = store.load("bad")
        answer = post(viewer.url, "/api/decide", "bad", body)
        assert answer[0] == status, answer
        assert says in answer[1]["error"], answer
        assert store.load("bad") == before
        assert not logged.records


def test_an_undecodable_body_an_unknown_run_and_an_ended_run_are_refused_and_change_nothing(
    store_target: str,
) -> None:
    """Bytes that are no JSON (400), a run the store lacks (404), a run that ended meanwhile (409 saying so)."""
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        _paused(store, "ended")
        effects = Effects()
        agent, _ = office(effects)
        agent.resume(store.load("ended"), approvals={"read": False, "mail": True}, store=store).finish()
        before = store.load("ended")
        status, page = post(viewer.url, "/api/decide", "ended", None, raw=b"\xff\xfe")
        assert (status, page["error"].startswith("a decision is {call_id, approve: true|false, why}: ")) == (400, True)
        assert post(viewer.url, "/api/decide", "nobody", APPROVE) == (404, {"error": "no run 'nobody' in this store"})
        status, page = post(viewer.url, "/api/decide", "ended", {"call_id": "mail", "approve": False})
        assert status == 409
        assert page["error"].startswith("no decision taken on call 'mail' of run 'ended': the run is not paused")
        assert store.load("ended") == before
        assert effects == {"mail": 1}
        assert not logged.records


@contextlib.contextmanager
def _command_viewer(target: str, errors: Path, stop: int = signal.SIGTERM) -> Iterator[str]:
    """``fsm-agent ui --allow-decisions`` over ``target`` in a process of its own: its address; stderr to ``errors``."""
    command = [sys.executable, "-m", "fsm_agent", "ui", "--store", target, "--port", "0", "--allow-decisions"]
    with errors.open("w", encoding="utf-8") as stderr:
        viewer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert viewer.stdout is not None
        first = viewer.stdout.readline()
        assert first.startswith("fsm_agent ui: http://127.0.0.1:"), (first, errors.read_text(encoding="utf-8"))
        yield first.split()[2]
    finally:
        viewer.send_signal(stop)
        viewer.wait(JOIN)
        if viewer.stdout is not None:
            viewer.stdout.close()


@pytest.mark.subprocess
def test_two_people_on_two_viewers_of_one_store_deciding_at_once_keep_one_decision(
    store_target: str, tmp_path: Path
) -> None:
    """One person on ``fsm-agent ui`` in its own process, one on a viewer here, both over one store: one stands."""
    bodies = [APPROVE, {"call_id": "mail", "approve": False, "why": "not to the boss"}]
    errors = tmp_path / "viewer.err"
    with (
        served(store_target, allow_decisions=True) as (store, here, logged),
        _command_viewer(store_target, errors) as there,
    ):
        for trial in range(TRIALS):
            run_id = f"viewers-{trial}"
            _paused(store, run_id)
            version = store.load(run_id)["stored_seq"]
            urls = [here.url, there] if trial % 2 else [there, here.url]  # each viewer carries each decision
            answers = at_once(
                *(lambda u=u, b=b, r=run_id: post(u, "/api/decide", r, b) for u, b in zip(urls, bodies, strict=True))
            )
            stood = _standing(answers, bodies)
            assert store.load(run_id)["stored_seq"] == version + 1
            effects = Effects()
            agent, model = office(effects)
            assert _resume(agent, store, run_id, "async").reason == "done"
            assert (effects, model.calls) == ({"mail": 1} if stood["approve"] else {}, 1)
        assert not logged.records
    assert errors.read_text(encoding="utf-8") == ""


@pytest.mark.slow
def test_a_follower_sees_the_other_tabs_decision_live_and_the_end_of_the_resumed_run(store_target: str) -> None:
    """Tab A follows the paused run; tab B rejects read, then approves mail; a resume ends it: A saw each, in order."""
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        _paused(store, "followed")
        effects = Effects()
        agent, model = office(effects)
        shown = Shown()

        def other_tab() -> None:
            shown.wait_for(lambda page: page["paused"], "the paused run")
            for body, approvals in (
                ({"call_id": "read", "approve": False, "why": "private"}, {"read": "private"}),
                (APPROVE, {"read": "private", "mail": True}),
            ):
                assert post(viewer.url, "/api/decide", "followed", body)[0] == 200
                # Waits for the page showing it, not for "one more page": the follower may be shown the decision
                # before this tab hears back, and then no further page comes (it sat out JOIN, and failed, so).
                shown.wait_for(lambda page, a=approvals: page["approvals"] == a, f"the follower shown {approvals}")
            assert agent.resume(store.load("followed"), store=store).finish().reason == "done"

        names, ended = at_once(lambda: follow(viewer.url, "followed", shown), other_tab)
        assert ended is None, ended
        assert names == ["message"] * len(shown.pages) + ["end"], names
        approvals = [page["approvals"] for page in shown.pages]
        assert approvals[:3] == [{}, {"read": "private"}, {"read": "private", "mail": True}], shown.pages
        assert shown.pages[-1]["state"] == "Done"
        versions = [page["version"] for page in shown.pages]
        assert versions == sorted(set(versions)), versions
        assert (effects, model.calls) == ({"mail": 1}, 1)
        assert not logged.records


@pytest.mark.subprocess
def test_stopping_the_viewer_while_tabs_follow_paused_runs_ends_their_streams_without_a_traceback(
    store_target: str, tmp_path: Path
) -> None:
    """Ctrl-C on ``fsm-agent ui`` with two tabs following a paused run: each stream ends, stderr holds no error."""
    errors = tmp_path / "viewer.err"
    with open_store(store_target) as store:
        _paused(store, "open-tab")
    following = threading.Barrier(3)
    with _command_viewer(store_target, errors, stop=signal.SIGINT) as there:

        def tab() -> list[str]:
            return follow(there, "open-tab", lambda page: following.wait(JOIN) if page["paused"] else None)

        tabs = [threading.Thread(target=tab, daemon=True) for _ in range(2)]
        for thread in tabs:
            thread.start()
        following.wait(JOIN)  # both tabs were shown the paused run: their streams are open
    for thread in tabs:
        thread.join(JOIN)
        assert not thread.is_alive()
    assert "Error" not in errors.read_text(encoding="utf-8"), errors.read_text(encoding="utf-8")
