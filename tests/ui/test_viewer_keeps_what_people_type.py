"""What a person types into the run viewer is kept or refused, never taken and dropped; an unknown run is unknown.

A decision on a paused call is ``True`` (approved), ``False`` or a reason
text (rejected, the reason told to the model): the store has no place for
an approval's text.  So an approval posted with a reason is refused with a
400 naming why, and nothing is written; a rejection's reason is kept in the
store, on the run's page, in ``fsm-agent runs show`` and in what the model
is told.  The event stream of a run the store never had is a 404, while a
run deleted as it is followed still ends its stream with ``gone``.

Served over HTTP on both stores; each resume runs on both drivers and
counts every tool execution (per call id) and every model call.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from support.app_owners import JOIN
from support.shared_runs import Effects, office
from support.viewer_clients import decide_all, get, post, served

from fsm_agent.cli.main import main
from fsm_agent.core.approval import describe_decision, rejection_text

pytest.importorskip("uvicorn", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

TRIALS = 6
"""Races per store and driver: each one's outcome is checked whichever side the store takes first."""
NOTED = {"call_id": "mail", "approve": True, "why": "checked the address"}
REFUSED = "an approval carries no reason"


def _paused(store: Any, run_id: str) -> None:
    agent, model = office(Effects())
    result = agent.run("tidy up", store=store, run_id=run_id)
    assert (result.reason, [c.id for c in result.pending], model.calls) == ("paused", ["read", "mail"], 1)


def told(why: str) -> str:
    """The tool message the model reads for ``mail`` rejected with ``why``."""
    return json.dumps({"error": rejection_text("send_email", why)})


def _resumed(store: Any, run_id: str, driver: str) -> tuple[Any, Effects, Any]:
    """The run resumed from the store with ``read`` rejected, finished by ``driver``: result, effects, model."""
    effects = Effects()
    agent, model = office(effects)
    run = agent.resume(store.load(run_id), approvals={"read": False}, store=store)
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    return result, effects, model


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_approval_posted_with_a_reason_is_a_400_naming_why_and_writes_nothing(
    store_target: str, driver: str
) -> None:
    """Approve with text in the box: 400 saying an approval keeps no text; the run unchanged; mail never ran for it."""
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        _paused(store, "noted")
        before = store.load("noted")
        status, page = post(viewer.url, "/api/decide", "noted", NOTED)
        assert status == 400, page
        assert page["error"].startswith(REFUSED), page
        assert "'checked the address'" in page["error"]
        assert store.load("noted") == before  # no decision, no write: the version too
        assert post(viewer.url, "/api/decide", "noted", {**NOTED, "why": None})[0] == 200  # approved without text
        result, effects, model = _resumed(store, "noted", driver)
        assert (result.reason, effects, model.calls) == ("done", {"mail": 1}, 1)
        assert not logged.records


@pytest.mark.parametrize("why", ["", "   "], ids=["empty", "blank"])
def test_an_approval_with_an_empty_or_blank_reason_box_is_an_approval(store_target: str, why: str) -> None:
    """The page always sends the box: left empty (or spaces only, no words to keep) it approves, written once."""
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        _paused(store, "plain")
        version = store.load("plain")["stored_seq"]
        status, page = post(viewer.url, "/api/decide", "plain", {**NOTED, "why": why})
        assert (status, page["approvals"]) == (200, {"mail": True}), page
        assert store.load("plain")["stored_seq"] == version + 1
        assert not logged.records


@pytest.mark.parametrize("why", ["not to the boss", "  not to the boss ", "   "], ids=["words", "padded", "blank"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_rejection_reason_is_kept_in_the_store_the_page_runs_show_and_what_the_model_is_told(
    store_target: str, driver: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reject with a reason: stored as typed (spaces too, as ``agent.decide`` keeps them), shown on the page and by
    ``runs show``, told to the model on resume."""
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        _paused(store, "rejected")
        status, page = post(viewer.url, "/api/decide", "rejected", {"call_id": "mail", "approve": False, "why": why})
        assert (status, page["approvals"]) == (200, {"mail": why}), page
        assert store.load("rejected")["approvals"] == {"mail": why}
        assert get(viewer.url, "/api/run", id="rejected")[1]["approvals"] == {"mail": why}
        capsys.readouterr()
        assert main(["runs", "show", "rejected", "--store", store_target]) == 0
        assert f"send_email (mail) {json.dumps({'to': 'boss'})}: rejected: {why}" in capsys.readouterr().out
        result, effects, model = _resumed(store, "rejected", driver)
        assert (result.reason, effects, model.calls) == ("done", {}, 1)  # neither call ran; one model call
        assert told(why) in model.shown
        assert not logged.records


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_approval_with_a_reason_racing_two_rejections_leaves_one_rejection_standing_with_its_text(
    store_target: str, driver: str
) -> None:
    """Three tabs at once: the noted approval is a 400, one rejection stands as typed, the other is a 409 naming it."""
    rejections = [{"call_id": "mail", "approve": False, "why": f"reason {i}"} for i in range(2)]
    seen = set()
    with served(store_target, allow_decisions=True) as (store, viewer, logged):
        for trial in range(TRIALS):
            run_id = f"race-{driver}-{trial}"
            _paused(store, run_id)
            version = store.load(run_id)["stored_seq"]
            noted, *answers = decide_all(viewer.url, run_id, [NOTED, *rejections])
            assert noted[0] == 400, noted
            assert noted[1]["error"].startswith(REFUSED), noted
            taken = [body for (status, _), body in zip(answers, rejections, strict=True) if status == 200]
            assert len(taken) == 1, answers
            stood = taken[0]["why"]
            for (status, page), body in zip(answers, rejections, strict=True):
                if body["why"] != stood:
                    assert status == 409, (status, page)
                    assert page["error"] == (
                        f"no decision taken on call 'mail' of run {run_id!r}: "
                        f"it was already decided ({describe_decision(stood)})"
                    )
            stored = store.load(run_id)
            assert (stored["approvals"], stored["stored_seq"]) == ({"mail": stood}, version + 1)
            result, effects, model = _resumed(store, run_id, driver)
            assert (result.reason, effects, model.calls) == ("done", {}, 1)
            assert told(stood) in model.shown
            seen.add(stood)
        assert not logged.records
    assert seen <= {"reason 0", "reason 1"}


def test_following_a_run_the_store_does_not_have_is_a_404_naming_it(store_target: str) -> None:
    """``/api/events`` of an unknown run: a JSON 404 with the message ``/api/run`` gives, not a stream."""
    with served(store_target) as (store, viewer, logged):
        _paused(store, "known")
        with httpx.Client(base_url=viewer.url, timeout=JOIN) as http:
            answer = http.get("/api/events", params={"id": "nosuch"})
        assert answer.status_code == 404, answer.text
        assert answer.headers["content-type"].startswith("application/json")
        assert answer.json() == {"error": "no run 'nosuch' in this store"}
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert not logged.records


def test_a_run_deleted_while_followed_ends_its_stream_with_gone(store_target: str) -> None:
    """A paused run's stream sends its page, the run is deleted, the same stream then ends with ``gone``."""
    with served(store_target) as (store, viewer, logged):
        _paused(store, "doomed")
        events: list[str] = []
        with (
            httpx.Client(base_url=viewer.url, timeout=JOIN) as http,
            http.stream("GET", "/api/events", params={"id": "doomed"}) as stream,
        ):
            assert stream.status_code == 200
            event = "message"
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    events.append(event)
                    if event == "message":
                        assert json.loads(line.removeprefix("data: "))["run_id"] == "doomed"
                        assert store.delete("doomed")  # while the stream is open, after its first page
                    else:
                        break
                    event = "message"
        assert events == ["message", "gone"]
        assert not logged.records
