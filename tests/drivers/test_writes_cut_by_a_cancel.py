"""A cancel that cuts an awaited checkpoint: the run learns from the store whether the cut write landed.

Both stores can commit a write whose caller was cancelled: SQLite's writer
thread runs a write it took (``test_embedding_audit_cut_checkpoint`` holds
SQLite's lock to get there), and a PostgreSQL statement that ran before
psycopg's cancel reached the server stays committed while its caller hears
the cancel.  Here each store's ``aappend`` of the ``send`` tool's outcome is
held, before its real write (it never lands) or after it (it landed, and the
reply saying so is late), and the task driving the run is cancelled there.
``send`` counts its executions, the model its calls.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from support.turn_models import Mailer, sender

from fsm_agent import Agent, CancelToken, PostgresStore, Session, SqliteStore
from fsm_agent.persist.summary import Entry


def held_store(target: str, landed: bool) -> Any:
    """``target``'s store whose append of the send's outcome is held until cancelled: after its write if ``landed``."""
    base: Any = PostgresStore if target.startswith("postgresql://") else SqliteStore

    class Held(base):  # type: ignore[misc,valid-type]  # either store, the same hold
        held: asyncio.Event | None = None

        async def aappend(self, entry: Entry, *, owner: str) -> None:
            if self.held is not None and not self.held.is_set() and entry.summary.state == "AwaitModel":
                if landed:
                    await super().aappend(entry, owner=owner)  # committed; the caller is cancelled before it hears so
                self.held.set()
                await asyncio.Event().wait()
            await super().aappend(entry, owner=owner)

    return Held(target)


async def _cut(task: asyncio.Task[Any], held: asyncio.Event) -> BaseException | None:
    """Cancel ``task`` once the store holds the send's outcome; what the task raised."""
    await held.wait()
    task.cancel()
    try:
        await task
    except BaseException as exc:  # noqa: BLE001 - the test reads which exception the caller saw
        return exc
    return None


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not landed"])
def test_a_run_whose_checkpoint_a_cancel_cut_finishes_on_its_next_afinish_making_each_call_once(
    store_target: str, landed: bool
) -> None:
    """Landed or not, the next afinish() goes on from the store's version: no StaleRunError, send once, lease free."""
    ran: Counter[str] = Counter()
    model = Mailer()

    async def main() -> tuple[BaseException | None, str | None, dict[str, Any]]:
        store = held_store(store_target, landed)
        store.held = asyncio.Event()
        try:
            run = Agent(model, sender(ran)).start("Mail Ada.", store=store, run_id="r1")
            raised = await _cut(asyncio.create_task(run.afinish()), store.held)
            final = (await run.afinish()).final
            stored = await store.aload("r1")
            seq = stored["stored_seq"]
            await store.aclaim("r1", stored, owner="another")  # the lease was given up: anyone may take the run
        finally:
            await store.aclose()
            if isinstance(store, SqliteStore):
                store.close()
        return raised, final, {"state": stored["state"], "final": stored["final"], "seq": seq}

    raised, final, stored = asyncio.run(main())
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert (final, stored["state"], stored["final"]) == ("sent", "Done", "sent")
    assert ran == Counter({"c1": 1})
    assert model.asked == ["Mail Ada.", "Mail Ada."]


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not landed"])
def test_a_session_turn_whose_checkpoint_a_cancel_cut_stops_before_its_next_call_and_frees_the_session(
    store_target: str, landed: bool
) -> None:
    """ag-ui.md: the write is finished, the run stops cancelled before its next call, the next turn goes at once."""
    ran: Counter[str] = Counter()
    model = Mailer()

    async def main() -> tuple[BaseException | None, tuple[str, str | None], str]:
        store = held_store(store_target, landed)
        store.held = asyncio.Event()
        try:
            token = CancelToken()
            session = Session(Agent(model, sender(ran)), store, "chat")
            turn = asyncio.create_task(session.arun("Mail Ada.", cancel=token))
            await store.held.wait()
            token.cancel("the client closed the stream")
            raised = await _cut(turn, store.held)
            first = await store.aload("chat/1")
            following = await (await Session.aopen(Agent(model, sender(ran)), store, "chat")).arun("Thanks.")
        finally:
            await store.aclose()
            if isinstance(store, SqliteStore):
                store.close()
        return raised, (first["state"], first["reason"]), following.final

    raised, first, following = asyncio.run(main())
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert first == ("Failed", "cancelled")
    assert following == "welcome"
    assert ran == Counter({"c1": 1})
    assert model.asked == ["Mail Ada.", "Thanks."]  # the cut turn asked the model nothing more


def creation_held_store(target: str, landed: bool) -> Any:
    """``target``'s store whose creation of a run is held until cancelled: after its write if ``landed``."""
    base: Any = PostgresStore if target.startswith("postgresql://") else SqliteStore

    class Held(base):  # type: ignore[misc,valid-type]  # either store, the same hold
        held: asyncio.Event | None = None

        async def acreate(self, run_id: str, snapshot: dict[str, Any], *, owner: str, overwrite: bool = False) -> int:
            if self.held is not None and not self.held.is_set():
                seq = await super().acreate(run_id, snapshot, owner=owner, overwrite=overwrite) if landed else 0
                self.held.set()
                await asyncio.Event().wait()
                return seq
            return int(await super().acreate(run_id, snapshot, owner=owner, overwrite=overwrite))

    return Held(target)


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not landed"])
def test_a_session_turn_cut_while_it_was_first_stored_is_ended_and_frees_the_session(
    store_target: str, landed: bool
) -> None:
    """A client that leaves as its turn is created: the turn, if stored, ends cancelled; the next goes at once."""
    ran: Counter[str] = Counter()
    model = Mailer()

    async def main() -> tuple[BaseException | None, list[tuple[str, str, str | None]], str | None]:
        store = creation_held_store(store_target, landed)
        store.held = asyncio.Event()
        try:
            token = CancelToken()
            turn = asyncio.create_task(
                Session(Agent(model, sender(ran)), store, "chat").arun("Mail Ada.", cancel=token)
            )
            await store.held.wait()
            token.cancel("the client closed the stream")
            raised = await _cut(turn, store.held)
            following = await (await Session.aopen(Agent(model, sender(ran)), store, "chat")).arun("Thanks.")
            turns = [(run.run_id, run.state, run.reason) for run in await store.alist_runs(session="chat")]
        finally:
            await store.aclose()
            if isinstance(store, SqliteStore):
                store.close()
        return raised, sorted(turns), following.final

    raised, turns, following = asyncio.run(main())
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    cut = [("chat/1", "Failed", "cancelled")] if landed else []
    assert turns == [*cut, (f"chat/{len(cut) + 1}", "Done", "done")]
    assert following == "welcome"
    assert model.asked == ["Thanks."]
    assert ran == Counter()
