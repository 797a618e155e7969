""" "Re-run from here" pressed twice at once: one fork, run once, and the source's completed call is not made again.

viewer.md ("Re-running, comparing, saving as a test"): a re-run forks the run
at that transition, stores it beside it and runs it to its end; the tool calls
the run already completed are not made again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.fork_agents import ADDED, AFTER_THE_CALL, make, source_run
from support.ui_runs import WAIT, Viewer

from fsm_agent import SqliteStore

pytestmark = pytest.mark.browser


def test_a_double_click_on_rerun_makes_one_fork_that_reuses_the_completed_call(page: Any, tmp_path: Path) -> None:
    """Two clicks before any answer: one fork in the store, done, with the source's answer; add never ran."""
    with SqliteStore(tmp_path / "runs.db") as store:
        source_run(store)
        ADDED.clear()
        viewer = Viewer(store, agent=make(), agent_spec="support.fork_agents:make")
        try:
            page.goto(viewer.url + "run?id=source")
            selector = f"#timeline button.rerun[data-at='{AFTER_THE_CALL}']"
            page.wait_for_selector(selector, timeout=WAIT)
            with page.expect_navigation(timeout=WAIT):
                page.evaluate("s => { const b = document.querySelector(s); b.click(); b.click(); }", selector)
            page.wait_for_selector("#status-badge.status-done", timeout=WAIT)
            forks = [run for run in store.list_runs() if run.forked_from is not None]
            assert [tuple(run.forked_from) for run in forks] == [("source", AFTER_THE_CALL)]
            assert page.url.endswith("run?id=" + forks[0].run_id)
            fork = store.load(forks[0].run_id)
            assert (fork["state"], fork["final"]) == ("Done", store.load("source")["final"])
            assert ADDED == []
        finally:
            viewer.close()
