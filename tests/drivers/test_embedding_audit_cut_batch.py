"""A conversation turn whose task is cancelled (its client left) in the middle of a parallel batch.

The async driver runs a reply's calls at once.  When the turn's task is
cancelled while the first call is still in flight, the calls after it that
came back are kept (``evidence["came_back"]``, docs/how-to/async.md): they
ran, and their outcomes are known.  The next turn of the conversation must
not tell the model otherwise, or a model that does what it is told asks for
them again.  The model here does: it asks again for every call the
conversation says was not executed.  ``charge`` counts its executions.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from support.turn_models import RetriesWhatWasNotRun

from fsm_agent import Agent, CancelToken, Session, SqliteStore, ToolRegistry


class Shop:
    """``slow`` (held until cancelled) and ``charge`` (counted per amount), both async, so they run at once."""

    def __init__(self) -> None:
        self.charged: Counter[int] = Counter()
        self.started = asyncio.Event()
        self.tools = ToolRegistry()
        self.tools.register(self.slow)
        self.tools.register(self.charge)

    async def slow(self, n: int) -> str:
        """Wait for a reply that comes late."""
        self.started.set()
        await asyncio.sleep(30)
        return "late"

    async def charge(self, cents: int) -> str:
        """Charge the card (counted)."""
        self.charged[cents] += 1
        return f"charged {cents}"


@pytest.mark.parametrize("kept", ["in a store", "in memory"])
def test_calls_that_came_back_before_a_turn_was_cancelled_are_told_as_run_in_the_next_turn(
    kept: str, tmp_path: Path
) -> None:
    """conversations.md: the next turn tells the model what is known, never that a call that ran was not executed."""
    shop = Shop()
    model = RetriesWhatWasNotRun()

    async def main() -> None:
        store = SqliteStore(tmp_path / "chat.db") if kept == "in a store" else None
        session = Session(Agent(model, shop.tools), store, "chat")
        token = CancelToken()
        turn = asyncio.create_task(session.arun("Charge 2 and 3 cents.", cancel=token))
        await shop.started.wait()
        while len(shop.charged) < 2:
            await asyncio.sleep(0.005)
        token.cancel("the client closed the stream")
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        following = session if store is None else await Session.aopen(Agent(model, shop.tools), store, "chat")
        await following.arun("Did it work?")
        if store is not None:
            await store.aclose()

    asyncio.run(main())
    told = {m.tool_call_id: json.loads(m.content) for m in model.seen[1] if m.role == "tool"}
    assert told["c2"] == "charged 2"
    assert told["c3"] == "charged 3"
    assert shop.charged == Counter({2: 1, 3: 1})
