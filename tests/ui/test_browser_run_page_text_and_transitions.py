"""A run's page in Chromium: every transition on the timeline, every message, call and result, all as text.

Markup and script in a model's text, in a tool call's arguments, in a tool's
result and in a stop's evidence are put on the page as text (never run), and
characters outside the BMP come through unchanged (tutorial viewer.md, "Who
can see it": every string a model or a tool produced is put on the page as
text, never as markup).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import support.viewer_browser  # noqa: F401 - first: outside CI, a missing extra skips this module
from support.ui_runs import WAIT, Viewer

from fsm_agent import Agent, AgentLoopError, SqliteStore, Usage
from fsm_agent.testing import FakeModel, LoopingModel, demo_registry, reply, tool_call, tool_turn

pytestmark = pytest.mark.browser

SCRIPT = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><svg onload="window.__pwned=3">'
ASTRAL = "\U0001f600\U0001d49c\U00010348 \u202etxet"
TEXT = SCRIPT + " " + ASTRAL


def marked_run(store: SqliteStore) -> None:
    """A finished run whose question, tool call, tool result, remark and answer are all markup and astral text."""
    model = FakeModel(
        [
            tool_turn(tool_call("echo", id="call_x", text=TEXT), content=TEXT, usage=Usage(7, 5)),
            reply(TEXT, usage=Usage(11, 3)),
        ]
    )
    Agent(model, demo_registry()).run(TEXT, store=store, run_id="marked")


def looping_run(store: SqliteStore) -> None:
    """A run stopped by repeated_action: its evidence names the call, markup and all."""
    with pytest.raises(AgentLoopError):
        Agent(LoopingModel(tool_call("echo", id="c1", text=TEXT)), demo_registry()).run(
            "again", store=store, run_id="looping"
        )


def no_script_ran(page: Any) -> None:
    """No injected script ran and no element came from stored text."""
    assert page.evaluate("window.__pwned") is None
    found = page.eval_on_selector_all("#main script, #main img, #main [onerror], #main [onload]", "f => f.length")
    assert found == 0


def test_every_transition_message_call_and_result_is_shown_as_stored(page: Any, tmp_path: Path) -> None:
    """The timeline has one entry per stored transition; each message, the call and its result read exactly."""
    with SqliteStore(tmp_path / "runs.db") as store:
        marked_run(store)
        stored = store.load("marked")
        viewer = Viewer(store)
        try:
            page.goto(viewer.url + "run?id=marked")
            page.wait_for_selector("#final", timeout=WAIT)
            assert page.text_content("#final") == TEXT
            buttons = page.eval_on_selector_all("#timeline button.moment", "b => b.map(x => x.dataset.index)")
            assert buttons == [str(i) for i in range(len(stored["trace"]))]
            status = page.text_content("#status")
            assert f"{len(stored['trace'])} transitions" in status
            assert "26 tokens" in status
            # The last transition holds every message: the ones it brought, and the earlier ones folded.
            shown = page.eval_on_selector_all(
                "#detail ol.messages > li pre.text", "texts => texts.map(t => t.textContent)"
            )
            assert sorted(shown) == sorted(m["content"] for m in stored["messages"] if m["content"])
            calls = page.eval_on_selector_all("#detail ol.messages > li pre.call", "c => c.map(x => x.textContent)")
            assert calls == [f"echo({json.dumps({'text': TEXT}, ensure_ascii=False, separators=(',', ':'))})  [call_x]"]
            # The tool edge: its call and its result, as stored.
            tool_edge = next(
                i for i, e in enumerate(stored["trace"]) if e["source"] == "ExecuteTool" and e["dest"] == "AwaitModel"
            )
            page.click(f"#timeline button[data-index='{tool_edge}']")
            page.wait_for_selector("#tool-result", timeout=WAIT)
            assert page.text_content("#tool-result") == json.dumps(TEXT, ensure_ascii=False)
            call = page.text_content("#tool-call")
            assert call.startswith("echo(")
            assert call.endswith(")  [call_x]")
            assert json.loads(call[len("echo(") : -len(")  [call_x]")]) == {"text": TEXT}
            no_script_ran(page)
        finally:
            viewer.close()


def test_a_stop_s_evidence_is_shown_as_text(page: Any, tmp_path: Path) -> None:
    """A repeated_action stop's evidence (the call's arguments) is on the page as text, and ran nothing."""
    with SqliteStore(tmp_path / "runs.db") as store:
        looping_run(store)
        evidence = store.load("looping")["evidence"]
        viewer = Viewer(store)
        try:
            page.goto(viewer.url + "run?id=looping")
            page.wait_for_selector("#evidence", timeout=WAIT)
            text = page.text_content("#evidence")
            assert json.loads(text) == json.loads(json.dumps(evidence))
            assert json.loads(json.loads(text)["signature"]["arguments"]) == {"text": TEXT}
            no_script_ran(page)
        finally:
            viewer.close()


def test_the_list_shows_every_run_with_its_state_reason_pause_and_tokens(page: Any, tmp_path: Path) -> None:
    """Each row of the list says what the store's index says of that run."""
    with SqliteStore(tmp_path / "runs.db") as store:
        marked_run(store)
        looping_run(store)
        Agent(
            FakeModel([tool_turn(tool_call("echo", id="call_1", text="hi"), usage=Usage(2, 1)), reply("x")]),
            demo_registry(),
            approve={"echo"},
        ).run("say hi", store=store, run_id="held")
        listed = {run.run_id: run for run in store.list_runs()}
        viewer = Viewer(store)
        try:
            page.goto(viewer.url)
            page.wait_for_selector("#runs tbody tr", timeout=WAIT)
            rows = page.eval_on_selector_all(
                "#runs tbody tr",
                """rows => rows.map(r => ({
                    id: r.dataset.run,
                    state: r.querySelector('td.state').firstChild.textContent,
                    awaiting: !!r.querySelector('.awaiting'),
                    reason: r.querySelector('td.reason').textContent,
                    cells: [...r.querySelectorAll('td.num')].map(c => c.textContent),
                }))""",
            )
            assert [row["id"] for row in rows] == list(listed)
            for row in rows:
                run = listed[row["id"]]
                assert row["state"] == run.state
                assert row["awaiting"] is run.paused
                assert row["reason"] == (run.reason or "—")
                assert row["cells"] == [str(run.tool_calls), str(run.tokens)]
            assert listed["held"].paused
            assert listed["marked"].tokens == 26
            no_script_ran(page)
        finally:
            viewer.close()
