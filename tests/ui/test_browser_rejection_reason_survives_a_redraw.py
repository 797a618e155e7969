"""A reason typed for a rejection is the one recorded, even when the followed run is re-drawn meanwhile.

A paused run's page follows the run (``/api/events``) and re-draws it on each
change.  A person typing why they reject one call while someone else decides
another must not have their reason dropped: the rejection they send carries
what they typed.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.shared_runs import Effects, office
from support.ui_runs import WAIT, Viewer

from fsm_agent import SqliteStore

pytestmark = pytest.mark.browser


def decide_elsewhere(url: str, run_id: str, body: dict[str, Any]) -> int:
    """Someone else's decision, POSTed as their page would."""
    request = urllib.request.Request(
        f"{url}api/decide?id={run_id}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return int(answer.status)


def test_a_reason_typed_before_another_decision_arrives_is_the_one_recorded(page: Any, tmp_path: Path) -> None:
    """Type a reason for read, someone approves mail, press Reject on read: the rejection says the reason."""
    with SqliteStore(tmp_path / "runs.db") as store:
        agent, _ = office(Effects())
        assert agent.run("tidy up", store=store, run_id="office").reason == "paused"
        viewer = Viewer(store, allow_decisions=True)
        try:
            page.goto(viewer.url + "run?id=office")
            page.wait_for_selector("li[data-call='read'] input.why", timeout=WAIT)
            page.fill("li[data-call='read'] input.why", "private")
            assert decide_elsewhere(viewer.url, "office", {"call_id": "mail", "approve": True}) == 200
            page.wait_for_selector("li[data-call='mail'] p.decided", timeout=WAIT)  # the page followed the change
            page.click("li[data-call='read'] button.reject")
            page.wait_for_selector("li[data-call='read'] p.decided", timeout=WAIT)
            assert store.load("office")["approvals"] == {"mail": True, "read": "private"}
        finally:
            viewer.close()
