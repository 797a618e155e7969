"""An interrupt answer whose task is cancelled while ``Session.aresume`` claims the paused turn.

An AG-UI client that leaves while its answer is being taken cancels the
handler's task with its token (``agui.server``).  The claim's write may
land all the same (``persist/cut_writes``): the turn is then this owner's,
leased, and nobody goes on with it.  The session ends it as it ends a turn
cut in any other write (``astop_cut``): stopped ``cancelled`` before the
approved call, the lease given up, so the answer sent again is served at
once and the call is made once.  The tool counts its executions per call id.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, CancelToken, Session, SqliteStore, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


class ClaimLandsThenHangs(SqliteStore):
    """A store whose next ``aclaim`` commits, then keeps its caller waiting until the caller is cancelled."""

    hang = False
    claimed: asyncio.Event | None = None

    async def aclaim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        seq = await super().aclaim(run_id, snapshot, owner=owner)
        if self.hang and self.claimed is not None:
            self.hang = False
            self.claimed.set()
            await asyncio.Event().wait()  # the write landed; the caller's await is cut here
        return seq


def test_an_answer_cut_while_its_claim_lands_is_served_at_once_when_sent_again(tmp_path: Path) -> None:
    made: Counter[str] = Counter()
    tools = ToolRegistry()

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a message: an effect in the world."""
        made[call_id] += 1
        return f"sent {to}"

    model = FakeModel(tool_turn(tool_call("send", id="s1", to="ada")), reply("sent"))
    store = ClaimLandsThenHangs(tmp_path / "runs.db")
    session = Session(Agent(model, tools, approve={"send"}), store=store, session_id="tab")

    async def go() -> tuple[float, str | None]:
        paused = await session.arun("go")
        assert paused.reason == "paused"
        store.claimed, store.hang = asyncio.Event(), True
        token = CancelToken()
        answer = asyncio.create_task(session.aresume({"s1": True}, cancel=token))
        await store.claimed.wait()
        token.cancel("the client closed the stream")  # as agui.server does when the client leaves
        answer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await answer
        assert made == Counter()  # cut before the approved call started
        started = time.monotonic()
        again = await session.aresume({"s1": True})
        return time.monotonic() - started, again.final

    took, final = asyncio.run(go())
    store.close()
    assert final == "sent"
    assert made == Counter({"s1": 1})
    assert took < 5.0, f"the answer sent again waited {took:.1f}s for the cut claim's lease"
