"""A tab following a paused run is shown every decision and the run's end, whichever order the machine takes.

The viewer's stream (``fsm_agent/ui/live.py``) reads the stored run every
``poll`` seconds and sends its page when what the page shows changed.  Two
orders are left to the machine, and on a busy one each comes up: the
follower can be shown a decision before the tab that made it hears back,
and two writes (two decisions, or the last decision and the resume) can land
between two polls.  The stores of ``support.held_viewer_store`` hold one
side on an event, so each order is met every time.  In both, nothing is
dropped: a page is the run as stored, so the page after two writes shows
both, and the run's end is always sent.  Each run's tools and model calls
are counted (per call id), on both stores and, for the resume, both drivers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.app_owners import JOIN, at_once
from support.held_viewer_store import AnswerAfterShown, PollHeld
from support.shared_runs import Effects, office
from support.viewer_clients import Shown, follow, post, served

pytest.importorskip("uvicorn", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

RUN = "followed"
REJECT_READ = {"call_id": "read", "approve": False, "why": "private"}
APPROVE_MAIL = {"call_id": "mail", "approve": True}
BOTH = {"read": "private", "mail": True}


def _paused(store: Any) -> None:
    """The office run paused before ``read`` and ``mail``, both waiting for a person; one model call made."""
    agent, model = office(Effects())
    result = agent.run("tidy up", store=store, run_id=RUN)
    assert (result.reason, [c.id for c in result.pending], model.calls) == ("paused", ["read", "mail"], 1)


def _resumed(store: Any, driver: str, effects: Effects) -> Any:
    """The decided run resumed from the store and finished by ``driver``: the model's one call counted."""
    agent, model = office(effects)
    run = agent.resume(store.load(RUN), store=store)
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert (result.reason, model.calls) == ("done", 1)
    return result


def _ended(names: list[str], shown: Shown) -> None:
    """One ``message`` per page, then ``end``; the last page the finished run; versions only ever newer."""
    assert names == ["message"] * len(shown.pages) + ["end"], names
    assert shown.pages[-1]["state"] == "Done", shown.pages[-1]
    versions = [page["version"] for page in shown.pages]
    assert versions == sorted(set(versions)), versions


def _held_poll(held: list[PollHeld]) -> Any:
    """A ``wrap`` for ``served``: the store with the stream's reads of ``RUN`` held at a gate, kept in ``held``."""

    def wrap(store: Any) -> PollHeld:
        held.append(PollHeld(store, RUN))
        return held[0]

    return wrap


def _mail_ran(page: dict[str, Any]) -> None:
    """The finished run's page shows ``mail`` run (its tool message) and ``read`` refused with the reason given."""
    tool_text = {m.get("tool_call_id"): str(m.get("content")) for m in page["messages"] if m["role"] == "tool"}
    assert "mailed" in tool_text.get("mail", ""), tool_text
    assert "private" in tool_text.get("read", ""), tool_text


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_follower_shown_each_decision_before_the_deciding_tab_hears_back_is_shown_each_in_order(
    store_target: str, driver: str
) -> None:
    """Each decision's answer held until the follower showed it: the other tab still goes on, nothing waits out."""
    shown = Shown()
    wrapped: list[AnswerAfterShown] = []

    def hold_answers(store: Any) -> AnswerAfterShown:
        def shown_to_follower(approvals: dict[str, Any]) -> None:
            shown.wait_for(lambda page: page["approvals"] == approvals, f"the follower shown {approvals}")

        wrapped.append(AnswerAfterShown(store, shown_to_follower))
        return wrapped[0]

    effects = Effects()
    with served(store_target, wrap=hold_answers, allow_decisions=True) as (store, viewer, logged):
        _paused(store)

        def other_tab() -> None:
            shown.wait_for(lambda page: page["paused"], "the paused run")
            for body, approvals in ((REJECT_READ, {"read": "private"}), (APPROVE_MAIL, BOTH)):
                assert post(viewer.url, "/api/decide", RUN, body)[0] == 200
                shown.wait_for(lambda page, a=approvals: page["approvals"] == a, f"the follower shown {approvals}")
            _resumed(store, driver, effects)

        names, ended = at_once(lambda: follow(viewer.url, RUN, shown), other_tab)
        assert ended is None, ended
        _ended(names, shown)
        assert [page["approvals"] for page in shown.pages][:3] == [{}, {"read": "private"}, BOTH], shown.pages
        _mail_ran(shown.pages[-1])
        assert wrapped[0].decided == 2
        assert effects == {"mail": 1}
        assert not logged.records


@pytest.mark.parametrize("resumed_too", [False, True], ids=["both-decisions", "decisions-and-resume"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_writes_landing_between_two_polls_are_all_on_the_followers_next_page_and_the_stream_ends(
    store_target: str, driver: str, resumed_too: bool
) -> None:
    """Both decisions (and the resume, ``resumed_too``) written while the stream waits between polls: its next page
    holds them all (the finished run, when resumed), then the end."""
    shown = Shown()
    held: list[PollHeld] = []
    effects = Effects()
    with served(store_target, wrap=_held_poll(held), allow_decisions=True) as (store, viewer, logged):
        _paused(store)

        def other_tab() -> None:
            shown.wait_for(lambda page: page["paused"], "the paused run")
            held[0].hold()
            assert held[0].at_gate.wait(JOIN), "the stream never read the run again"
            try:
                for body in (REJECT_READ, APPROVE_MAIL):
                    assert post(viewer.url, "/api/decide", RUN, body)[0] == 200
                if resumed_too:
                    _resumed(store, driver, effects)
            finally:
                held[0].release()
            if not resumed_too:
                shown.wait_for(lambda page: page["approvals"] == BOTH, "the follower shown both decisions")
                _resumed(store, driver, effects)

        names, ended = at_once(lambda: follow(viewer.url, RUN, shown), other_tab)
        assert ended is None, ended
        _ended(names, shown)
        if resumed_too:
            assert len(shown.pages) == 2, shown.pages  # the paused run, then at once the finished one
            assert (shown.pages[0]["paused"], shown.pages[0]["approvals"]) == (True, {})
        else:
            assert [page["approvals"] for page in shown.pages][:2] == [{}, BOTH], shown.pages
        _mail_ran(shown.pages[-1])
        assert effects == {"mail": 1}
        assert not logged.records
