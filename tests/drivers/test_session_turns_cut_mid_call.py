"""A conversation turn cut while its calls ran: what the next turn is told, and a decision given to it again.

A stop that cuts a call in flight (a deadline, a cancel) cannot know whether
the call had its effect; the calls of the same batch that came back did have
theirs.  The next turn tells the model so, and a decision given again to
the cut turn (a request sent twice) is refused naming the decision that
stood, never resuming the turn to make the call again.  Tools count their
executions per call id.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from support.deadline_cuts import DEADLINE

from fsm_agent import Agent, AgentLoopError, DecisionError, Session, SqliteStore, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


@pytest.mark.slow  # the turn waits for its real deadline (support.deadline_cuts)
@pytest.mark.parametrize("kept", ["in a store", "in memory"])
def test_a_call_that_came_back_beside_one_a_deadline_cut_is_told_with_its_outcome_in_the_next_turn(
    kept: str, tmp_path: Path
) -> None:
    """async.md's ``came_back``: ``c2`` ran, so the next turn gets its result; ``c1`` was cut, told as such."""
    ran: Counter[str] = Counter()
    tools = ToolRegistry()

    @tools.register
    async def slow(call_id: str) -> str:
        """Takes longer than the turn may."""
        ran[call_id] += 1
        await asyncio.sleep(10)
        return "late"

    @tools.register
    async def quick(call_id: str) -> str:
        """Comes back at once."""
        ran[call_id] += 1
        return "quick done"

    model = FakeModel(
        tool_turn(tool_call("slow", id="c1"), tool_call("quick", id="c2")), reply("first"), reply("second")
    )
    agent = Agent(model, tools, timeout=DEADLINE, on_stop={"timeout": "return"})

    async def main() -> str | None:
        store = SqliteStore(tmp_path / "chat.db") if kept == "in a store" else None
        try:
            session = Session(agent, store, "chat")
            cut = await session.arun("Go.")
            assert (cut.reason, cut.evidence["unfinished"], cut.evidence["came_back"]) == ("timeout", "c1", ["c2"])
            return (await session.arun("And?")).final
        finally:
            if store is not None:
                await store.aclose()
                store.close()

    assert asyncio.run(main()) == "first"
    told = {m.tool_call_id: json.loads(m.content) for m in model.seen[1] if m.role == "tool"}
    assert told["c2"] == "quick done"
    assert "cut off while running (timeout)" in told["c1"]["error"]
    assert ran == Counter({"c1": 1, "c2": 1})


@pytest.mark.slow  # the resumed turn waits for its real deadline (support.deadline_cuts)
def test_a_decision_given_again_to_a_turn_whose_approved_call_the_deadline_cut_is_refused_and_nothing_runs_again() -> (
    None
):
    """conversations.md: a decision holds; the approved ``send`` was cut while it ran, so it is not made again."""
    ran: Counter[str] = Counter()
    gate = threading.Event()
    tools = ToolRegistry()

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted); held until the test lets go."""
        ran[call_id] += 1
        gate.wait(10)
        return f"sent to {to}"

    model = FakeModel(tool_turn(tool_call("send", id="s1", to="ada")), reply("sent"), reply("next"))
    session = Session(Agent(model, tools, approve={"send"}, timeout=DEADLINE))
    assert session.run("Mail Ada.").reason == "paused"
    with pytest.raises(AgentLoopError) as stop:
        session.resume({"s1": True})
    assert (stop.value.reason, stop.value.evidence["unfinished"]) == ("timeout", "s1")
    gate.set()  # the cut send goes on in its worker thread, and sends
    for decision in (True, "not now"):
        with pytest.raises(DecisionError, match="tool call 's1' was already approved and started") as late:
            session.resume({"s1": decision})
        assert ("a decision holds" in str(late.value)) == (decision is not True)
        assert late.value.call_id == "s1"
    assert session.run("Anything else?").final == "sent"
    assert ran == Counter({"s1": 1})
    told = [m.content for m in model.seen[-1] if m.role == "tool"]
    assert told == ['{"error": "cut off while running (timeout): it may have run; its outcome is unknown"}']
