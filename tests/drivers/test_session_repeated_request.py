"""``Session.run(text, request_id=...)``: the same request asked again is answered from the turn it took.

A web app's request handlers (each building its own ``Session`` over the
shared store) see requests retried: by a proxy, or by a client that lost the
answer.  The turn keeps the request's id; a repeat takes no second turn and
calls nothing, whatever the turn ended with.  The model counts its calls and
every tool its executions per call id.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.app_owners import at_once
from support.sends import SendsPerQuestion, counted_send

from fsm_agent import Agent, AgentLoopError, Session, SqliteStore, ToolRegistry
from fsm_agent.errors import RunLeasedError, RunStateError
from fsm_agent.persist import open_store

TRIALS = 6
"""Races per store: two handlers with the same request at once, each on a fresh conversation."""


@pytest.fixture(params=["in-memory", "stored"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    """No store (one object keeps the conversation) or a SQLite file."""
    return None if request.param == "in-memory" else str(tmp_path / "runs.db")


def test_the_same_request_again_returns_its_turn_and_a_new_one_takes_the_next(target: str | None) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    chat = Session(Agent(model, counted_send(ran, threading.Lock())), store=target, session_id="chat")
    first = chat.run("ada", request_id="r1")
    again = chat.run("ada", request_id="r1")
    assert (first.final, again.final) == ("sent for question 1", "sent for question 1")
    assert (chat.turns, len(model.calls), ran) == (1, 2, Counter({"send-1": 1}))
    assert [m.content for m in chat.messages if m.role == "user"] == ["ada"]
    if target is not None:  # another object, as another worker of the app: the same answer from the store
        other = Session(Agent(model, counted_send(ran, threading.Lock())), store=target, session_id="chat")
        assert other.run("ada", request_id="r1").final == "sent for question 1"
        with SqliteStore(target) as store:
            assert store.load("chat/1")["request_id"] == "r1"
    assert chat.run("bob", request_id="r2").final == "sent for question 2"
    assert chat.run("bob", request_id="r2").final == "sent for question 2"
    assert chat.run("carl").final == "sent for question 3"  # no request_id: every call a turn
    assert (chat.turns, len(model.calls)) == (3, 6)
    assert ran == Counter({"send-1": 1, "send-2": 1, "send-3": 1})


def test_the_same_request_again_after_a_stop_raises_the_stop_again_and_calls_nothing(target: str | None) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    chat = Session(Agent(model, counted_send(ran, threading.Lock()), max_steps=1), store=target, session_id="chat")
    with pytest.raises(AgentLoopError) as first:
        chat.run("ada", request_id="r1")
    with pytest.raises(AgentLoopError) as again:
        chat.run("ada", request_id="r1")
    assert (first.value.reason, again.value.reason) == ("max_steps", "max_steps")
    assert again.value.evidence["limit"] == 1
    assert (chat.turns, len(model.calls), ran) == (1, 1, Counter({"send-1": 1}))
    returned = Session(
        Agent(model, counted_send(ran, threading.Lock()), max_steps=1, on_stop={"max_steps": "return"}),
        store=target,
        session_id="chat",
    )
    if target is not None:  # under a policy that returns the stop, the repeat returns it
        assert returned.run("ada", request_id="r1").reason == "max_steps"
    assert (len(model.calls), ran) == (1, Counter({"send-1": 1}))


def test_the_same_request_again_while_its_turn_is_paused_is_told_the_pause_and_after_the_resume_the_answer(
    target: str | None,
) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    chat = Session(Agent(model, counted_send(ran, threading.Lock()), approve={"send"}), store=target, session_id="chat")
    assert chat.run("ada", request_id="r1").reason == "paused"
    again = chat.run("ada", request_id="r1")
    assert (again.reason, [call.id for call in again.pending]) == ("paused", ["send-1"])
    with pytest.raises(RunStateError, match="paused for a decision"):
        chat.run("bob", request_id="r2")  # another request: refused until the decision, as before
    assert chat.resume({"send-1": True}).final == "sent for question 1"
    assert chat.run("ada", request_id="r1").final == "sent for question 1"  # the resumed turn kept the request
    assert (chat.turns, len(model.calls), ran) == (1, 2, Counter({"send-1": 1}))


def test_the_same_request_again_after_its_turn_was_cancelled_takes_a_new_turn_and_that_is_its_answer(
    target: str | None,
) -> None:
    """A cancelled turn answered nobody: the request takes the next turn, which then answers its repeats."""
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    started = threading.Event()
    registry = ToolRegistry()

    @registry.register
    async def send(to: str, call_id: str) -> str:
        """Send a message (counted); the first one waits until its task is cancelled."""
        if call_id == "send-1" and not started.is_set():
            started.set()
            await asyncio.Event().wait()
        ran[call_id] += 1
        return f"sent to {to}"

    chat = Session(Agent(model, registry), store=target, session_id="chat")

    async def cut_then_again() -> tuple[str, str]:
        turn = asyncio.create_task(chat.arun("ada", request_id="r1"))
        while not started.is_set():
            await asyncio.sleep(0.005)
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        second = await chat.arun("ada", request_id="r1")
        third = await chat.arun("ada", request_id="r1")
        return second.final, third.final

    assert asyncio.run(cut_then_again()) == ("sent for question 2", "sent for question 2")
    assert chat.turns == 2
    assert ran == Counter({"send-2": 1})  # send-1 was cut before it sent
    assert len(model.calls) == 3


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_same_request_again_after_a_ctrl_c_cut_its_store_less_turn_takes_a_new_turn_told_of_the_cut(
    driver: str,
) -> None:
    """Without a store no resume can finish a turn a Ctrl-C cut: like a cancelled one, it answered nobody.

    Its messages are kept, the cut call answered as cut off, so the turn the
    request takes next is asked with them; that turn then answers its repeats.
    """
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted); the first one is cut short, as by Ctrl-C."""
        ran[call_id] += 1
        if call_id == "send-1":
            raise KeyboardInterrupt
        return f"sent to {to}"

    chat = Session(Agent(model, registry), session_id="chat")

    def ask() -> str:
        result = (
            chat.run("ada", request_id="r1") if driver == "sync" else asyncio.run(chat.arun("ada", request_id="r1"))
        )
        return result.final

    with pytest.raises(KeyboardInterrupt):
        ask()
    assert (ask(), ask()) == ("sent for question 2", "sent for question 2")
    assert (chat.turns, len(model.calls)) == (2, 3)
    assert ran == Counter({"send-1": 1, "send-2": 1})
    told = [m for m in model.calls[1] if m.role == "tool"]  # the second turn's first call: the cut call's answer
    assert [m.tool_call_id for m in told] == ["send-1"]
    assert (
        told[0].content == '{"error": "cut off while running (interrupted): it may have run; its outcome is unknown"}'
    )


def test_the_same_request_from_two_handlers_at_once_takes_one_turn_and_sends_once(store_target: str) -> None:
    """Two workers get the same request at the same moment: one takes the turn; the other takes none."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    with open_store(store_target) as store:
        for trial in range(TRIALS):
            model = SendsPerQuestion()
            registry = counted_send(ran, lock, nap=0.01)

            def handler(
                session_id: str = f"chat-{trial}", model: SendsPerQuestion = model, registry: ToolRegistry = registry
            ) -> Any:
                return Session(Agent(model, registry), store=store, session_id=session_id).run("ada", request_id="r1")

            outcomes = at_once(handler, handler)
            answers = [o for o in outcomes if not isinstance(o, BaseException)]
            refusals = [o for o in outcomes if isinstance(o, BaseException)]
            assert answers, outcomes
            assert all(isinstance(o, RunLeasedError) for o in refusals), outcomes  # it was still being taken
            assert {answer.final for answer in answers} == {"sent for question 1"}
            assert [r.run_id for r in store.list_runs(session=f"chat-{trial}")] == [f"chat-{trial}/1"]
            assert len(model.calls) == 2
        assert ran == Counter({"send-1": TRIALS})


def test_the_same_request_again_after_its_owner_died_finishes_its_turn_and_takes_no_other(tmp_path: Path) -> None:
    """A Ctrl-C cut the turn in a call; once its lease lapsed the retried request finishes that turn: its answer."""
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted); the first try is cut short, as by Ctrl-C."""
        ran[call_id] += 1
        if ran[call_id] == 1:
            raise KeyboardInterrupt
        return f"sent to {to}"

    store = SqliteStore(tmp_path / "runs.db", lease=0.3)
    chat = Session(Agent(model, registry), store=store, session_id="chat")
    with pytest.raises(KeyboardInterrupt):
        chat.run("ada", request_id="r1")
    with pytest.raises(RunLeasedError):
        chat.run("ada", request_id="r1")  # its lease is live: it might still be taken
    time.sleep(0.4)
    assert chat.run("ada", request_id="r1").final == "sent for question 1"
    assert [r.run_id for r in store.list_runs(session="chat")] == ["chat/1"]
    assert chat.turns == 1
    assert ran == Counter({"send-1": 2})  # the call cut in flight is made again, as any take-over makes it
    assert len(model.calls) == 2
    store.close()


@pytest.mark.parametrize(
    ("request_id", "error"), [(7, TypeError), ("", ValueError), ("a\x00b", ValueError), ("\ud800", ValueError)]
)
def test_a_request_id_that_is_no_text_a_store_can_hold_is_refused_before_anything_is_called(
    request_id: Any, error: type[Exception]
) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    chat = Session(Agent(model, counted_send(ran, threading.Lock())))
    with pytest.raises(error, match="request_id"):
        chat.run("ada", request_id=request_id)
    assert (chat.turns, len(model.calls), ran) == (0, 0, Counter())
