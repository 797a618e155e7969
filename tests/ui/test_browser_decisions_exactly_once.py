"""Decisions from the page taken exactly once: a double-click, two tabs, then ``runs resume`` in another process.

The paused office run holds two calls (``read`` and ``mail``).  One tab
double-clicks Approve on mail and rejects read; a second tab, opened before,
still offers the buttons and tries to reject mail.  One decision per call is
kept, and the command line's resume (a process of its own) makes mail once
and read never, however often it is run.  The first tab, following the
paused run, shows it done without a reload.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.shared_runs import Effects, counted, office
from support.ui_runs import WAIT, Viewer

from fsm_agent import SqliteStore

pytestmark = [pytest.mark.browser, pytest.mark.subprocess]

AGENT_MODULE = """
import os
from pathlib import Path

from support.shared_runs import Effects, office


def make():
    return office(Effects(Path(os.environ["DECISIONS_EFFECTS"])), approve=False)[0]
"""
TESTS = Path(__file__).resolve().parents[1]
CLICK_TWICE = "selector => { const b = document.querySelector(selector); b.click(); b.click(); }"
"""A double-click as a person's two quick clicks: two click events on the same button, before any answer."""


def resume(tmp_path: Path, db: Path, log: Path) -> subprocess.CompletedProcess[str]:
    """``python -m fsm_agent runs resume office --agent decisions_agent:make`` in a process of its own."""
    env = {"PYTHONPATH": f"{tmp_path}:{TESTS}", "DECISIONS_EFFECTS": str(log)}
    command = [sys.executable, "-m", "fsm_agent", "runs", "resume", "office", "--store", str(db)]
    command += ["--agent", "decisions_agent:make", "--quiet"]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **env}, cwd=tmp_path
    )


def test_double_click_and_a_second_tab_keep_one_decision_and_the_cli_resume_runs_mail_once(
    page: Any, tmp_path: Path
) -> None:
    """Approve mail twice at once, reject it from another tab: one decision kept, acted on once, both tabs follow."""
    (tmp_path / "decisions_agent.py").write_text(AGENT_MODULE, encoding="utf-8")
    log, db = tmp_path / "effects.txt", tmp_path / "runs.db"
    with SqliteStore(db) as store:
        agent, _ = office(Effects())
        assert agent.run("tidy up", store=store, run_id="office").reason == "paused"
        viewer = Viewer(store, allow_decisions=True)
        try:
            other = page.context.new_page()
            for tab in (page, other):
                tab.goto(viewer.url + "run?id=office")
                tab.wait_for_selector("li[data-call='mail'] button.approve", timeout=WAIT)
            # Two clicks on Approve in one tab and a Reject in the other, all sent before any answer is back.
            # The other tab's button is taken now: its page may be re-drawn by the time it is pressed (a stale tab).
            other.fill("li[data-call='mail'] input.why", "not to the boss")
            other.evaluate("s => { window.rejectMail = document.querySelector(s); }", "[data-call='mail'] .reject")
            page.evaluate(CLICK_TWICE, "li[data-call='mail'] button.approve")
            other.evaluate("() => { window.rejectMail.click(); window.rejectMail.click(); }")
            for tab in (page, other):  # the mail decision is in, and each tab re-drew the run with it
                tab.wait_for_selector("li[data-call='mail'] p.decided", timeout=WAIT)
            # No reason typed for read: a re-draw still on its way would drop it (test_browser_rejection_reason_...).
            page.click("li[data-call='read'] button.reject")
            for tab in (page, other):  # each tab follows the paused run: both come to show what was kept
                tab.wait_for_selector("#resume-hint", timeout=WAIT)
            kept = store.load("office")["approvals"]
            assert set(kept) == {"mail", "read"}
            assert kept["read"] is False
            assert kept["mail"] in (True, "not to the boss")
            shown = "approved" if kept["mail"] is True else "rejected: not to the boss"
            for tab in (page, other):
                tab.wait_for_function(
                    "([sel, text]) => document.querySelector(sel)?.textContent === text",
                    arg=["li[data-call='mail'] p.decided", shown],
                    timeout=WAIT,
                )

            first = resume(tmp_path, db, log)
            assert first.returncode == 0, first.stderr
            again = resume(tmp_path, db, log)
            assert again.returncode != 0
            assert counted(log) == ({"mail": 1} if kept["mail"] is True else {})
            stored = store.load("office")
            assert (stored["state"], stored["reason"]) == ("Done", "done")

            # The first tab was following the paused run: it shows the resumed run done, every transition in it.
            page.wait_for_selector("#status-badge.status-done", timeout=WAIT)
            count = page.eval_on_selector_all("#timeline button.moment", "b => b.length")
            assert count == len(stored["trace"])
            other.close()
        finally:
            viewer.close()
