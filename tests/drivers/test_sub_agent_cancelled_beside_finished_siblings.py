"""A sub-agent cut by its parent's cancel in a parallel batch whose calls before and after it finished.

Async driver: the parent asks for ``note(a)``, ``helper(c1)`` and ``note(k)``
in one reply; both notes finish, then the token is cancelled while the
child's tool is in flight.  The parent takes ``a``'s outcome and must stop
at ``c1``, leaving it pending.  It used to send ``c1`` again as a batch of
one while the batch's clock was still frozen (``k`` had an outcome waiting),
and the child's stored ``cancelled`` stop came back as the call's answer: a
resume showed the model that error, and the child's work was lost.
Counted: every model call (parent, child), each ``work`` and ``note`` by call id.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from support.cancelled_with_parent import WAIT, ChildModel, Counts, child_tools

from fsm_agent import Agent, AgentLoopError, CancelToken, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class _Parent:
    """Asks ``note(a)``, ``helper(c1)``, ``note(k)`` in one reply; once answered, says ``done``."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.counts.lock:
            self.counts.parent += 1
        if any(m.role == "assistant" for m in messages):
            return reply("done")
        return tool_turn(
            tool_call("note", id="a", text="a"),
            tool_call("helper", id="c1", input="c1"),
            tool_call("note", id="k", text="k"),
        )


def _parent(counts: Counts, notes: Counter[str], noted: threading.Semaphore) -> Agent:
    child = Agent(ChildModel(counts), child_tools(counts, "async"))
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))

    @tools.register
    async def note(text: str, call_id: str) -> str:
        """Take a note."""
        notes[call_id] += 1
        noted.release()
        return f"noted {text}"

    return Agent(_Parent(counts), tools)


def _cancel_when_ready(counts: Counts, noted: threading.Semaphore, token: CancelToken) -> None:
    """Once the child's tool is in flight and both notes ran: cancel the token, then let the tool go."""
    try:
        assert counts.started.acquire(timeout=WAIT)
        assert noted.acquire(timeout=WAIT)
        assert noted.acquire(timeout=WAIT)
        token.cancel("the user pressed stop")
    finally:
        counts.go.set()


def _answers(result: RunResult) -> dict[str, str]:
    return {m.tool_call_id or "": m.content for m in result.messages if m.role == "tool"}


@pytest.mark.parametrize("stored", [True, False], ids=["store", "no-store"])
def test_the_cut_child_stays_pending_and_is_resumed_each_call_once(store_target: str, stored: bool) -> None:
    counts, notes, noted = Counts(), Counter[str](), threading.Semaphore(0)
    token = CancelToken()
    canceller = threading.Thread(target=_cancel_when_ready, args=(counts, noted, token), daemon=True)
    with open_store(store_target) as store:
        kept: Any = store if stored else None
        canceller.start()
        with pytest.raises(AgentLoopError) as stop:
            asyncio.run(_parent(counts, notes, noted).arun("go", cancel=token, store=kept, run_id="p"))
        canceller.join(WAIT)
        counts.hold = False
        cut = stop.value.result
        assert cut.reason == "cancelled"
        assert [call.id for call in cut.pending] == ["c1"]  # k's outcome is kept, to be taken in on resume
        assert cut.snapshot is not None
        assert list(cut.snapshot["ran"]) == ["k"]
        assert _answers(cut) == {"a": '"noted a"'}  # c1 is not answered by its child's stop
        source = store.load("p") if stored else cut

        async def resume() -> RunResult:
            run = await _parent(counts, notes, noted).aresume(source, cancel=CancelToken(), store=kept)
            return await run.afinish()

        result = asyncio.run(resume())
    assert result.final == "done"
    assert _answers(result) == {"a": '"noted a"', "c1": '"found c1"', "k": '"noted k"'}
    assert notes == Counter({"a": 1, "k": 1})
    assert counts.work == Counter({"w-c1": 1})
    # With a store the child's run goes on (its paid first reply kept); without one a new child asks again.
    assert (counts.parent, counts.child) == (2, 2 if stored else 3)
