"""A task cancelled after one of its run's writes landed: the run is left finished or gone, and free.

An AG-UI client that leaves cancels its handler's task and token
(``agui.server``).  When the cancel lands after a write the store completed
(not in the write itself, ``test_writes_cut_by_a_cancel``), the caller never
gets the run, so nobody goes on with it: left as it was, it would wait
unfinished, leased to an object nobody holds, and the next request would be
refused until the lease lapsed.  Each test drives a real run (scripted
models, a real store: SQLite, then PostgreSQL) whose store keeps one await
waiting until the cancel, counts what each tool did per call id, and checks
the store after: the run ended or deleted, its lease free, the next request
served at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any, TypeVar

import pytest
from support.turn_models import Mailer, sender

from fsm_agent import Agent, CancelToken, ForkEdit, RunStateError, Session, SqliteStore
from fsm_agent.drivers.agent_again import unclaimed
from fsm_agent.persist import PostgresStore, is_url
from fsm_agent.persist.planned import PlannedStore
from fsm_agent.persist.summary import VERSION_KEY
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

S = TypeVar("S", bound=PlannedStore)


def _opened(kind: type[S], target: str) -> S:
    """A ``kind`` store over ``target`` (``store_target``): a SQLite file, or a PostgreSQL database."""
    base = PostgresStore if is_url(target) else SqliteStore
    made: type[S] = type(kind.__name__, (kind, base), {})
    return made(target)


class _Hangs(PlannedStore):
    """A store that keeps one chosen await waiting (before its read or write) until its caller is cancelled.

    ``hang_load`` names a run id whose next ``aload`` hangs, once ``armed``
    (armed by the creation or claim of ``arm_on``); ``hang_release`` hangs
    the next lease release (``arenew(release=True)``) before the store has
    it: a write withdrawn by the cancel, as SQLite's writer queue does with a
    plan it has not taken yet.
    """

    hang_load: str | None = None
    arm_on: str | None = None
    armed = False
    hang_release = False
    reached: asyncio.Event | None = None

    async def acreate(self, run_id: str, snapshot: dict[str, Any], *, owner: str, overwrite: bool = False) -> int:
        seq = int(await super().acreate(run_id, snapshot, owner=owner, overwrite=overwrite))
        if self.arm_on == run_id:
            self.arm_on, self.armed = None, True
        return seq

    async def aclaim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        seq = int(await super().aclaim(run_id, snapshot, owner=owner))
        if self.arm_on == run_id:
            self.arm_on, self.armed = None, True
        return seq

    async def aload(self, run_id: str) -> dict[str, Any]:
        if self.armed and run_id == self.hang_load:
            self.armed = False
            await self._hang()
        return await super().aload(run_id)

    async def arenew(self, run_id: str, *, owner: str, seq: int, release: bool = False) -> None:
        if release and self.hang_release:
            self.hang_release = False
            await self._hang()
        await super().arenew(run_id, owner=owner, seq=seq, release=release)

    async def _hang(self) -> None:
        assert self.reached is not None
        self.reached.set()
        await asyncio.Event().wait()


class _CreateLandsThenHangs(PlannedStore):
    """A store whose creation of run ``fork`` commits, then keeps its caller waiting until it is cancelled."""

    reached: asyncio.Event | None = None

    async def acreate(self, run_id: str, snapshot: dict[str, Any], *, owner: str, overwrite: bool = False) -> int:
        seq = int(await super().acreate(run_id, snapshot, owner=owner, overwrite=overwrite))
        if run_id == "fork" and self.reached is not None and not self.reached.is_set():
            self.reached.set()
            await asyncio.Event().wait()  # the write landed; the caller's await is cut here
        return seq


CANCELS = ("token", "bare")
"""How a test cuts its task: with the run's token cancelled too (as agui.server does), or the task alone."""


def _token(how: str) -> CancelToken | None:
    return CancelToken() if how == "token" else None


async def _cut(task: asyncio.Task[Any], reached: asyncio.Event, token: CancelToken | None) -> BaseException | None:
    """Cancel ``task`` (and ``token``, if any, as agui.server does when a client leaves), once the store holds it."""
    waiting = asyncio.ensure_future(reached.wait())
    await asyncio.wait({waiting, task}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    assert reached.is_set(), f"the store's hang was never reached: {task.exception() if task.done() else task!r}"
    if token is not None:
        token.cancel("the client closed the stream")
    task.cancel()
    try:
        await task
    except BaseException as exc:  # noqa: BLE001 - the test reads what the caller saw
        return exc
    return None


def _free(store: PlannedStore, run_id: str) -> tuple[str, str | None, bool]:
    """Run ``run_id``'s state, reason and paused flag, once a lease taken and given up by another owner shows it free.

    ``renew`` takes a free or lapsed lease and refuses a live one
    (``RunLeasedError``); giving it up at once leaves the run as it was.
    """
    data = store.load(run_id)
    store.renew(run_id, owner="another owner", seq=data[VERSION_KEY])
    store.renew(run_id, owner="another owner", seq=data[VERSION_KEY], release=True)
    return data["state"], data["reason"], bool(data.get("paused"))


def _gone(store: PlannedStore, run_id: str) -> bool:
    try:
        store.load(run_id)
    except KeyError:
        return True
    return False


@pytest.mark.parametrize("how", CANCELS)
def test_a_turn_cut_while_it_checks_the_turn_it_was_built_on_is_forgotten(store_target: str, how: str) -> None:
    """Session.arun stores turn 2, then reads turn 1 again (``_astill_based``); the client leaves during that read.

    Nothing of turn 2 ran and its request answered nobody: it is deleted,
    so the next turn of the session is taken at once, as turn 2.
    """
    made: Counter[str] = Counter()
    model = Mailer()
    store = _opened(_Hangs, store_target)

    async def main() -> tuple[BaseException | None, bool, float, str | None]:
        session = await Session.aopen(Agent(model, sender(made)), store, "chat")
        assert (await session.arun("Mail Ada.")).final == "sent"
        store.reached, store.arm_on, store.hang_load = asyncio.Event(), "chat/2", "chat/1"
        token = _token(how)
        raised = await _cut(asyncio.create_task(session.arun("Thanks.", cancel=token)), store.reached, token)
        gone = _gone(store, "chat/2")
        started = time.monotonic()
        again = await (await Session.aopen(Agent(model, sender(made)), store, "chat")).arun("Thanks.")
        return raised, gone, time.monotonic() - started, again.final

    try:
        raised, gone, took, final = asyncio.run(main())
        assert isinstance(raised, asyncio.CancelledError), repr(raised)
        assert gone, "the cut turn 2 is still stored"
        assert final == "welcome"
        assert took < 5.0, f"the next turn waited {took:.1f}s for the cut turn's lease"
        assert _free(store, "chat/2") == ("Done", "done", False)
        assert model.asked == ["Mail Ada.", "Mail Ada.", "Thanks."]  # the cut turn never asked the model
    finally:
        store.close()
    assert made == Counter({"c1": 1})


@pytest.mark.parametrize("how", CANCELS)
def test_an_answer_cut_while_the_session_looks_for_a_next_turn_is_served_at_once_when_sent_again(
    store_target: str,
    how: str,
) -> None:
    """Session.aresume claims the paused turn, then looks for turn 2 (``_astill_last``); the client leaves there.

    The claim landed, so the turn is ended as one cut inside its claim is
    (test_session_answer_cut_in_its_claim): stopped ``cancelled`` before
    the approved call, its lease given up; the answer sent again is served
    at once and the approved call is made once.
    """
    made: Counter[str] = Counter()
    store = _opened(_Hangs, store_target)
    session = Session(Agent(Mailer(), sender(made), approve={"send"}), store=store, session_id="tab")

    async def go() -> tuple[BaseException | None, tuple[str, str | None, bool], float, str | None]:
        assert (await session.arun("Mail Ada.")).reason == "paused"
        store.reached, store.arm_on, store.hang_load = asyncio.Event(), "tab/1", "tab/2"
        token = _token(how)
        raised = await _cut(asyncio.create_task(session.aresume({"c1": True}, cancel=token)), store.reached, token)
        assert made == Counter()
        cut = _free(store, "tab/1")
        started = time.monotonic()
        again = await session.aresume({"c1": True})
        return raised, cut, time.monotonic() - started, again.final

    try:
        raised, cut, took, final = asyncio.run(go())
    finally:
        store.close()
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert cut == ("Failed", "cancelled", False)
    assert final == "sent"
    assert made == Counter({"c1": 1})
    assert took < 5.0, f"the answer sent again waited {took:.1f}s for the cut claim's lease"


@pytest.mark.parametrize("how", CANCELS)
def test_a_resume_cut_while_it_lets_a_still_paused_run_go_leaves_the_run_free(store_target: str, how: str) -> None:
    """Agent.aresume of a paused run with no decision claims it, then gives its lease up (it is still paused).

    A cancel cuts that release before the store has it.  The caller never
    gets the run, so nobody goes on with it: the release is written again
    out of the cancel's reach, and the run is decided and resumed at once;
    each send runs once.
    """
    made: Counter[str] = Counter()
    store = _opened(_Hangs, store_target)
    model = FakeModel(
        tool_turn(tool_call("send", id="c1", to="ada"), tool_call("send", id="c2", to="bob")), reply("sent")
    )
    agent = Agent(model, sender(made), approve={"send"})

    async def go() -> tuple[BaseException | None, tuple[str, str | None, bool], str | None]:
        paused = await agent.arun("Mail Ada and Bob.", store=store, run_id="r1")
        assert paused.reason == "paused"
        store.reached, store.hang_release = asyncio.Event(), True
        token = _token(how)
        task = asyncio.create_task(agent.aresume(await store.aload("r1"), store=store, cancel=token))
        raised = await _cut(task, store.reached, token)
        cut = _free(store, "r1")
        again = await agent.aresume(await store.aload("r1"), approvals={"c1": True, "c2": True}, store=store)
        return raised, cut, (await again.afinish()).final

    try:
        raised, cut, final = asyncio.run(go())
    finally:
        store.close()
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert cut == ("ExecuteTool", None, True)  # paused before its calls, as it was
    assert final == "sent"
    assert made == Counter({"c1": 1, "c2": 1})


@pytest.mark.parametrize("how", CANCELS)
def test_a_fork_cut_while_it_is_written_is_stopped_and_left_free(store_target: str, how: str) -> None:
    """afork at a stop (its edit lifts max_steps) is cancelled, with its token, as the fork's creation lands.

    The caller never gets the fork, so nobody goes on with it: it is ended
    as ``Agent.aresume``'s cut run is (``astop_cut``), stopped ``cancelled``
    before its model call, its lease given up, so the stored fork can be
    resumed at once; send runs once.
    """
    made: Counter[str] = Counter()
    store = _opened(_CreateLandsThenHangs, store_target)
    agent = Agent(Mailer(), sender(made), max_steps=1, on_stop={"max_steps": "return"})

    async def go() -> tuple[BaseException | None, tuple[str, str | None, bool], str | None]:
        stopped = await agent.arun("Mail Ada.", store=store, run_id="src")
        assert stopped.reason == "max_steps"
        at = len((await store.aload("src"))["trace"]) - 1  # the stop
        store.reached, token = asyncio.Event(), _token(how)
        edit = ForkEdit(limits={"max_steps": 4})
        task = asyncio.create_task(agent.afork("src", at, run_id="fork", store=store, edit=edit, cancel=token))
        raised = await _cut(task, store.reached, token)
        cut = _free(store, "fork")
        again = await agent.aresume(await store.aload("fork"), store=store, max_steps=4)
        return raised, cut, (await again.afinish()).final

    try:
        raised, cut, final = asyncio.run(go())
    finally:
        store.close()
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert cut == ("Failed", "cancelled", False)
    assert final == "sent"
    assert made == Counter({"c1": 1})


def test_a_refusal_after_a_landed_claim_is_no_cancel_even_with_the_token_cancelled(tmp_path: Path) -> None:
    """A ``still`` check that refuses the resume (a ``RunStateError``) after the claim landed is no cut.

    Whoever refuses leaves the run as it must be (a session writes its turn
    back); only a cancel ends a run whose claim landed.  So the refusal
    propagates and the run is not stopped ``cancelled``, even when its
    token was cancelled meanwhile; nothing is called.
    """
    made: Counter[str] = Counter()
    store = SqliteStore(tmp_path / "runs.db")
    agent = Agent(
        FakeModel(tool_turn(tool_call("send", id="c1", to="ada")), reply("sent")), sender(made), approve={"send"}
    )

    async def refuse() -> None:
        raise RunStateError("another owner took the next turn")

    async def go() -> None:
        assert (await agent.arun("Mail Ada.", store=store, run_id="r1")).reason == "paused"
        token = CancelToken()
        token.cancel("the client closed the stream")
        run, expected, entry = unclaimed(agent, await store.aload("r1"), store, None, {"c1": True}, cancel=token)
        with pytest.raises(RunStateError, match="another owner"):
            await run._aclaimed(expected, entry, refuse)  # as a session claims its last turn

    try:
        asyncio.run(go())
        stored = store.load("r1")
    finally:
        store.close()
    assert (stored["state"], stored["reason"]) == ("ExecuteTool", None)
    assert made == Counter()
