"""A decision that reaches a turn another request already resumed to its end is told the decision that stood.

Each request builds its own ``Session`` over the shared store, as an app's
handlers do; ``send`` counts its executions per call id.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from fsm_agent import Agent, Session, ToolRegistry
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
