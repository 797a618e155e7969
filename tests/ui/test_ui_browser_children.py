"""Sub-agent runs in a real browser: from a parent's sub-agent call to the child's page, and back.

The browser and page fixtures are this folder's conftest's (headless Chromium
from the system, a page error fails the test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.ui_runs import WAIT, Viewer

from fsm_agent import Agent, SqliteStore
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

pytestmark = pytest.mark.browser


def test_a_parent_s_sub_agent_call_links_to_the_child_run_and_the_child_back(page: Any, tmp_path: Path) -> None:
    """Selecting the research call shows a link to run p1/c1 (Done); its page names call c1 of p1 and links back."""
    child = Agent(FakeModel(tool_turn(tool_call("echo", text="x")), reply("Paris")), demo_registry())
    registry = demo_registry()
    registry.register(child.as_tool("research", "Answers one research question."))
    model = FakeModel(tool_turn(tool_call("research", id="c1", input="capital of France?")), reply("It is Paris."))
    with SqliteStore(tmp_path / "runs.db") as store:
        Agent(model, registry).run("q", store=store, run_id="p1")
        viewer = Viewer(store)
        try:
            page.goto(viewer.url + "run?id=p1")
            page.wait_for_selector("#timeline button", timeout=WAIT)
            assert page.query_selector("#parent-run") is None
            page.click("#timeline button[data-index='3']")  # ExecuteTool --tool_done--> AwaitModel of call c1
            page.wait_for_selector("#timeline button[data-index='3'].selected", timeout=WAIT)
            assert "research(" in (page.text_content("#tool-call") or "")
            assert page.text_content("#sub-agent-run") == "p1/c1 (Done — done)"
            page.click("#child-link")
            page.wait_for_selector("#parent-run", timeout=WAIT)
            assert page.text_content("#run-id") == "p1/c1"
            assert page.text_content("#parent-run") == "Sub-agent run of call c1 in run p1"
            assert page.query_selector("#children") is None
            page.click("#parent-link")
            page.wait_for_selector("#children", timeout=WAIT)
            assert page.text_content("#run-id") == "p1"
            assert page.query_selector("#parent-run") is None
            assert page.text_content("#children li") == "research [c1] → p1/c1 (Done — done)"
        finally:
            viewer.close()
