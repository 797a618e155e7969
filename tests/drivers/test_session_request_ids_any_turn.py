"""``Session.run(text, request_id=...)``: a request sent again is answered from the turn it took, whichever turn.

docs/how-to/conversations.md, "The same request twice": an idempotency key
holds for any earlier turn, not only the session's last.  A web handler
retried after other requests took turns, or a stalled owner whose turn was
taken over asking again, takes no turn and calls nothing.  Each stored turn
carries the request ids of the turns before it (its snapshot's
``request_turns``), so the answer costs one read more, never a scan.  Every
model call and tool call is counted (per call id), on both drivers and
both stores.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.app_owners import at_once
from support.sends import SendsPerQuestion, counted_send
from support.session_compaction_owners import of_kind
from support.session_request_ids import WAIT, ask, ask_until_free, ledger_agent

from fsm_agent import Agent, AgentLoopError, RunLeasedError, RunResult, Session, StaleRunError
from fsm_agent.drivers import session_requests
from fsm_agent.errors import RunStateError
from fsm_agent.persist import open_store
from fsm_agent.persist.journal import Journal

TRIALS = 4
"""Races per store and driver: two workers repeat an old request as a third takes a new turn."""

LEASE = 0.5
"""The stalled owner's lease: nobody races it while it runs, so a short one risks nothing on a busy machine."""


@pytest.fixture(params=["sync", "async"])
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _agent(ran: Counter[str], model: SendsPerQuestion, **options: Any) -> Agent:
    return Agent(model, counted_send(ran, threading.Lock()), **options)


def _turns(target: str) -> list[str]:
    with open_store(target) as store:
        return sorted(run.run_id for run in store.list_runs(session="chat"))


def test_a_request_sent_again_after_one_later_turn_is_answered_from_its_turn_and_calls_nothing(
    store_target: str, driver: str
) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    agent = _agent(ran, model)
    assert ask(store_target, agent, "ada", "r1", driver).final == "sent for question 1"
    assert ask(store_target, agent, "bob", "r2", driver).final == "sent for question 2"
    again = ask(store_target, agent, "ada", "r1", driver)
    assert again.final == "sent for question 1"
    assert [m.content for m in again.messages if m.role == "user"] == ["ada"]  # turn 1's own result
    assert (len(model.calls), ran) == (4, Counter({"send-1": 1, "send-2": 1}))
    assert _turns(store_target) == ["chat/1", "chat/2"]
    assert ask(store_target, agent, "carl", "r3", driver).final == "sent for question 3"  # the next turn goes on
    assert (len(model.calls), ran) == (6, Counter({"send-1": 1, "send-2": 1, "send-3": 1}))
    with open_store(store_target) as store:
        assert store.load("chat/3")["request_turns"] == {"r1": 1, "r2": 2}


def test_requests_sent_again_after_three_later_turns_are_each_answered_from_their_own_turn(
    store_target: str, driver: str
) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    agent = _agent(ran, model)
    names = ["ada", "bob", "carl", "dora"]
    for n, name in enumerate(names, 1):
        assert ask(store_target, agent, name, f"r{n}", driver).final == f"sent for question {n}"
    for n, name in enumerate(names, 1):
        assert ask(store_target, agent, name, f"r{n}", driver).final == f"sent for question {n}"
    assert (len(model.calls), ran) == (8, Counter({f"send-{n}": 1 for n in range(1, 5)}))
    assert len(_turns(store_target)) == 4
    with open_store(store_target) as store:
        assert Session(agent, store, "chat").turns == 4


def test_an_earlier_turn_that_stopped_raises_its_stop_again_for_its_request_and_calls_nothing(
    store_target: str, driver: str
) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    stops = _agent(ran, model, max_steps=1)
    with pytest.raises(AgentLoopError) as first:
        ask(store_target, stops, "ada", "r1", driver)
    assert first.value.reason == "max_steps"
    assert ask(store_target, _agent(ran, model), "bob", "r2", driver).final == "sent for question 2"
    calls = len(model.calls)
    with pytest.raises(AgentLoopError) as again:
        ask(store_target, stops, "ada", "r1", driver)
    assert (again.value.reason, again.value.evidence["limit"]) == ("max_steps", 1)
    returned = _agent(ran, model, on_stop={"max_steps": "return"})  # its policy returns the stop: returned
    assert ask(store_target, returned, "ada", "r1", driver).reason == "max_steps"
    assert (len(model.calls), ran) == (calls, Counter({"send-1": 1, "send-2": 1}))
    assert len(_turns(store_target)) == 2


def test_an_earlier_request_id_asking_another_question_is_a_value_error_naming_both_and_calls_nothing(
    store_target: str, driver: str
) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    agent = _agent(ran, model)
    ask(store_target, agent, "ada", "r1", driver)
    ask(store_target, agent, "bob", "r2", driver)
    with pytest.raises(ValueError, match=r"request_id 'r1' took a turn of session 'chat' that asked 'ada'.*'eve'"):
        ask(store_target, agent, "eve", "r1", driver)
    assert (len(model.calls), ran) == (4, Counter({"send-1": 1, "send-2": 1}))
    assert len(_turns(store_target)) == 2


def test_an_earlier_request_is_answered_while_the_last_turn_is_paused_for_a_decision(
    store_target: str, driver: str
) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    ask(store_target, _agent(ran, model), "ada", "r1", driver)
    gated = _agent(ran, model, approve={"send"})
    assert ask(store_target, gated, "bob", "r2", driver).reason == "paused"
    assert ask(store_target, gated, "ada", "r1", driver).final == "sent for question 1"  # not refused as paused
    with pytest.raises(RunStateError, match="paused for a decision"):
        ask(store_target, gated, "carl", "r3", driver)  # a new request still is
    assert (len(model.calls), ran) == (3, Counter({"send-1": 1}))


def test_two_workers_sending_an_old_request_at_once_as_a_third_takes_a_new_turn_are_answered_and_nothing_runs_twice(
    store_target: str, driver: str
) -> None:
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    for trial in range(TRIALS):
        model = SendsPerQuestion()
        agent = Agent(model, counted_send(ran, lock, nap=0.01))  # the new turn's send overlaps the repeats
        target, session_id = store_target, f"chat-{trial}"

        def one(
            text: str, request_id: str, agent: Agent = agent, target: str = target, session_id: str = session_id
        ) -> Any:
            if driver == "sync":
                with open_store(target) as store:
                    return Session(agent, store, session_id).run(text, request_id=request_id)

            async def go() -> Any:
                store = open_store(target)
                try:
                    return await (await Session.aopen(agent, store, session_id)).arun(text, request_id=request_id)
                finally:
                    await store.aclose()
                    store.close()

            return asyncio.run(go())

        one("ada", "r1")
        one("bob", "r2")
        outcomes = at_once(lambda: one("ada", "r1"), lambda: one("ada", "r1"), lambda: one("carl", "r3"))
        assert [getattr(o, "final", o) for o in outcomes] == [
            "sent for question 1",
            "sent for question 1",
            "sent for question 3",
        ]
        assert len(model.calls) == 6  # two per turn taken, none for the repeats
        with open_store(target) as store:
            assert sorted(r.run_id for r in store.list_runs(session=session_id)) == [
                f"{session_id}/{n}" for n in (1, 2, 3)
            ]
    assert ran == Counter({"send-1": TRIALS, "send-2": TRIALS, "send-3": TRIALS})


_CHILD = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from support.session_request_ids import ledger_agent
from fsm_agent import Session, StaleRunError
from fsm_agent.persist import open_store
agent = ledger_agent({ledger!r}, {flag!r})
store = open_store({target!r}, lease={lease!r})
session = Session(agent, store, "chat")
session.run("ada", request_id="r1")
def ask():
    if {driver!r} == "sync":
        return session.run("bob", request_id="r2")
    return asyncio.run(session.arun("bob", request_id="r2"))
try:
    told = "answered: " + str(ask().final)
except StaleRunError as exc:
    told = "stale " + str(exc)
    told += " | again: " + str(ask().final) + " | " + str(session.turns)
with open({flag!r} + ".told", "w", encoding="utf-8") as file:
    file.write(told)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("owner", ["sync", "async"])
def test_a_stalled_owner_asking_its_request_again_after_the_session_moved_on_is_answered_from_its_turn(
    store_target: str, tmp_path: Path, driver: str, owner: str
) -> None:
    """SIGSTOP in turn 2's last model call; another owner finishes turn 2 and takes turn 3; woken, r2 is answered."""
    ledger, flag = str(tmp_path / "ledger"), str(tmp_path / "hold")
    script = _CHILD.format(
        tests=str(Path(__file__).resolve().parents[1]),
        ledger=ledger,
        flag=flag,
        target=store_target,
        lease=LEASE,
        driver=driver,
    )
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + WAIT
        while not Path(flag + ".entered").exists():
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            assert time.monotonic() < deadline, "the child never reached its held call"
            time.sleep(0.01)
        child.send_signal(signal.SIGSTOP)
        third = ask_until_free(store_target, ledger_agent(ledger), "carl", "r3", owner, child.pid, LEASE)
        assert third.final == "sent for question 3"  # after turn 2, which it finished first
        before = of_kind(ledger, "model") + of_kind(ledger, "tool")
        Path(flag + ".go").touch()
    finally:
        child.send_signal(signal.SIGCONT)
        child.wait(WAIT)
    error = child.stderr.read().decode() if child.stderr else ""
    if child.stderr:
        child.stderr.close()
    assert child.returncode == 0, error
    told, again = Path(flag + ".told").read_text(encoding="utf-8").split(" | again: ")
    assert again == "sent for question 2 | 3"  # its own answer, from turn 2; its session read all three turns
    assert told.startswith("stale turn 2 of session 'chat' was taken over by another owner"), told
    assert "the same request_id is answered from it" in told, told
    assert of_kind(ledger, "model") + of_kind(ledger, "tool") == before  # nothing called for the repeat
    # 2b twice: the stalled owner's call in flight, and the new owner's (its outcome was never stored).
    assert of_kind(ledger, "model") == Counter({"1a": 1, "1b": 1, "2a": 1, "2b": 2, "3a": 1, "3b": 1})
    assert of_kind(ledger, "tool") == Counter({"send-1": 1, "send-2": 1, "send-3": 1})
    assert _turns(store_target) == ["chat/1", "chat/2", "chat/3"]


def test_an_old_format_session_without_request_turns_still_takes_turns_and_answers_its_last_turn_repeats(
    store_target: str, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Turns stored before ``request_turns`` existed: read as none; from the next turn on, the last one is kept."""
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    agent = _agent(ran, model)
    with monkeypatch.context() as old:
        old.setattr(Journal, "name_requests", lambda self, turns: None)  # as a writer that knows no such field
        ask(store_target, agent, "ada", "r1", driver)
        ask(store_target, agent, "bob", "r2", driver)
        with open_store(store_target) as store:
            assert "request_turns" not in store.load("chat/2")
        assert ask(store_target, agent, "bob", "r2", driver).final == "sent for question 2"
    assert ask(store_target, agent, "bob", "r2", driver).final == "sent for question 2"  # the last turn: as before
    assert (len(model.calls), ran) == (4, Counter({"send-1": 1, "send-2": 1}))
    assert ask(store_target, agent, "carl", "r3", driver).final == "sent for question 3"
    assert ask(store_target, agent, "bob", "r2", driver).final == "sent for question 2"  # carried by turn 3
    assert (len(model.calls), ran) == (6, Counter({"send-1": 1, "send-2": 1, "send-3": 1}))
    with open_store(store_target) as store:
        assert store.load("chat/3")["request_turns"] == {"r2": 2}


def test_past_the_request_ids_kept_an_older_request_is_a_new_turn(
    store_target: str, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound (``REQUESTS_KEPT``, 1000 turns' ids), made 2 here: the request of the turn before them is unknown."""
    monkeypatch.setattr(session_requests, "REQUESTS_KEPT", 2)
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    agent = _agent(ran, model)
    for n, name in enumerate(["ada", "bob", "carl", "dora"], 1):
        ask(store_target, agent, name, f"r{n}", driver)
    with open_store(store_target) as store:
        assert store.load("chat/4")["request_turns"] == {"r2": 2, "r3": 3}
    assert ask(store_target, agent, "bob", "r2", driver).final == "sent for question 2"
    assert (len(model.calls), ran["send-2"]) == (8, 1)
    assert ask(store_target, agent, "ada", "r1", driver).final == "sent for question 5"  # r1 forgotten: a new turn
    assert len(_turns(store_target)) == 5


def test_a_request_whose_turn_is_gone_from_the_store_is_refused_and_nothing_is_called(
    store_target: str, driver: str
) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    agent = _agent(ran, model)
    ask(store_target, agent, "ada", "r1", driver)
    ask(store_target, agent, "bob", "r2", driver)
    with open_store(store_target) as store:
        store.delete("chat/1")
    with pytest.raises(RunStateError, match=r"request_id 'r1' took turn 1 of session 'chat'.*no longer holds"):
        ask(store_target, agent, "ada", "r1", driver)
    assert (len(model.calls), ran) == (4, Counter({"send-1": 1, "send-2": 1}))


def test_without_a_store_a_request_sent_again_after_later_turns_is_answered_from_its_turn(driver: str) -> None:
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    chat = Session(_agent(ran, model), session_id="chat")

    def one(text: str, request_id: str) -> RunResult:
        if driver == "sync":
            return chat.run(text, request_id=request_id)
        return asyncio.run(chat.arun(text, request_id=request_id))

    for n, name in enumerate(["ada", "bob", "carl"], 1):
        one(name, f"r{n}")
    assert one("ada", "r1").final == "sent for question 1"
    assert one("bob", "r2").final == "sent for question 2"
    with pytest.raises(ValueError, match="request_id 'r1'"):
        one("eve", "r1")
    assert (chat.turns, len(model.calls), ran) == (3, 6, Counter({"send-1": 1, "send-2": 1, "send-3": 1}))


def test_session_resume_refused_by_a_live_owner_is_told_as_a_turn_still_being_taken(
    store_target: str, driver: str
) -> None:
    """As ``run`` is told: the turn, the session, its holder; nothing called by the refused resume."""
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    hold = threading.Event()
    agent = Agent(model, counted_send(ran, threading.Lock(), hold=hold))
    first: list[Any] = []
    owner = threading.Thread(target=lambda: first.append(ask(store_target, agent, "ada", "r1", "sync")), daemon=True)
    owner.start()
    try:
        deadline = time.monotonic() + WAIT
        while len(model.calls) < 1 or not _turns(store_target):  # turn 1 stored, its send waiting for hold
            assert time.monotonic() < deadline, "the first owner never took its turn"
            time.sleep(0.01)

        def resume() -> Any:
            if driver == "sync":
                with open_store(store_target) as store:
                    return Session(agent, store, "chat").resume()

            async def go() -> Any:
                store = open_store(store_target)
                try:
                    return await (await Session.aopen(agent, store, "chat")).aresume()
                finally:
                    await store.aclose()
                    store.close()

            return asyncio.run(go())

        with pytest.raises(RunLeasedError, match=r"turn 1 of session 'chat' is still being taken by ") as refused:
            resume()
        assert not isinstance(refused.value, StaleRunError)
        assert refused.value.run_id == "chat/1"
    finally:
        hold.set()
        owner.join(WAIT)
    assert first[0].final == "sent for question 1"
    assert (len(model.calls), ran) == (2, Counter({"send-1": 1}))


def test_a_turn_resumed_by_the_agent_itself_keeps_the_request_ids_it_carries(store_target: str, driver: str) -> None:
    """``agent.resume`` of a stored turn (as ``fsm-agent runs resume`` does) writes ``request_turns`` back with it.

    Dropped, the turns after it would lose the earlier ids, and a retried
    request would take a new turn and send again.
    """
    ran: Counter[str] = Counter()
    model = SendsPerQuestion()
    assert ask(store_target, _agent(ran, model), "ada", "r1", driver).final == "sent for question 1"
    with pytest.raises(AgentLoopError):
        ask(store_target, _agent(ran, model, max_steps=1), "bob", "r2", driver)
    with open_store(store_target) as store:
        assert store.load("chat/2")["request_turns"] == {"r1": 1}
        lifted = _agent(ran, model)
        if driver == "sync":
            assert lifted.resume(store.load("chat/2"), store=store, max_steps=5).finish().final == "sent for question 2"
        else:

            async def go() -> RunResult:
                return await (await lifted.aresume(await store.aload("chat/2"), store=store, max_steps=5)).afinish()

            assert asyncio.run(go()).final == "sent for question 2"
        assert store.load("chat/2")["request_turns"] == {"r1": 1}
    calls = len(model.calls)
    assert ask(store_target, _agent(ran, model), "ada", "r1", driver).final == "sent for question 1"
    assert ask(store_target, _agent(ran, model), "carl", "r3", driver).final == "sent for question 3"
    with open_store(store_target) as store:
        assert store.load("chat/3")["request_turns"] == {"r1": 1, "r2": 2}
    assert len(model.calls) == calls + 2  # the repeat called nothing; turn 3 asked and answered
    assert ran == Counter({"send-1": 1, "send-2": 1, "send-3": 1})
