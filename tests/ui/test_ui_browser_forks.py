"""Forks in a real browser: "Re-run from here" on a transition, the fork's page, and the compare view.

The browser and page fixtures are this folder's conftest's (headless Chromium
from the system, a page error fails the test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.fork_agents import ADDED, AFTER_THE_CALL, make_twice, source_run
from support.ui_runs import WAIT, Viewer

from fsm_agent import SqliteStore
from fsm_agent.ui.forks import NO_AGENT

pytestmark = pytest.mark.browser


def test_rerun_from_a_transition_opens_the_fork_which_compares_with_its_source(page: Any, tmp_path: Path) -> None:
    """Re-run from #3 opens the fork's page (forked from source at 3); its compare link shows both, parted at #6."""
    with SqliteStore(tmp_path / "runs.db") as store:
        source_run(store)
        ADDED.clear()
        viewer = Viewer(store, agent=make_twice())
        try:
            page.goto(viewer.url + "run?id=source")
            page.wait_for_selector(f"#timeline button.rerun[data-at='{AFTER_THE_CALL}']", timeout=WAIT)
            page.click(f"#timeline button.rerun[data-at='{AFTER_THE_CALL}']")
            page.wait_for_selector("#forked-from", timeout=WAIT)
            assert page.text_content("#forked-from") == f"forked from source at {AFTER_THE_CALL}"
            assert page.text_content("#run-id") != "source"
            page.wait_for_selector("#status-badge.status-done", timeout=WAIT)
            page.click("#compare-link")
            page.wait_for_selector("#compare", timeout=WAIT)
            assert page.text_content("#column-a h2") == "source"
            assert page.text_content("#first-edge-a") == "#6 Dispatch → Done has_no_tool_calls"
            assert (page.text_content("#first-edge-b") or "").startswith("#6 Dispatch → ExecuteTool")
            assert "forked here" in (page.text_content(f"#column-b li[data-index='{AFTER_THE_CALL}']") or "")
            assert page.text_content("#compare-summary") == (
                "First different transition: #6; first different message: 4 (marked in both columns)."
            )
            assert ADDED == [(3, 3)]
        finally:
            viewer.close()


def test_without_an_agent_rerun_is_disabled_and_says_why(page: Any, tmp_path: Path) -> None:
    """A viewer started without --agent shows each Re-run button disabled, its title saying how to enable it."""
    with SqliteStore(tmp_path / "runs.db") as store:
        source_run(store)
        viewer = Viewer(store)
        try:
            page.goto(viewer.url + "run?id=source")
            page.wait_for_selector("#timeline button.rerun", timeout=WAIT)
            buttons = page.query_selector_all("#timeline button.rerun")
            assert len(buttons) == len(page.query_selector_all("#timeline button.moment")) == 7
            assert all(button.is_disabled() for button in buttons)
            assert buttons[0].get_attribute("title") == NO_AGENT
            assert page.get_attribute("#save-test", "href") == "/api/test?id=source"
        finally:
            viewer.close()
