"""A Session turn whose owner process died or stalled in its summary call, then continued by other owners.

docs/how-to/long-runs.md: "A store writes it as soon as compact returns,
before the call it shortens: a process that dies in that call does not
compact again on resume (a summary written by another model is paid once)";
docs/how-to/conversations.md, "A turn whose owner died".  The owner is a
child process: killed (``os._exit``) inside ``compact`` or in the call after
it, or stopped (SIGSTOP) inside ``compact`` until its lease lapses and then
let go on.  Every model call, summary and tool call, in any process, is
counted in one ledger (``support.session_compaction_owners``).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.session_compaction_owners import (
    WAIT,
    Hold,
    calls_of,
    compaction_agent,
    of_kind,
    record_of,
    stored_head,
    tools_of,
    whole,
)

from fsm_agent import RunLeasedError, RunResult, Session
from fsm_agent.persist import open_store

pytestmark = pytest.mark.subprocess

LEASE = 0.5
"""The lease of a dead or stopped owner: a new owner takes its turn over half a second after its last renewal.
Nobody races the child while it is alive and running, so a short lease risks nothing on a busy machine."""

_CHILD = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from support.session_compaction_owners import Hold, compaction_agent
from fsm_agent import Session, TurnTakenError
from fsm_agent.persist import open_store
hold = Hold("two", {flag!r}, kill={kill!r}) if {held!r} else None
agent = compaction_agent({ledger!r}, hold, awaited={driver!r} == "async", kill_on_summary={kill_on_summary!r})
store = open_store({target!r}, lease={lease!r})
session = Session(agent, store, "chat")
session.run("one")
def ask():
    if {driver!r} == "sync":
        return session.run("two", request_id="r-two")
    return asyncio.run(session.arun("two", request_id="r-two"))
try:
    told = "answered: " + str(ask().final)
except BaseException as exc:
    told = ("stale " if type(exc) is TurnTakenError else type(exc).__name__ + " ") + str(exc)
    if {again!r}:
        told += " | again: " + str(ask().final) + " | " + repr([(m.role, m.content) for m in session.messages])
with open({flag!r} + ".told", "w", encoding="utf-8") as file:
    file.write(told)
"""


@pytest.fixture
def target(store_target: str) -> str:
    """Where the owners keep the session: a fresh SQLite file, then a fresh PostgreSQL database."""
    return store_target


def _child(
    target: str,
    tmp_path: Path,
    driver: str,
    *,
    kill: bool = False,
    kill_on_summary: str | None = None,
    again: bool = False,
) -> Any:
    """The first owner, a child process: takes turn 1, then turn 2 on ``driver``.

    Its ``compact`` for turn 2 ends the process (``kill``), or is held until
    the file ``hold.go`` exists; with ``kill_on_summary`` it is not held, and
    the model call after it ends the process.  Turn 2 is asked with
    ``request_id="r-two"``; ``again``: asked again so when it raised.
    """
    script = _CHILD.format(
        tests=str(Path(__file__).resolve().parents[1]),
        flag=str(tmp_path / "hold"),
        kill=kill,
        held=kill_on_summary is None,
        again=again,
        ledger=str(tmp_path / "ledger"),
        driver=driver,
        kill_on_summary=kill_on_summary,
        target=target,
        lease=LEASE,
    )
    return subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)


def _died(child: Any) -> None:
    """Wait for the child to end by its own ``os._exit(9)``."""
    child.wait(WAIT)
    error = child.stderr.read().decode() if child.stderr else ""
    if child.stderr:
        child.stderr.close()
    assert child.returncode == 9, error


def _wait_for(path: Path, child: Any) -> None:
    deadline = time.monotonic() + WAIT
    while not path.exists():
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        assert time.monotonic() < deadline, f"the child never made {path.name}"
        time.sleep(0.01)


def _next_turn(
    target: str, ledger: str, driver: str, hold: Hold | None = None, dead: int | None = None, *, resume: bool = False
) -> Any:
    """A new owner (a Session and a store object of its own) asks turn "three" (or ``resume``) on ``driver``.

    While the dead owner's lease (``dead``: its pid) is live it asks again;
    a refusal naming another holder is returned, as the answer would be.
    """

    def still_dead_owner(refusal: RunLeasedError) -> bool:
        return dead is not None and f":{dead}:" in refusal.holder

    agent = compaction_agent(ledger, hold)
    deadline = time.monotonic() + WAIT
    if driver == "sync":
        with open_store(target, lease=LEASE) as store:
            while True:
                try:
                    session = Session(agent, store, "chat")
                    return session.resume() if resume else session.run("three")
                except RunLeasedError as refusal:
                    if not still_dead_owner(refusal):
                        return refusal
                assert time.monotonic() < deadline, "the dead owner's lease never lapsed"
                time.sleep(0.02)

    async def go() -> Any:
        store = open_store(target, lease=LEASE)
        try:
            while True:
                try:
                    session = await Session.aopen(agent, store, "chat")
                    return await (session.aresume() if resume else session.arun("three"))
                except RunLeasedError as refusal:
                    if not still_dead_owner(refusal):
                        return refusal
                assert time.monotonic() < deadline, "the dead owner's lease never lapsed"
                await asyncio.sleep(0.02)
        finally:
            await store.aclose()
            store.close()

    return asyncio.run(go())


def _check_the_record(target: str, ledger: str, summary: str) -> None:
    """Turns 1 to 3 as one conversation, for any owner reading it; turn 2 compacted to one summary."""
    with open_store(target) as store:
        second = store.load("chat/2")
        assert (second["state"], second["final"]) == ("Done", "noted two")
        assert stored_head(second) == [summary, "two"]
        assert record_of(Session(compaction_agent(ledger), store, "chat").messages) == whole("one", "two", "three")


_SUMMARY = 'summary: one |  | "a-one done" |  | "b-one done" | noted one | two |  | "a-two done"'


@pytest.mark.parametrize("racers", [("sync", "async"), ("async", "async"), ("sync", "sync")])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_turn_killed_in_its_summary_call_is_summarized_once_more_by_one_of_two_racing_new_owners(
    target: str, tmp_path: Path, driver: str, racers: tuple[str, str]
) -> None:
    """Killed inside ``compact``: of two new owners racing, one finishes turn 2 (its summary paid once more)."""
    ledger = str(tmp_path / "ledger")
    child = _child(target, tmp_path, driver, kill=True)
    _died(child)
    assert of_kind(ledger, "summary") == {"two": 1}  # made, never written: the process died in it
    assert of_kind(ledger, "tool") == Counter({"a-one": 1, "b-one": 1, "a-two": 1})

    hold = Hold("two")  # whichever new owner compacts turn 2 holds its summary until the other was refused
    outcomes: list[Any] = [None, None]
    start = threading.Barrier(2)

    def race(i: int) -> None:
        start.wait(WAIT)
        try:
            outcomes[i] = _next_turn(target, ledger, racers[i], hold, dead=child.pid)
        except BaseException as exc:  # noqa: BLE001 - the test raises it
            outcomes[i] = exc

    threads = [threading.Thread(target=race, args=(i,), daemon=True) for i in (0, 1)]
    for thread in threads:
        thread.start()
    try:
        assert hold.entered.wait(WAIT), "no new owner took the dead owner's turn over"
        deadline = time.monotonic() + WAIT
        while not any(isinstance(outcome, BaseException) for outcome in outcomes):
            assert time.monotonic() < deadline, f"the other new owner was never refused: {outcomes}"
            time.sleep(0.01)
    finally:
        hold.release.set()
        for thread in threads:
            thread.join(WAIT)
    answered = [o for o in outcomes if isinstance(o, RunResult)]
    refused = [o for o in outcomes if isinstance(o, RunLeasedError)]
    assert len(answered) == 1, outcomes
    assert len(refused) == 1, outcomes
    assert answered[0].final == "noted three"  # its own question, after the turn it finished
    assert refused[0].run_id == "chat/2"
    assert of_kind(ledger, "summary") == {"two": 2, "three": 1}  # the killed one, then one more: never a third
    assert of_kind(ledger, "model") == calls_of("one", "two", "three")  # the overflowing call not made again
    assert of_kind(ledger, "tool") == tools_of("one", "two", "three")
    _check_the_record(target, ledger, _SUMMARY)


@pytest.mark.parametrize("owner", ["sync", "async"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_turn_killed_after_its_summary_was_stored_is_not_summarized_again(
    target: str, tmp_path: Path, driver: str, owner: str
) -> None:
    """Killed in the call the summary shortened: the new owner goes on from the stored summary, paying none."""
    ledger = str(tmp_path / "ledger")
    child = _child(target, tmp_path, driver, kill_on_summary="two")
    _died(child)
    assert of_kind(ledger, "summary") == {"two": 1}

    answer = _next_turn(target, ledger, owner, dead=child.pid)
    assert isinstance(answer, RunResult), answer
    assert answer.final == "noted three"
    assert of_kind(ledger, "summary") == {"two": 1, "three": 1}
    # The call in flight at the kill ("two 2") is made again: its outcome was never stored.  Nothing else.
    assert of_kind(ledger, "model") == calls_of("one", "two", "three") + Counter({"two 2": 1})
    assert of_kind(ledger, "tool") == tools_of("one", "two", "three")
    _check_the_record(target, ledger, _SUMMARY)


def _stalled(child: subprocess.Popen[bytes], flag: Path, elsewhere: Callable[[], None]) -> str:
    """``child`` stopped (SIGSTOP) in ``compact``, ``elsewhere`` done meanwhile, then woken: what it is told."""
    try:
        _wait_for(Path(f"{flag}.entered"), child)
        child.send_signal(signal.SIGSTOP)
        elsewhere()
        Path(f"{flag}.go").touch()
    finally:
        child.send_signal(signal.SIGCONT)
        child.wait(WAIT)
    error = child.stderr.read().decode() if child.stderr else ""
    if child.stderr:
        child.stderr.close()
    assert child.returncode == 0, error
    return Path(f"{flag}.told").read_text(encoding="utf-8")


@pytest.mark.parametrize("owner", ["sync", "async"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_owner_stalled_in_its_summary_call_past_its_lease_writes_nothing_and_calls_nothing_after_it(
    target: str, tmp_path: Path, driver: str, owner: str
) -> None:
    """SIGSTOP inside ``compact``: a new owner takes turn 2 over; woken, the old owner's summary is never used."""
    ledger = str(tmp_path / "ledger")
    flag = tmp_path / "hold"
    child = _child(target, tmp_path, driver)

    def elsewhere() -> None:
        answer = _next_turn(target, ledger, owner, dead=child.pid)
        assert isinstance(answer, RunResult), answer
        assert answer.final == "noted three"

    # Woken, the old owner's caller is told its turn went on elsewhere, where its answer is, and not to ask again.
    told = _stalled(child, flag, elsewhere)
    assert told.startswith("stale turn 2 of session 'chat' was taken over by another owner"), told
    assert "Nothing more was written or called here" in told, told
    assert "read the session again" in told, told
    assert "Asking the question again takes a new turn" in told, told
    assert of_kind(ledger, "summary") == {"two": 2, "three": 1}  # the stalled owner's, never written, and one more
    assert of_kind(ledger, "model") == calls_of("one", "two", "three")  # the woken owner made no call after it
    assert of_kind(ledger, "tool") == tools_of("one", "two", "three")
    _check_the_record(target, ledger, _SUMMARY)


@pytest.mark.parametrize("owner", ["sync", "async"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stalled_owner_asking_its_request_again_is_answered_from_the_turn_taken_over_with_no_call(
    target: str, tmp_path: Path, driver: str, owner: str
) -> None:
    """SIGSTOP inside ``compact``; ``Session.resume`` elsewhere finishes turn 2; woken, its request gets that answer."""
    ledger = str(tmp_path / "ledger")
    flag = tmp_path / "hold"
    child = _child(target, tmp_path, driver, again=True)

    before: Counter[str] = Counter()  # what was called before it woke

    def elsewhere() -> None:
        answer = _next_turn(target, ledger, owner, dead=child.pid, resume=True)
        assert isinstance(answer, RunResult), answer
        assert answer.final == "noted two"
        before.update(of_kind(ledger, "model") + of_kind(ledger, "tool"))

    told, again = _stalled(child, flag, elsewhere).split(" | again: ")
    assert told.startswith("stale turn 2 of session 'chat' was taken over by another owner"), told
    final, seen = again.split(" | ", 1)
    assert final == "noted two"  # its own question's answer, from the turn the other owner finished
    assert seen == repr(whole("one", "two"))  # and its session holds the record the other owner stored
    assert of_kind(ledger, "model") + of_kind(ledger, "tool") == before  # nothing called for it
    assert of_kind(ledger, "summary") == {"two": 2}
    assert of_kind(ledger, "model") == calls_of("one", "two")
    assert of_kind(ledger, "tool") == tools_of("one", "two")
    with open_store(target) as store:
        assert stored_head(store.load("chat/2")) == [_SUMMARY, "two"]
        assert record_of(Session(compaction_agent(ledger), store, "chat").messages) == whole("one", "two")
