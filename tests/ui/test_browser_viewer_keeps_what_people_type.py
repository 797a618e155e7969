"""In headless Chromium: the page says why an approval with a reason is refused, and why it stopped following a run.

The store keeps an approval as approved, with no text, so the server
refuses an approval posted with a reason (``test_viewer_keeps_what_people_type``);
the page must show that refusal where the person pressed Approve, leave the
call undecided, and approve once the box is cleared.  A followed run that is
deleted ends its stream with ``gone``; a run deleted between the page's read
and the start of its stream is answered 404 by the stream, and the page says
so in the store's words instead of going quiet.
"""

from __future__ import annotations

import asyncio
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.app_owners import JOIN
from support.shared_runs import Effects, office
from support.ui_runs import WAIT, Viewer
from support.viewer_clients import post

from fsm_agent.persist import open_store

pytestmark = pytest.mark.browser


def typed(page: Any, call_id: str, text: str) -> None:
    """Type ``text`` into the reason box of ``call_id``, again if a redraw took the box away as it was typed into.

    The followed page is drawn again when the stream's first page comes: a box
    replaced between Playwright's focus and its typing loses the text (the
    focus goes with it), while text typed before is carried to the new box.
    """
    box = f"li[data-call='{call_id}'] input.why"
    deadline = time.monotonic() + JOIN
    page.fill(box, text, timeout=WAIT)
    while page.input_value(box, timeout=WAIT) != text and time.monotonic() < deadline:
        page.fill(box, text, timeout=WAIT)
    assert page.input_value(box, timeout=WAIT) == text


def _paused(store: Any) -> None:
    agent, model = office(Effects())
    assert (agent.run("tidy up", store=store, run_id="office").reason, model.calls) == ("paused", 1)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_approve_with_a_reason_typed_shows_the_refusal_and_approves_once_the_box_is_cleared(
    page: Any, store_target: str, driver: str
) -> None:
    """Type a reason, press Approve: the refusal is shown and nothing stored; clear it, Approve: approved, mail once."""
    with open_store(store_target) as store:
        _paused(store)
        viewer = Viewer(store, allow_decisions=True)
        try:
            page.goto(viewer.url + "run?id=office")
            typed(page, "mail", "checked the address")
            before = store.load("office")
            page.click("li[data-call='mail'] button.approve")
            alert = page.wait_for_selector("li[data-call='mail'] p.error[role=alert]", timeout=WAIT)
            assert alert.text_content().startswith("an approval carries no reason")
            assert store.load("office") == before
            assert page.query_selector("li[data-call='mail'] p.decided") is None
            typed(page, "mail", "")
            page.click("li[data-call='mail'] button.approve")
            decided = page.wait_for_selector("li[data-call='mail'] p.decided", timeout=WAIT)
            assert decided.text_content() == "approved"
            assert store.load("office")["approvals"] == {"mail": True}
        finally:
            page.goto("about:blank")  # the page stops following first, so the server has no stream to cut
            viewer.close()
        effects = Effects()
        agent, model = office(effects)
        run = agent.resume(store.load("office"), approvals={"read": False}, store=store)
        # Off this thread when awaited: Playwright's sync driver keeps an event loop running here.
        with ThreadPoolExecutor(1) as other:
            result = run.finish() if driver == "sync" else other.submit(asyncio.run, run.afinish()).result(JOIN)
        assert (result.reason, effects, model.calls) == ("done", {"mail": 1}, 1)


def test_a_refusal_answered_after_the_page_was_redrawn_is_shown_on_the_redrawn_call(
    page: Any, store_target: str
) -> None:
    """Approve with a reason; before the 400 arrives someone rejects read and the page redraws: the refusal shows."""
    with open_store(store_target) as store:
        _paused(store)
        viewer = Viewer(store, allow_decisions=True)
        held: list[Any] = []
        try:

            def hold(route: Any) -> None:
                held.append(route)  # answered below, once the page was redrawn

            page.route(re.compile(r"/api/decide\?"), hold)
            page.goto(viewer.url + "run?id=office")
            typed(page, "mail", "checked the address")
            page.click("li[data-call='mail'] button.approve")
            deadline = time.monotonic() + JOIN
            while not held and time.monotonic() < deadline:
                page.wait_for_timeout(20)  # lets Playwright hand over the held request
            assert len(held) == 1
            body = {"call_id": "read", "approve": False, "why": "private"}
            assert post(viewer.url, "/api/decide", "office", body)[0] == 200  # someone else, in another tab
            page.wait_for_selector("li[data-call='read'] p.decided", timeout=WAIT)  # the followed page redrew
            held[0].continue_()
            alert = page.wait_for_selector("li[data-call='mail'] p.error[role=alert]", timeout=WAIT)
            assert alert.text_content().startswith("an approval carries no reason")
            assert store.load("office")["approvals"] == {"read": "private"}
        finally:
            page.goto("about:blank")  # the page stops following first, so the server has no stream to cut
            viewer.close()


def test_typing_goes_on_into_the_reason_box_when_the_page_is_redrawn_meanwhile(page: Any, store_target: str) -> None:
    """Half a reason typed, someone decides read (the page redraws), the rest typed: Reject keeps all of it."""
    with open_store(store_target) as store:
        _paused(store)
        viewer = Viewer(store, allow_decisions=True)
        try:
            page.goto(viewer.url + "run?id=office")
            typed(page, "mail", "not to ")  # the box has the focus, the caret at its end
            body = {"call_id": "read", "approve": False, "why": "private"}
            assert post(viewer.url, "/api/decide", "office", body)[0] == 200  # someone else, in another tab
            page.wait_for_selector("li[data-call='read'] p.decided", timeout=WAIT)  # the followed page redrew
            page.keyboard.type("the boss")
            assert page.input_value("li[data-call='mail'] input.why", timeout=WAIT) == "not to the boss"
            page.click("li[data-call='mail'] button.reject")
            page.wait_for_selector("li[data-call='mail'] p.decided", timeout=WAIT)
            assert store.load("office")["approvals"] == {"read": "private", "mail": "not to the boss"}
        finally:
            page.goto("about:blank")  # the page stops following first, so the server has no stream to cut
            viewer.close()


def test_a_followed_run_deleted_meanwhile_is_said_to_be_gone(page: Any, store_target: str) -> None:
    """A paused run's page follows it; the run is deleted: the page says it is no longer in the store."""
    with open_store(store_target) as store:
        _paused(store)
        viewer = Viewer(store)
        try:
            with page.expect_response(re.compile(r"/api/events\?"), timeout=WAIT) as answered:
                page.goto(viewer.url + "run?id=office")
            assert answered.value.status == 200  # the stream is open (its headers came): now the run goes
            page.wait_for_selector("#approval", timeout=WAIT)
            assert store.delete("office")
            alert = page.wait_for_selector("p.error[role=alert]", timeout=WAIT)
            assert alert.text_content() == "run office is no longer in the store"
        finally:
            page.goto("about:blank")  # the page stops following first, so the server has no stream to cut
            viewer.close()


def test_a_run_deleted_before_its_stream_starts_is_said_to_be_missing_in_the_stores_words(
    page: Any, store_target: str
) -> None:
    """Deleted between the page's read and its stream: the stream's 404 ends following, the page names the run."""
    with open_store(store_target) as store:
        _paused(store)
        viewer = Viewer(store)
        streams: list[str] = []

        def delete_first(route: Any) -> None:
            streams.append(route.request.url)
            store.delete("office")  # after the page read the run, before its stream is asked for
            route.continue_()

        try:
            page.route(re.compile(r"/api/events\?"), delete_first)
            page.goto(viewer.url + "run?id=office")
            alert = page.wait_for_selector("p.error[role=alert]", timeout=WAIT)
            assert alert.text_content() == "no run 'office' in this store"
            assert len(streams) == 1  # the page did not keep asking for a stream the server refused
        finally:
            page.goto("about:blank")  # the page stops following first, so the server has no stream to cut
            viewer.close()
