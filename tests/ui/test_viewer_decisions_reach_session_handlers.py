"""A person decides a chat's paused turn in the run viewer; the chat app's next request resumes it with a Session.

The viewer is served on loopback with decisions allowed; the app's
handlers build a new ``Session`` per request.  ``send`` counts each
execution per call id.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest
from support.app_owners import at_once, decide
from support.ui_runs import Viewer

from fsm_agent import Agent, RunStateError, Session, SqliteStore, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


def _registry(ran: Counter[str], lock: threading.Lock) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted per call id)."""
        with lock:
            ran[call_id] += 1
        return f"sent to {to}"

    return registry


class Chat:
    """The chat app: one model per conversation, a new ``Session`` per request, over one store."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.ran: Counter[str] = Counter()
        self.registry = _registry(self.ran, threading.Lock())
        self.models: dict[str, FakeModel] = {}

    def session(self, session_id: str) -> Session:
        model = self.models.setdefault(
            session_id,
            FakeModel(tool_turn(tool_call("send", id="s1", to="ada")), reply("Handled."), reply("Next answered.")),
        )
        return Session(Agent(model, self.registry, approve={"send"}), store=self.store, session_id=session_id)


@pytest.fixture
def chat(tmp_path: Path) -> Chat:
    return Chat(SqliteStore(tmp_path / "runs.db"))


def test_an_approval_from_the_viewer_is_what_the_next_request_s_resume_acts_on_and_the_call_runs_once(
    chat: Chat,
) -> None:
    assert chat.session("a").run("mail ada").reason == "paused"
    viewer = Viewer(chat.store, allow_decisions=True)
    try:
        status, page = decide(viewer.url, "a/1", {"call_id": "s1", "approve": True})
    finally:
        viewer.close()
    assert (status, page["approvals"], page["paused"]) == (200, {"s1": True}, True)
    assert chat.ran == Counter()
    result = chat.session("a").resume()
    assert (result.reason, result.final) == ("done", "Handled.")
    assert chat.ran == Counter({"s1": 1})
    assert chat.session("a").run("and now?").final == "Next answered."
    assert chat.ran == Counter({"s1": 1})


def test_a_rejection_from_the_viewer_holds_against_an_approval_sent_by_the_app_and_the_call_never_runs(
    chat: Chat,
) -> None:
    assert chat.session("b").run("mail ada").reason == "paused"
    viewer = Viewer(chat.store, allow_decisions=True)
    try:
        status, _ = decide(viewer.url, "b/1", {"call_id": "s1", "approve": False, "why": "not to ada"})
    finally:
        viewer.close()
    assert status == 200
    with pytest.raises(ValueError, match=r"tool call 's1' was already decided \(rejected: not to ada\)"):
        chat.session("b").resume({"s1": True})
    assert chat.store.load("b/1")["approvals"] == {"s1": "not to ada"}
    with pytest.raises(RunStateError, match=r"turn 1 of session 'b' is paused, its calls decided: resume it"):
        chat.session("b").run("anything else?")
    result = chat.session("b").resume()
    assert result.final == "Handled."
    assert result.messages[-2].content == '{"error": "a person rejected this call to \'send\': not to ada"}'
    assert chat.ran == Counter()


def test_two_viewer_tabs_deciding_a_chat_turn_differently_at_once_leave_one_decision_for_the_app(chat: Chat) -> None:
    """Two people in two tabs: one 200, one 409 naming the decision that stands; the app's resume follows it."""
    viewer = Viewer(chat.store, allow_decisions=True)
    sent = 0
    try:
        for trial in range(10):
            session_id = f"tabs-{trial}"
            assert chat.session(session_id).run("mail ada").reason == "paused"
            run_id = f"{session_id}/1"
            (yes_status, yes_page), (no_status, no_page) = at_once(
                lambda r=run_id: decide(viewer.url, r, {"call_id": "s1", "approve": True}),
                lambda r=run_id: decide(viewer.url, r, {"call_id": "s1", "approve": False, "why": "no"}),
            )
            assert sorted([yes_status, no_status]) == [200, 409], (yes_page, no_page)
            approved = yes_status == 200
            refused = no_page if approved else yes_page
            assert "already decided" in refused["error"]
            result = chat.session(session_id).resume()
            assert result.final == "Handled."
            sent += approved
            assert chat.ran == Counter({"s1": sent} if sent else {})
    finally:
        viewer.close()
