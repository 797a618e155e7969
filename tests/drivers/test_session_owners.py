"""A Session with two owners: sync and async turns at once, several event loops, owners that died mid-turn.

The turns of one conversation are taken strictly one at a time, whichever
thread, event loop or process asks for them; a turn whose owner died is
finished by the next turn once its lease lapses, no completed tool call made
again; a run at a turn's id that is no turn of the session is refused naming
it; and call ids repeated across turns never break the conversation.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.session_owners import counting_agent

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, RunLeasedError, RunStateError, Session
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

LEASE = 2.0
"""The short lease of the takeover tests.  An interrupted turn's successor is refused about 1 ms after the
interruption (measured), and a killed child's while its heartbeat renews the lease every 0.67 s (it would have
to stall 1.3 s to lose it), so two seconds leave a wide margin on a busy machine; a takeover waits at most that."""

PATIENCE = 60.0
"""How long a test waits for a lapsed lease to be taken over, or for a child process to reach its tool."""


def _calls(counter: str) -> collections.Counter[str]:
    path = Path(counter)
    return collections.Counter(path.read_text(encoding="utf-8").split("\n")[:-1] if path.exists() else [])


def _users(messages: Sequence[Message]) -> collections.Counter[str]:
    return collections.Counter(m.content for m in messages if m.role == "user")


# --- one lock for sync and async turns ---------------------------------------------------------------------------


def _both_drivers_at_once(session: Session, n: int) -> None:
    """``n`` turns with ``run`` from a thread and ``n`` with ``arun`` on an event loop, all at once."""
    errors: list[BaseException] = []

    def sync_turns() -> None:
        try:
            for i in range(n):
                session.run(f"sync {i}")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    async def async_turns() -> None:
        await asyncio.gather(*(session.arun(f"async {i}") for i in range(n)))

    thread = threading.Thread(target=sync_turns)
    thread.start()
    try:
        asyncio.run(async_turns())
    finally:
        thread.join(PATIENCE)
    assert not errors, errors


def test_sync_and_async_turns_of_one_session_at_once_are_taken_one_at_a_time(tmp_path: Path) -> None:
    """Turns from a thread (run) and a loop (arun) at once: each kept once, its tool run once, none interleaved."""
    counter = str(tmp_path / "calls.txt")
    agent, model = counting_agent(counter)
    session = Session(agent)
    n = 10
    _both_drivers_at_once(session, n)
    texts = [f"sync {i}" for i in range(n)] + [f"async {i}" for i in range(n)]
    assert session.turns == 2 * n
    assert _users(session.messages) == collections.Counter(texts)
    assert _calls(counter) == collections.Counter(f"tick {t}" for t in texts)
    firsts = [seen for seen in model.seen if seen[-1].role == "user"]  # each turn's first model call
    assert sorted(len(_users(seen)) for seen in firsts) == list(range(1, 2 * n + 1))  # each saw every earlier turn


def test_sync_and_async_turns_of_one_stored_session_at_once_are_stored_one_after_another(
    store_target: str, tmp_path: Path
) -> None:
    """With a store the same: 2n stored turns, turn k holding the k questions so far, each tool run once."""
    counter = str(tmp_path / "calls.txt")
    agent, _ = counting_agent(counter)
    session = Session(agent, store=store_target, session_id="both")
    n = 4
    _both_drivers_at_once(session, n)
    texts = [f"sync {i}" for i in range(n)] + [f"async {i}" for i in range(n)]
    assert session.turns == 2 * n
    assert _users(session.messages) == collections.Counter(texts)
    assert _calls(counter) == collections.Counter(f"tick {t}" for t in texts)
    with open_store(store_target) as store:
        assert len(store.list_runs(session="both")) == 2 * n
        for k in range(1, 2 * n + 1):
            stored = store.load(f"both/{k}")
            assert stored["state"] == "Done"
            assert sum(1 for m in stored["messages"] if m["role"] == "user") == k


def test_one_session_serves_turns_on_several_event_loops() -> None:
    """Two asyncio.run()s, each with two turns at once, on one Session: no lock is bound to the first loop."""
    agent, _ = counting_agent(os.devnull)
    session = Session(agent)

    async def two(tag: str) -> list[str]:
        results = await asyncio.gather(session.arun(f"{tag} a"), session.arun(f"{tag} b"))
        return [r.final for r in results]

    assert asyncio.run(two("first")) == ["done first a", "done first b"]
    assert asyncio.run(two("second")) == ["done second a", "done second b"]
    assert session.turns == 4


def _held() -> tuple[Session, threading.Event, threading.Thread]:
    """A session whose sync turn "hold" is in its model call on another thread until the event is set."""
    release = threading.Event()
    started = threading.Event()

    class Slow:
        def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
            started.set()
            assert release.wait(PATIENCE)
            return reply("slow")

    session = Session(Agent(Slow(), demo_registry()))
    holder = threading.Thread(target=session.run, args=("hold",))
    holder.start()
    assert started.wait(PATIENCE)
    return session, release, holder


def test_an_async_turn_waiting_for_the_lock_never_blocks_its_event_loop() -> None:
    """While a sync turn holds the session, an awaited turn waits for it and the loop keeps running other tasks."""
    session, release, holder = _held()

    async def main() -> tuple[int, list[str]]:
        waiting = asyncio.create_task(session.arun("after"))
        ticks = 0
        while ticks < 20:  # the loop turns while the awaited turn waits for the sync one
            await asyncio.sleep(0.005)
            ticks += 1
        assert not waiting.done()
        release.set()
        return ticks, [m.content for m in (await waiting).messages if m.role == "user"]

    try:
        assert asyncio.run(main()) == (20, ["hold", "after"])  # the awaited turn came after the sync one, whole
    finally:
        release.set()
        holder.join(PATIENCE)
    assert session.turns == 2


def test_a_cancelled_waiting_turn_leaves_the_session_free() -> None:
    """An awaited turn cancelled while it waits for the session takes no turn and holds nothing afterwards."""
    session, release, holder = _held()

    async def main() -> None:
        waiting = asyncio.create_task(session.arun("never"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    try:
        asyncio.run(main())
    finally:
        release.set()
        holder.join(PATIENCE)
    assert session.run("then").final == "slow"
    assert [m.content for m in session.messages if m.role == "user"] == ["hold", "then"]


# --- a turn whose owner died -------------------------------------------------------------------------------------


def _take_over(turn: Any) -> Any:
    """Ask for the next turn until the dead owner's lease lapses and the turn is taken; the refusals seen first."""
    refusals: list[RunLeasedError] = []
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        try:
            return turn(), refusals
        except RunLeasedError as exc:
            refusals.append(exc)
            time.sleep(0.05)
    pytest.fail(f"still refused after {PATIENCE} s: {refusals[-1] if refusals else None}")


def _check_refusal(refusal: RunLeasedError, run_id: str) -> None:
    text = str(refusal)
    assert refusal.run_id == run_id
    assert refusal.until > 0
    assert "retry" in text, text
    assert "Session.resume()" in text, text


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_turn_interrupted_mid_call_is_finished_by_the_next_once_its_lease_lapses(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """Ctrl-C in a tool: the next turn is refused (retry, Session.resume()) while the lease lives, then finishes it."""
    counter = str(tmp_path / "calls.txt")
    agent, _ = counting_agent(counter, interrupt=str(tmp_path / "interrupted"))
    store = open_store(store_target, lease=LEASE)
    session = Session(agent, store=store, session_id="cut")
    with pytest.raises(KeyboardInterrupt):
        session.run("nap first")
    assert _calls(counter) == {"tick nap first": 1}  # the nap was in flight, never completed
    assert store.load("cut/1")["state"] not in ("Done", "Failed")

    def turn() -> Any:
        if driver == "sync":
            return session.run("then")
        return asyncio.run(session.arun("then"))

    result, refusals = _take_over(turn)
    assert refusals, "the next turn was taken while the interrupted turn's lease was still live"
    _check_refusal(refusals[0], "cut/1")
    assert result.final == "done then"
    # The interrupted turn was finished first: its in-flight nap made again, its completed tick not.
    assert _calls(counter) == {"tick nap first": 1, "nap nap first": 1, "tick then": 1}
    assert session.turns == 2
    assert _users(session.messages) == {"nap first": 1, "then": 1}
    first = store.load("cut/1")
    assert (first["state"], first["final"]) == ("Done", "done nap first")
    assert store.load("cut/2")["state"] == "Done"
    assert Session(agent, store=store, session_id="cut").messages == session.messages
    store.close()


def _interrupted(tmp_path: Path, **options: Any) -> tuple[Session, Any, str]:
    """A stored session whose turn 1 was cut by Ctrl-C in its nap, after its tick was stored; and its store."""
    counter = str(tmp_path / "calls.txt")
    agent, _ = counting_agent(counter, interrupt=str(tmp_path / "interrupted"), **options)
    store = open_store(str(tmp_path / "runs.db"), lease=LEASE)
    session = Session(agent, store=store, session_id="cut")
    with pytest.raises(KeyboardInterrupt):
        session.run("nap first")
    return session, store, counter


@pytest.mark.slow
def test_a_taken_over_turn_that_stops_is_closed_and_the_new_turn_goes_on(tmp_path: Path) -> None:
    """The finished-over turn stops on its own max_steps: stored so, and the new turn is taken, nothing raised."""
    session, store, counter = _interrupted(tmp_path, max_steps=2)
    result, _ = _take_over(lambda: session.run("then"))
    assert result.final == "done then"
    assert (store.load("cut/1")["state"], store.load("cut/1")["reason"]) == ("Failed", "max_steps")
    assert _calls(counter) == {"tick nap first": 1, "nap nap first": 1, "tick then": 1}
    assert [m.role for m in session.messages].count("user") == 2
    store.close()


@pytest.mark.slow
def test_session_resume_finishes_a_turn_whose_owner_died(tmp_path: Path) -> None:
    """Session.resume() takes the unfinished turn over alone once its lease lapses; no completed call made again."""
    session, store, counter = _interrupted(tmp_path)
    result, _ = _take_over(session.resume)
    assert result.final == "done nap first"
    assert session.turns == 1
    assert _calls(counter) == {"tick nap first": 1, "nap nap first": 1}
    store.close()


_CHILD = """
import sys
sys.path.insert(0, {tests!r})
from support.session_owners import counting_agent
from fsm_agent import Session
from fsm_agent.persist import open_store
agent, _ = counting_agent({counter!r}, nap_for=600.0)
Session(agent, store=open_store({target!r}, lease={lease!r}), session_id="killed").run("nap in the child")
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_turn_whose_process_was_killed_is_finished_by_the_next_turn_elsewhere(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SIGKILL while a tool sleeps: refused while its heartbeat lives; then taken over, no completed call made twice."""
    if backend == "sqlite":
        target = str(tmp_path / "runs.db")
    else:
        # A name of its own: the same test twice in one session (a repeat) must not meet its database again.
        target = request.getfixturevalue("postgres_cluster").new_database(f"session_killed_{uuid.uuid4().hex[:12]}")
    counter = str(tmp_path / "calls.txt")
    script = _CHILD.format(tests=str(Path(__file__).resolve().parents[1]), counter=counter, target=target, lease=LEASE)
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + PATIENCE
        while not Path(counter + ".napping").exists():
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            assert time.monotonic() < deadline, "the child never reached its nap"
            time.sleep(0.05)
        store = open_store(target, lease=LEASE)
        agent, _ = counting_agent(counter)
        # The owner lives (its heartbeat renews the lease while the nap sleeps): the turn is refused, untouched.
        with pytest.raises(RunLeasedError) as busy:
            Session(agent, store=store, session_id="killed").run("next")
        _check_refusal(busy.value, "killed/1")
        assert f":{child.pid}:" in busy.value.holder
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(PATIENCE)
        if child.stderr:
            child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    session = Session(agent, store=store, session_id="killed")
    result, _ = _take_over(lambda: session.run("next"))
    assert result.final == "done next"
    assert _calls(counter) == {"tick nap in the child": 1, "nap nap in the child": 1, "tick next": 1}
    assert sorted(r.run_id for r in store.list_runs(session="killed") if r.state == "Done") == ["killed/1", "killed/2"]
    assert _users(session.messages) == {"nap in the child": 1, "next": 1}
    store.close()


def test_a_foreign_run_at_the_next_turn_s_id_is_refused_naming_it(store_target: str) -> None:
    """A run at <session>/<n> that is no turn of the session (no session, or another's) is a clear error, every time."""
    agent = Agent(FakeModel(reply("mine"), reply("theirs"), reply("after")), demo_registry())
    with open_store(store_target) as store:
        agent.run("not a turn", store=store, run_id="talk/1")
        for _ in range(2):  # the same error each time: nothing was written
            with pytest.raises(
                RunStateError, match=r"run 'talk/1' .* not a turn of session 'talk' \(it is of no session"
            ):
                Session(agent, store=store, session_id="talk").run("hello")
        Session(agent, store=store, session_id="other").run("theirs")
        copy = store.load("other/1")
        del copy["stored_seq"]
        store.save("mine/1", copy)
        with pytest.raises(
            RunStateError, match=r"run 'mine/1' .* not a turn of session 'mine' \(it is of session 'other'"
        ):
            Session(agent, store=store, session_id="mine").run("hello")


# --- call ids repeated across turns ------------------------------------------------------------------------------


def _reusing() -> FakeModel:
    """Turn 1 asks ``call_0``; turn 2 asks ``call_1`` and ``call_0`` again, and stops before the second."""
    return FakeModel(
        tool_turn(tool_call("add", id="call_0", a=1, b=2)),
        reply("3"),
        tool_turn(tool_call("add", id="call_1", a=2, b=2), tool_call("add", id="call_0", a=3, b=2)),
        tool_turn(tool_call("add", id="call_0", a=4, b=4)),
        reply("8"),
    )


def _go_on(session: Session, model: FakeModel, unmade: str) -> None:
    """The next turn is taken, sent a conversation where each call is answered once, ``unmade`` as not run."""
    assert session.run("go on").final == "8"
    sent = model.seen[3]  # turn 3's first model call
    asked = [c.id for m in sent for c in m.tool_calls]
    answers = [m for m in sent if m.role == "tool"]
    assert [m.tool_call_id for m in answers] == asked
    assert answers[-1].tool_call_id == unmade
    assert "not executed: the turn stopped (max_tool_calls)" in answers[-1].content


def test_a_stopped_turn_s_unmade_call_reusing_an_answered_id_is_answered_again() -> None:
    """Turn 2 asks call_0 again (an id turn 1 answered) and stops before it: answered as not run, turn 3 goes on."""
    model = _reusing()
    session = Session(Agent(model, demo_registry(), max_tool_calls=1))
    session.run("add")
    with pytest.raises(AgentLoopError) as stopped:
        session.run("add more")
    assert stopped.value.reason == "max_tool_calls"
    (unmade,) = stopped.value.result.pending
    _go_on(session, model, unmade.id)


def test_a_stored_turn_stopped_before_a_call_whose_id_was_answered_before_is_read_back_answered(
    store_target: str,
) -> None:
    """A stored turn 2 pending call_0, answered in turn 1 (as stored before ids were made unique): turn 3 goes on."""
    model = _reusing()
    agent = Agent(model, demo_registry(), max_tool_calls=1)
    Session(agent, store=store_target, session_id="ids").run("add")
    with pytest.raises(AgentLoopError):
        Session(agent, store=store_target, session_id="ids").run("add more")
    with open_store(store_target) as store:
        stored = store.load("ids/2")
        (unmade,) = (call["id"] for call in stored["pending"])
        # The unmade call keeps the id the model gave it, call_0, as a turn stored by an earlier version did.
        store.save("ids/2", json.loads(json.dumps(stored).replace(json.dumps(unmade), json.dumps("call_0"))))
        assert [call["id"] for call in store.load("ids/2")["pending"]] == ["call_0"]
    _go_on(Session(agent, store=store_target, session_id="ids"), model, "call_0")
