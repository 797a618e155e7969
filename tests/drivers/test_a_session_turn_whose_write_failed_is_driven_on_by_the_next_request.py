"""A session's turn whose store write failed is kept, and the session's next request drives it on: no call again.

A store error (the database restarting, a dropped connection) reaches the
request that took the turn.  The ``Session`` keeps the turn's run object,
which holds what the failed write held; the next request, the same one
retried or a new message, drives it on first: it writes what it owes, ends
the turn, and only then is the request answered (from that turn, if it is
the same request) or its own turn taken.  Taken over from the store instead,
once its lease lapsed, the turn would make the calls that write held again.
Each tool and model call is counted, on both drivers and both stores.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from support.failing_writes import DROPPED, failing_store

from fsm_agent import Agent, RunResult, Session, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
LEASE = 0.5
"""The turn's lease: short, so another worker may take an abandoned turn over within the test."""


def _agent(made: Counter[str], *script: Any) -> tuple[Agent, FakeModel]:
    """An agent that pays A-1 (counted) and answers, then answers each next message; or its model's ``script``."""
    tools = ToolRegistry()

    @tools.register
    def pay(order: str) -> str:
        """Pay an order (counted)."""
        made[order] += 1
        return f"paid {order}"

    script = script or (
        tool_turn(tool_call("pay", id="c1", order="A-1")),
        reply("Paid A-1."),
        reply("You are welcome."),
        reply("Bye."),
    )
    model = FakeModel(*script)
    return Agent(model, tools), model


def _ask(session: Session, driver: str, text: str, request_id: str | None = None) -> RunResult:
    if driver == "sync":
        return session.run(text, request_id=request_id)
    return asyncio.run(session.arun(text, request_id=request_id))


def _failed(session: Session, driver: str, text: str, request_id: str | None = None) -> None:
    with pytest.raises(ConnectionError, match=DROPPED):
        _ask(session, driver, text, request_id)


@pytest.mark.parametrize("landed", [False, True], ids=["lost", "committed-answer-lost"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_the_same_request_retried_is_answered_from_the_turn_with_no_call_made_again(
    store_target: str, driver: str, landed: bool
) -> None:
    made: Counter[str] = Counter()
    agent, model = _agent(made)
    with failing_store(store_target, fails=1, matching="paid A-1", landed=landed) as store:
        session = Session(agent, store, "chat")
        _failed(session, driver, "Pay A-1.", "req-1")
        assert (dict(made), len(model.seen)) == ({"A-1": 1}, 1)
        again = _ask(session, driver, "Pay A-1.", "req-1")
        stored = store.load("chat/1")
    assert (again.final, stored["state"], session.turns) == ("Paid A-1.", "Done", 1)
    assert (dict(made), len(model.seen)) == ({"A-1": 1}, 2)
    assert [m["content"] for m in stored["messages"] if m["role"] == "tool"] == ['"paid A-1"']


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_new_message_ends_the_owing_turn_first_then_takes_its_own(store_target: str, driver: str) -> None:
    made: Counter[str] = Counter()
    agent, model = _agent(made)
    with failing_store(store_target, fails=1, matching="paid A-1") as store:
        session = Session(agent, store, "chat")
        _failed(session, driver, "Pay A-1.")
        thanks = _ask(session, driver, "Thanks!")
        turns = [store.load(f"chat/{n}")["state"] for n in (1, 2)]
    assert (thanks.final, turns, session.turns) == ("You are welcome.", ["Done", "Done"], 2)
    assert (dict(made), len(model.seen)) == ({"A-1": 1}, 3)
    assert [m.content for m in session.messages if m.role == "assistant" and m.content] == [
        "Paid A-1.",
        "You are welcome.",
    ]


@pytest.mark.parametrize("driver", DRIVERS)
def test_while_the_store_still_fails_each_request_raises_and_makes_no_call(store_target: str, driver: str) -> None:
    made: Counter[str] = Counter()
    agent, model = _agent(made)
    with failing_store(store_target, fails=3, matching="paid A-1") as store:
        session = Session(agent, store, "chat")
        for _ in range(3):
            _failed(session, driver, "Pay A-1.", "req-1")
            assert (dict(made), len(model.seen)) == ({"A-1": 1}, 1)
        assert _ask(session, driver, "Pay A-1.", "req-1").final == "Paid A-1."
    assert (dict(made), len(model.seen)) == ({"A-1": 1}, 2)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_turn_another_worker_took_over_meanwhile_is_let_go_and_read_from_the_store(
    store_target: str, driver: str
) -> None:
    """The other worker took the abandoned turn over (its documented repeat); this session's object makes none."""
    made: Counter[str] = Counter()
    agent, model = _agent(made)
    other_agent, other_model = _agent(made, reply("Paid A-1."))  # it resumes the turn after the model asked
    with failing_store(store_target, fails=1, matching="paid A-1", lease=LEASE) as store:
        session = Session(agent, store, "chat")
        _failed(session, driver, "Pay A-1.", "req-1")
        time.sleep(LEASE * 3)  # the turn's lease lapses: its owner is gone, as far as another worker can tell
        other = Session(other_agent, store, "chat")
        assert _ask(other, driver, "Pay A-1.", "req-1").final == "Paid A-1."  # took the turn over
        assert made == {"A-1": 2}  # the call the failed write held, made again by the other worker
        again = _ask(session, driver, "Pay A-1.", "req-1")
    assert again.final == "Paid A-1."
    assert (dict(made), len(model.seen), len(other_model.seen)) == ({"A-1": 2}, 1, 1)


def _resumed(session: Session, driver: str, approvals: dict[str, Any]) -> RunResult:
    if driver == "sync":
        return session.resume(approvals)
    return asyncio.run(session.aresume(approvals))


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_resume_after_the_failed_write_ends_the_owing_turn_first(store_target: str, driver: str) -> None:
    """The resume finds the turn already ended by the owing object, not taken over: the call is not made again."""
    made: Counter[str] = Counter()
    agent, model = _agent(made)
    with failing_store(store_target, fails=1, matching="paid A-1") as store:
        session = Session(agent, store, "chat")
        _failed(session, driver, "Pay A-1.")
        with pytest.raises(ValueError, match="finished in Done; there is nothing to resume"):
            _resumed(session, driver, {})
        assert store.load("chat/1")["state"] == "Done"
    assert (dict(made), len(model.seen)) == ({"A-1": 1}, 2)


def test_a_request_cut_while_the_owed_write_hangs_keeps_the_turn_for_the_next(store_target: str) -> None:
    """The store still does not answer; the request's task is cancelled (a client that left): the turn stays kept."""
    made: Counter[str] = Counter()
    agent, model = _agent(made)
    with failing_store(store_target, fails=3, matching="paid A-1") as store:
        session = Session(agent, store, "chat")
        _failed(session, "async", "Pay A-1.", "req-1")
        store.hangs = 1.0  # the owed write, and the cut turn's end after it, get no answer before failing

        async def cut_while_hanging() -> None:
            request = asyncio.create_task(session.arun("Pay A-1.", request_id="req-1"))
            assert await asyncio.to_thread(store.hanging.wait, 30)  # in the owed write
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request

        asyncio.run(cut_while_hanging())
        assert (dict(made), len(model.seen)) == ({"A-1": 1}, 1)
        store.hangs = 0.0
        again = _ask(session, "async", "Pay A-1.", "req-1")
        stored = store.load("chat/1")
    assert (again.final, stored["state"]) == ("Paid A-1.", "Done")
    assert (dict(made), len(model.seen)) == ({"A-1": 1}, 2)
