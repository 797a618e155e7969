"""The viewer's words for counts, in a real browser: a step is a model turn, tool calls are counted as such.

The browser and page fixtures are this folder's conftest's (headless Chromium
from the system, a page error fails the test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.ui_runs import WAIT, Viewer

from fsm_agent import Agent, Price, SqliteStore, Usage
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

pytestmark = pytest.mark.browser


def test_the_list_and_the_run_header_count_tool_calls_and_model_turns_apart(page: Any, tmp_path: Path) -> None:
    """Two turns, two tool calls (three Step records): the list shows 2 tool calls, the header 2 steps, 2 tool calls."""
    model = FakeModel([tool_turn(tool_call("add", a=1, b=2), tool_call("add", a=3, b=4)), reply("3 and 7")])
    with SqliteStore(tmp_path / "runs.db") as store:
        Agent(model, demo_registry()).run("two sums", store=store, run_id="two_calls")
        viewer = Viewer(store)
        try:
            page.goto(viewer.url)
            page.wait_for_selector("#runs tbody tr", timeout=WAIT)
            heads = page.eval_on_selector_all("#runs thead th", "cells => cells.map(c => c.textContent.trim())")
            cells = page.eval_on_selector_all("#runs tbody td", "cells => cells.map(c => c.textContent.trim())")
            assert dict(zip(heads, cells, strict=True))["tool calls"] == "2"
            assert "steps" not in heads
            page.goto(viewer.url + "run?id=two_calls")
            page.wait_for_selector("#status", timeout=WAIT)
            status = page.text_content("#status") or ""
            assert ", 2 steps, 2 tool calls, " in status
        finally:
            viewer.close()


def test_a_priced_run_shows_its_cost_in_the_header_and_its_budget_in_the_counters(page: Any, tmp_path: Path) -> None:
    """Stopped on cost_budget: the header says what it cost, the stop's counters show the dollars hitting the budget."""
    turns = [tool_turn(tool_call("add", id=f"c{n}", a=n, b=1), usage=Usage(6, 4)) for n in range(3)]
    model = FakeModel([*turns, reply("never")])
    agent = Agent(model, demo_registry(), cost_budget=0.02, prices=Price(1000, 1000), on_stop={"cost_budget": "return"})
    with SqliteStore(tmp_path / "runs.db") as store:
        agent.run("sums", store=store, run_id="priced")
        viewer = Viewer(store)
        try:
            page.goto(viewer.url + "run?id=priced")
            page.wait_for_selector("#counters", timeout=WAIT)
            assert ", $0.02" in (page.text_content("#status") or "")
            row = "#counters tr[data-counter='cost']"
            cells = page.eval_on_selector_all(f"{row} td", "cells => cells.map(c => c.textContent.trim())")
            assert cells[:2] == ["$0.02", "of $0.02"]
            assert "hit" in (page.get_attribute(row, "class") or "")
        finally:
            viewer.close()


def test_a_session_s_turns_are_grouped_in_the_list(page: Any, tmp_path: Path) -> None:
    """A turn's row links to its session; following it lists that conversation's turns only, under its own title."""
    from fsm_agent import Session

    model = FakeModel([reply("hi"), reply("again"), reply("other")])
    with SqliteStore(tmp_path / "runs.db") as store:
        agent = Agent(model, demo_registry())
        chat = Session(agent, store=store, session_id="chat-1")
        chat.run("hello")
        chat.run("and again")
        Session(agent, store=store, session_id="chat-2").run("someone else")
        viewer = Viewer(store)
        try:
            page.goto(viewer.url)
            page.wait_for_selector("#runs tbody tr", timeout=WAIT)
            assert len(page.query_selector_all("#runs tbody tr")) == 3
            page.click("a.session >> text=session chat-1")
            page.wait_for_selector("#session-title", timeout=WAIT)
            listed = page.eval_on_selector_all("#runs a.run-id", "links => links.map(a => a.textContent)")
            assert sorted(listed) == ["chat-1/1", "chat-1/2"]
            assert "Turns of session chat-1" in (page.text_content("#session-title") or "")
        finally:
            viewer.close()
