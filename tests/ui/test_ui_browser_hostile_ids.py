"""Run ids an attacker chose, in a real browser: a right-to-left override, a 1,000-character id; the list stays legible.

The browser and page fixtures are this folder's conftest's (headless Chromium
from the system, a page error fails the test).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.ui_runs import WAIT, Viewer, put_row

from fsm_agent import Agent, Session, SqliteStore
from fsm_agent.testing import FakeModel, demo_registry, reply

pytestmark = pytest.mark.browser

OVERRIDE = "\u202e"
"""RIGHT-TO-LEFT OVERRIDE: unclosed, it reverses every character after it in its paragraph."""
SPOOF = f"{OVERRIDE}fdp.exe"
"""A session id that shows as ``exe.pdf`` where bidi text is not isolated."""
LONG = "r" * 1000
"""A run id of 1,000 characters (a store takes up to 1,024 bytes)."""

# Where each cell of a row is on screen, and what its run link shows and says in its tooltip.
ROW = """row => ({
  link: row.querySelector('a.run-id').getBoundingClientRect().toJSON(),
  text: row.querySelector('a.run-id').textContent,
  title: row.querySelector('a.run-id').title,
  bidi: getComputedStyle(row.querySelector('a.run-id')).unicodeBidi,
  badge: row.querySelector('a.session')?.getBoundingClientRect().toJSON() ?? null,
  badgeText: row.querySelector('a.session')?.textContent ?? null,
  state: row.cells[1].getBoundingClientRect().toJSON(),
})"""


def _row(page: Any, run_id: str) -> dict[str, Any]:
    """Where the row of ``run_id`` lays out its cells (the rows are found by their data-run, as the page sets it)."""
    found: dict[str, Any] = page.evaluate(
        f"""() => {{
          const rows = [...document.querySelectorAll('#runs tbody tr')];
          const row = rows.find(r => r.dataset.run === {json.dumps(run_id)});
          return ({ROW})(row);
        }}"""
    )
    return found


def test_bidi_text_and_a_very_long_id_do_not_garble_the_list(page: Any, tmp_path: Path) -> None:
    """An override in an id stays in its own box, shown as an escape; a long id is cut, whole in its title."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        Session(Agent(FakeModel([reply("hi")]), demo_registry()), store=store, session_id=SPOOF).run("hello")
        Agent(FakeModel([reply("hi")]), demo_registry()).run("go", store=store, run_id="plain")
        put_row(path, LONG, {**store.load("plain"), "run_id": LONG})
        viewer = Viewer(store)
        try:
            page.goto(viewer.url)
            page.wait_for_selector("#runs tbody tr >> nth=2", timeout=WAIT)
            spoofed, long = _row(page, f"{SPOOF}/1"), _row(page, LONG)
            page_width = page.evaluate("() => document.documentElement.clientWidth")
            table_width = page.evaluate("() => document.getElementById('runs').scrollWidth")
        finally:
            viewer.close()
    assert OVERRIDE not in spoofed["text"] + spoofed["badgeText"]
    assert spoofed["text"] == "\\u202efdp.exe/1"
    assert spoofed["title"] == f"{SPOOF}/1"
    assert spoofed["bidi"] in {"isolate", "isolate-override", "plaintext"}
    assert spoofed["badge"]["x"] >= spoofed["link"]["x"] + spoofed["link"]["width"]  # still left to right
    assert long["title"] == LONG
    assert long["link"]["width"] < 500
    assert long["state"]["x"] + long["state"]["width"] <= page_width  # the next column stays on screen
    assert table_width <= page_width
