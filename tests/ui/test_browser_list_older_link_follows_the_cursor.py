"""The list's "older →" link in a real browser: it carries the last run's cursor, so a changed store repeats nothing.

The browser and page fixtures are this folder's conftest's (headless Chromium
from the system, a page error fails the test).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.ui_runs import WAIT, Viewer

import fsm_agent.ui.app
from fsm_agent import Agent, SqliteStore
from fsm_agent.persist.cursor import RunCursor
from fsm_agent.testing import FakeModel, demo_registry, reply

pytestmark = pytest.mark.browser

ODD = "p2&offset=1#x:é ?"
"""A run id with what a query string and a cursor's text are made of: it must reach the server as it is."""

ROWS = "() => [...document.querySelectorAll('#runs tbody tr')].map(row => row.dataset.run)"


def _answered(store: SqliteStore, run_id: str) -> None:
    Agent(FakeModel([reply("ok")]), demo_registry()).run("q", store=store, run_id=run_id)


def _shown(page: Any, expected: list[str]) -> list[str]:
    """The run ids of the list's rows, once they are ``expected`` (or after WAIT, whatever they are then)."""
    wanted = f"expected => JSON.stringify(({ROWS})()) === JSON.stringify(expected)"
    with contextlib.suppress(Exception):  # the assertion that follows says what was shown instead
        page.wait_for_function(wanted, arg=expected, timeout=WAIT)
    rows: list[str] = page.evaluate(ROWS)
    return rows


def test_older_follows_the_cursor_so_a_run_added_or_saved_meanwhile_is_shown_once(
    page: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of two: page 1, a new run and a save, "older →" gives the next two; "← latest" the list as it is now."""
    monkeypatch.setattr(fsm_agent.ui.app, "PAGE_SIZE", 2)
    with SqliteStore(tmp_path / "runs.db") as store:
        for run_id in ("r0", "r1", ODD, "r3"):
            _answered(store, run_id)
        viewer = Viewer(store)
        try:
            page.goto(viewer.url)
            assert _shown(page, ["r3", ODD]) == ["r3", ODD]
            assert page.query_selector("#page-latest") is None
            assert "runs 1–2" in (page.text_content("nav.pages") or "")
            older = page.get_attribute("#page-older", "href") or ""
            query = parse_qs(urlsplit(older).query)
            assert "offset" not in query
            assert RunCursor.parse(query["after"][0]) == RunCursor.of(store.list_runs(order="created")[1])

            _answered(store, "r4")
            store.save("r1", store.load("r1"))
            page.click("#page-older")
            assert _shown(page, ["r1", "r0"]) == ["r1", "r0"]
            assert page.query_selector("#page-older") is None
            assert "2 older runs" in (page.text_content("nav.pages") or "")

            page.click("#page-latest")
            assert _shown(page, ["r4", "r3"]) == ["r4", "r3"]
            assert "after=" not in page.url
        finally:
            viewer.close()
