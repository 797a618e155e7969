"""The run viewer in a real browser: Debian's Chromium, headless, driven by Playwright (no browser download).

Each test serves a store on loopback and checks what a person sees: the run
list, a stopped run's stop edge and evidence, a transition picked on the
timeline, a live run followed to its end, a paused call approved, and a
model's markup shown as text.  Screenshots go to the test's temporary folder;
with ``FSM_AGENT_SCREENSHOTS=DIR`` the list and the run page are also written
there, which is how ``diagrams/ui_list.png`` and ``diagrams/ui_run.png`` are
made: ``FSM_AGENT_SCREENSHOTS=diagrams pytest tests/ui/test_ui_browser.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.ui_runs import HOSTILE, WAIT, Viewer, hostile, live, mail_registry, paused

from fsm_agent import TABLE, Agent, SqliteStore
from fsm_agent.cli.demo import scenarios
from fsm_agent.testing import FakeModel, reply

pytestmark = pytest.mark.browser


@pytest.fixture
def demo_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[SqliteStore]:
    """The demo's five runs and one paused for approval."""
    with SqliteStore(tmp_path / "runs.db") as store:
        scenarios(store)
        paused(store, [], run_id="F_awaiting_approval")
        capsys.readouterr()  # the demo's lines
        yield store


def serve(store: SqliteStore, **options: Any) -> Viewer:
    """Start a viewer; the caller closes it."""
    return Viewer(store, **options)


def shot(page: Any, tmp_path: Path, name: str) -> Path:
    """Save a full-page screenshot to the test's folder (and to $FSM_AGENT_SCREENSHOTS if set)."""
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    extra = os.environ.get("FSM_AGENT_SCREENSHOTS")
    if extra:
        page.screenshot(path=str(Path(extra) / f"{name}.png"), full_page=True)
    assert path.stat().st_size > 10_000
    return path


def classes(page: Any, element_id: str) -> list[str]:
    """The classes of the machine drawing's element with this id (an edge, a junction or a state)."""
    found: list[str] = page.eval_on_selector(f"#machine svg [id='{element_id}']", "e => [...e.classList]")
    return found


def row_of(reason: str) -> int:
    """The index of the (first) default-table row with this reason."""
    return next(i for i, row in enumerate(TABLE.rows) if row.reason == reason)


def test_browser_lists_runs_with_state_reason_steps_tokens_and_age(
    page: Any, demo_store: SqliteStore, tmp_path: Path
) -> None:
    """The list shows every run, newest first, with state, reason, steps, tokens, age, and the paused one marked."""
    viewer = serve(demo_store)
    try:
        page.goto(viewer.url)
        page.wait_for_selector("#runs tbody tr", timeout=WAIT)
        rows = page.eval_on_selector_all(
            "#runs tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent.trim()))"
        )
        assert [row[0] for row in rows] == [
            "F_awaiting_approval",
            "E_done",
            "D_tool_failures",
            "C_max_tokens",
            "B_repeated_action",
            "A_max_steps",
        ]
        first = rows[-1]
        assert first[1:5] == ["Failed", "max_steps", "3", "0"]
        assert first[5].endswith("ago")
        assert rows[0][1] == "ExecuteToolawaiting approval"
        assert page.text_content("#mode") == "read-only"
        page.set_viewport_size({"width": 1280, "height": 400})  # the full-page shot then ends below the list
        shot(page, tmp_path, "ui_list")
    finally:
        viewer.close()


def test_browser_filters_the_list_by_reason(page: Any, demo_store: SqliteStore) -> None:
    """Choosing a reason and Filter leaves only the runs that stopped with it."""
    viewer = serve(demo_store)
    try:
        page.goto(viewer.url)
        page.wait_for_selector("#runs tbody tr", timeout=WAIT)
        page.select_option("#filter-reason", "tool_failures")
        page.click("#filters button")
        page.wait_for_url("**reason=tool_failures**", timeout=WAIT)
        page.wait_for_selector("#runs tbody tr", timeout=WAIT)
        ids = page.eval_on_selector_all("#runs tbody tr a.run-id", "links => links.map(a => a.textContent)")
        assert ids == ["D_tool_failures"]
    finally:
        viewer.close()


def test_browser_stopped_run_lights_its_stop_edge_and_shows_the_evidence(
    page: Any, demo_store: SqliteStore, tmp_path: Path
) -> None:
    """A max_steps run: its stop edge and its state's trunk are lit as the final edge, the evidence is shown."""
    viewer = serve(demo_store)
    try:
        page.goto(viewer.url)
        page.click("text=A_max_steps")
        page.wait_for_selector("#machine svg", timeout=WAIT)
        stop = f"row{row_of('max_steps')}"
        assert {"taken", "final", "selected"} <= set(classes(page, stop))
        assert "final" in classes(page, "stops_ExecuteTool")
        assert "current" in classes(page, "state_Failed")
        assert page.text_content(f"#machine svg [id='{stop}'] text") == "max_steps ×1"
        assert "taken" not in classes(page, f"row{row_of('repeated_action')}")
        evidence = page.text_content("#evidence")
        assert '"turns": 3' in evidence
        assert '"steps": [3, 3]' in evidence
        assert "hit" in (page.get_attribute("#counters tr[data-counter='steps']", "class") or "")
        assert page.text_content("#status-badge") == "stopped"
        shot(page, tmp_path, "ui_run")
    finally:
        viewer.close()


def test_browser_selecting_a_transition_highlights_its_edge_and_shows_its_call(
    page: Any, demo_store: SqliteStore
) -> None:
    """Clicking a Dispatch -> ExecuteTool step lights that edge only and shows the call it dispatched."""
    viewer = serve(demo_store)
    try:
        page.goto(viewer.url + "run?id=A_max_steps")
        page.wait_for_selector("#timeline button", timeout=WAIT)
        page.click("#timeline button[data-index='2']")
        page.wait_for_selector("#timeline button[data-index='2'].selected", timeout=WAIT)
        dispatch = f"row{next(i for i, r in enumerate(TABLE.rows) if str(r) == 'Dispatch->ExecuteTool')}"
        assert "selected" in classes(page, dispatch)
        assert "selected" not in classes(page, f"row{row_of('max_steps')}")
        assert page.text_content("#detail-title") == "#2 Dispatch → ExecuteTool"
        assert "echo(" in page.text_content("#tool-call")
    finally:
        viewer.close()


def test_browser_follows_a_live_run_to_its_end(page: Any, tmp_path: Path) -> None:
    """A run still going is followed as it advances: new transitions appear, then Done lights up, no reload."""
    with SqliteStore(tmp_path / "runs.db") as store:
        model, thread = live(store)
        viewer = serve(store)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    store.load("live")
                    break
                except KeyError:
                    time.sleep(0.05)
            page.goto(viewer.url + "run?id=live")
            page.wait_for_selector("#status-badge", timeout=WAIT)
            assert page.text_content("#status-badge") == "live"
            assert "current" in classes(page, "state_AwaitModel")
            model.release()
            # Selectors, not wait_for_function: the page's Content-Security-Policy forbids the eval it needs.
            page.wait_for_selector("#timeline li:nth-child(4)", timeout=WAIT)
            assert page.text_content("#status-badge") == "live"
            model.release(2)
            page.wait_for_selector("#status-badge.status-done", timeout=WAIT)
            assert "current" in classes(page, "state_Done")
            thread.join(10)
            assert page.eval_on_selector_all("#timeline li", "items => items.length") == len(
                store.load("live")["trace"]
            )
            assert page.text_content("#final") == "done at last"
        finally:
            model.release(5)
            viewer.close()


def test_browser_approves_a_paused_call_and_the_resumed_run_makes_it(page: Any, tmp_path: Path) -> None:
    """With --allow-decisions, Approve records the decision; resuming the stored run sends the email."""
    sent: list[dict[str, str]] = []
    with SqliteStore(tmp_path / "runs.db") as store:
        call_id = paused(store, sent)
        viewer = serve(store, allow_decisions=True)
        try:
            page.goto(viewer.url + "run?id=paused")
            page.wait_for_selector("#approval button.approve", timeout=WAIT)
            assert page.text_content("#status-badge") == "paused"
            page.click("#approval button.approve")
            page.wait_for_selector("#approval .decided", timeout=WAIT)
            assert page.text_content("#approval .decided") == "approved"
            assert page.is_visible("#resume-hint")
        finally:
            viewer.close()
        assert store.load("paused")["approvals"] == {call_id: True}
        agent = Agent(FakeModel([reply("mailed")]), mail_registry(sent), approve={"send_email"})
        assert agent.resume(store.load("paused"), store=store).finish().final == "mailed"
    assert sent == [{"to": "boss@example.com", "body": "the report"}]


def test_browser_read_only_viewer_offers_no_decision(page: Any, tmp_path: Path) -> None:
    """Without --allow-decisions a paused run shows its calls and says how to decide, with no buttons."""
    with SqliteStore(tmp_path / "runs.db") as store:
        paused(store, [])
        viewer = serve(store)
        try:
            page.goto(viewer.url + "run?id=paused")
            page.wait_for_selector("#approval", timeout=WAIT)
            assert page.query_selector("#approval button") is None
            assert "--allow-decisions" in page.text_content("#approval")
            assert "send_email(" in page.text_content("#approval")
        finally:
            viewer.close()


def test_browser_shows_a_script_answer_as_text(page: Any, tmp_path: Path) -> None:
    """A model answer (and a run id) made of markup is shown character for character and never runs."""
    sneaky_id = '<img src=x onerror="window.__pwned = 3">'
    with SqliteStore(tmp_path / "runs.db") as store:
        hostile(store)
        hostile(store, run_id=sneaky_id)
        viewer = serve(store)
        try:
            page.goto(viewer.url)
            page.wait_for_selector("#runs tbody tr", timeout=WAIT)
            assert sneaky_id in page.eval_on_selector_all("#runs a.run-id", "links => links.map(a => a.textContent)")
            page.goto(viewer.url + "run?id=hostile")
            page.wait_for_selector("#final", timeout=WAIT)
            assert page.text_content("#final") == HOSTILE
            assert page.evaluate("window.__pwned") is None
            assert page.eval_on_selector_all("#main script, #main img, #main [onerror]", "found => found.length") == 0
        finally:
            viewer.close()
