"""A decision that reaches a turn another request already resumed to its end is told the decision that stood.

Each request builds its own ``Session`` over the shared store, as an app's
handlers do; ``send`` counts its executions per call id.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, CancelToken, Session, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


def counted_tools(ran: Counter[str], lock: threading.Lock) -> ToolRegistry:
    """``send`` (held back by the agents below) and ``note`` (never held back), each counted per call id."""
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted per call id)."""
        with lock:
            ran[call_id] += 1
        return f"sent to {to}"

    @registry.register
    def note(text: str, call_id: str) -> str:
        """Note a text (counted per call id)."""
        with lock:
            ran[call_id] += 1
        return text

    return registry


@pytest.mark.parametrize(
    ("first", "late", "told"),
    [
        (True, "not today", "tool call 's1' was already approved and made, and a decision holds: this one (rejected: "),
        (
            "not today",
            True,
            "tool call 's1' was already rejected: not today, and a decision holds: this one (approved)",
        ),
        (False, True, "tool call 's1' was already rejected, and a decision holds: this one (approved) was not taken"),
        (True, True, "tool call 's1' was already approved and made; "),
        ("not today", "not today", "tool call 's1' was already rejected: not today; "),
    ],
    ids=[
        "approved-then-rejected",
        "rejected-then-approved",
        "rejected-without-reason",
        "approved-twice",
        "rejected-twice",
    ],
)
def test_a_late_decision_names_the_decision_that_stood_and_nothing_runs_again(
    store_target: str, first: bool | str, late: bool | str, told: str
) -> None:
    ran: Counter[str] = Counter()
    registry = counted_tools(ran, threading.Lock())
    model = FakeModel(
        tool_turn(tool_call("send", id="s1", to="ada"), tool_call("note", id="n1", text="hi")), reply("Handled.")
    )
    with open_store(store_target) as store:

        def handler() -> Session:
            return Session(Agent(model, registry, approve={"send"}), store=store, session_id="chat")

        assert handler().run("mail ada").reason == "paused"
        assert handler().resume({"s1": first}).final == "Handled."
        made = Counter({"s1": 1, "n1": 1} if first is True else {"n1": 1})
        assert ran == made
        with pytest.raises(ValueError, match="the run finished in Done; there is nothing to resume") as refused:
            handler().resume({"s1": late, "n1": True, "zz": False})
        said = str(refused.value)
        assert told in said
        assert "tool call 'n1' was already made (it needed no decision)" in said
        assert "the run asked for no tool call 'zz'" in said
        assert ran == made
        assert len(model.seen) == 2
        assert [r.run_id for r in store.list_runs(session="chat")] == ["chat/1"]


@pytest.mark.parametrize("stored", [True, False], ids=["store", "no-store"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_same_approval_again_after_a_cancel_stopped_the_turn_past_its_call_says_it_was_made(
    store_target: str, stored: bool, driver: str
) -> None:
    """The approved call came back, then the cancel stopped the turn: the call is no longer pending, and was made.

    The same decision sent again (a retried request) is refused saying so; a
    resume with no decision finishes the turn, the call not made again.
    """
    ran: Counter[str] = Counter()
    token = CancelToken()
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message; the person presses stop as it is sent."""
        ran[call_id] += 1
        token.cancel("stop pressed")
        return f"sent to {to}"

    model = FakeModel(tool_turn(tool_call("send", id="s1", to="ada")), reply("Sent."))
    with open_store(store_target) as store:
        chat = Session(Agent(model, registry, approve={"send"}), store=store if stored else None, session_id="chat")
        assert chat.run("mail ada").reason == "paused"
        with pytest.raises(AgentLoopError) as stop:
            _turn(chat, driver, {"s1": True}, cancel=token)
        assert stop.value.reason == "cancelled"
        with pytest.raises(ValueError, match="tool call 's1' was already approved and made") as refused:
            _turn(chat, driver, {"s1": True})
        assert "no pending tool call has id 's1' (pending: none)" in str(refused.value)
        assert _turn(chat, driver, None).final == "Sent."
    assert ran == Counter({"s1": 1})
    assert len(model.seen) == 2


def _turn(chat: Session, driver: str, approvals: dict[str, bool | str] | None, **how: Any) -> Any:
    if driver == "sync":
        return chat.resume(approvals, **how)
    return asyncio.run(chat.aresume(approvals, **how))
