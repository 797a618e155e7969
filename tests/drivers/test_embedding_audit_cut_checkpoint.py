"""A web handler's task cancelled (its client left) while SQLite commits the run's checkpoint.

``SqliteStore`` hands awaited writes to its writer thread; a caller
cancelled after the thread took its write does not withdraw it, so the
write may commit though nobody hears it (``persist/sqlite_writer.py``).
Here another connection to the file (another process, the run viewer)
holds SQLite's write lock as the tool returns, so the writer thread has
taken the tool's checkpoint and waits for the lock when the task is
cancelled; the lock is then let go and the write commits.  The tool counts
its executions.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from support.sqlite_writer import writer_holds_a_write
from support.turn_models import Mailer

from fsm_agent import Agent, CancelToken, RunLeasedError, Session, SqliteStore, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


class OtherWriter:
    """A ``send`` tool (counted) that, as it returns, lets another connection take the file's write lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ran: list[str] = []
        self.db: sqlite3.Connection | None = None
        self.tools = ToolRegistry()
        self.tools.register(self.send)

    def send(self, to: str) -> str:
        """Send a message (counted)."""
        self.ran.append(to)
        if self.db is None:
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.db.execute("BEGIN IMMEDIATE")
        return f"sent to {to}"

    async def locked(self) -> None:
        """Wait until the tool ran and the writer thread has taken its checkpoint."""
        while self.db is None or not writer_holds_a_write():
            await asyncio.sleep(0.005)

    async def let_go(self) -> None:
        """The other writer commits: the store's writer thread goes on and commits the run's checkpoint."""
        assert self.db is not None
        await asyncio.to_thread(self.db.execute, "COMMIT")
        await asyncio.to_thread(self.db.close)


def _model() -> FakeModel:
    return FakeModel(tool_turn(tool_call("send", id="c1", to="ada")), reply("sent"), reply("second turn"))


def test_a_run_whose_task_was_cancelled_while_its_checkpoint_committed_finishes_on_the_next_afinish(
    tmp_path: Path,
) -> None:
    """watching-runs.md: a cancel cutting a checkpoint leaves it for the next afinish() to write; the send runs once."""
    tool = OtherWriter(tmp_path / "runs.db")

    async def main() -> tuple[str | None, str, str | None]:
        store = SqliteStore(tool.path)
        try:
            run = Agent(_model(), tool.tools).start("Mail Ada.", store=store, run_id="r1")
            task = asyncio.create_task(run.afinish())
            await tool.locked()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await tool.let_go()
            result = await run.afinish()
            stored = await store.aload("r1")
        finally:
            await store.aclose()
        return result.final, stored["state"], stored["final"]

    assert asyncio.run(main()) == ("sent", "Done", "sent")
    assert tool.ran == ["ada"]


def test_a_session_turn_cancelled_while_its_checkpoint_committed_raises_the_cancel_and_frees_the_session(
    tmp_path: Path,
) -> None:
    """conversations.md/ag-ui.md: a cut turn is stored as it ends and lets the next turn go at once; no call repeats.

    The cut turn stops before its next call (ag-ui.md): the model is asked once for it, once for the next turn.
    """
    tool = OtherWriter(tmp_path / "runs.db")
    model = Mailer(thanks="second turn")

    async def main() -> tuple[BaseException | None, str, str]:
        store = SqliteStore(tool.path)
        try:
            token = CancelToken()
            session = Session(Agent(model, tool.tools), store, "chat")
            turn = asyncio.create_task(session.arun("Mail Ada.", cancel=token))
            await tool.locked()
            token.cancel("the client closed the stream")
            turn.cancel()  # what an ASGI server does to the handler of a request whose client left
            release = asyncio.create_task(tool.let_go())
            raised: BaseException | None = None
            try:
                await turn
            except BaseException as exc:  # noqa: BLE001 - the test reads which exception the handler saw
                raised = exc
            await release
            first = (await store.aload("chat/1"))["state"]
            try:
                following = (await (await Session.aopen(Agent(model, tool.tools), store, "chat")).arun("Thanks.")).final
            except RunLeasedError as busy:  # the turn is left unfinished, its lease held
                following = f"refused: {busy}"
        finally:
            await store.aclose()
        return raised, first, str(following)

    raised, first, following = asyncio.run(main())
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert first in ("Done", "Failed")
    assert following == "second turn"  # taken at once
    assert tool.ran == ["ada"]
    assert model.asked == ["Mail Ada.", "Thanks."]
