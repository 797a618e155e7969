"""Two owners of one Session while a turn's compaction is in flight: one summary, no call twice, no turn lost.

docs/how-to/conversations.md ("A turn asked of another object or process
while one is going is a RunLeasedError") and docs/how-to/long-runs.md ("a
summary written by another model is paid once").  Each owner is a Session
object of its own over a store object of its own; the owner taking turn 2
holds its ``compact`` (the paid summary call) for longer than a lease while
the other asks for the next turn, or to resume, from another thread, on the
other driver.  Every model call, summary and tool call is counted in one
ledger (``support.session_compaction_owners``).
"""

from __future__ import annotations

import asyncio
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
    counted,
    of_kind,
    record_of,
    stored_head,
    tools_of,
    whole,
)

from fsm_agent import RunLeasedError, RunResult, Session
from fsm_agent.persist import open_store

LEASE = 2.0
"""The lease of these tests.  A live owner's heartbeat renews it every 0.67 s while ``compact`` runs (it would
have to stall 1.3 s to lose it), and the test asks again only after 1.25 leases, so that a compaction not kept
leased would be taken over; both figures are seconds against the milliseconds each call takes here."""


def _ask(target: str, ledger: str, driver: str, asks: str) -> Any:
    """One owner's request, on its own store object and Session: the next turn ("three"), or ``resume``."""
    agent = compaction_agent(ledger)
    if driver == "sync":
        with open_store(target, lease=LEASE) as store:
            session = Session(agent, store, "chat")
            return session.run("three") if asks == "next turn" else session.resume()

    async def go() -> Any:
        store = open_store(target, lease=LEASE)
        try:
            session = await Session.aopen(agent, store, "chat")
            return await (session.arun("three") if asks == "next turn" else session.aresume())
        finally:
            await store.aclose()
            store.close()

    return asyncio.run(go())


def _refused(ask: Callable[[], Any]) -> RunLeasedError:
    with pytest.raises(RunLeasedError) as refused:
        ask()
    return refused.value


class _Owner(threading.Thread):
    """Takes turn 2 ("two") of the session on ``driver``, on its own store object; its result or error kept."""

    def __init__(self, target: str, ledger: str, driver: str, hold: Hold) -> None:
        super().__init__(daemon=True)
        # "sync, timeout": the run has a deadline (far off), so its calls and compact run on workers (_bounded).
        options = {"timeout": WAIT * 4} if driver == "sync, timeout" else {}
        self.agent = compaction_agent(ledger, hold, awaited=driver == "async", **options)
        self.target, self.driver = target, driver
        self.result: RunResult | None = None
        self.error: BaseException | None = None
        self.session: Session | None = None

    def run(self) -> None:
        try:
            if self.driver.startswith("sync"):
                with open_store(self.target, lease=LEASE) as store:
                    self.session = Session(self.agent, store, "chat")
                    self.result = self.session.run("two")
            else:
                self.result = asyncio.run(self._arun())
        except BaseException as exc:  # noqa: BLE001 - kept for the test to raise
            self.error = exc

    async def _arun(self) -> RunResult:
        store = open_store(self.target, lease=LEASE)
        try:
            self.session = await Session.aopen(self.agent, store, "chat")
            return await self.session.arun("two")
        finally:
            await store.aclose()
            store.close()


@pytest.mark.slow
@pytest.mark.parametrize("asks", ["next turn", "resume"])
@pytest.mark.parametrize(("owner", "other"), [("sync", "async"), ("async", "sync"), ("sync, timeout", "sync")])
def test_a_second_owner_asking_while_a_turn_compacts_is_refused_and_the_summary_is_made_once(
    store_target: str, tmp_path: Path, owner: str, other: str, asks: str
) -> None:
    """Turn 2's compaction held past a lease: the other owner is refused, twice, and nothing is called for it."""
    ledger = str(tmp_path / "ledger")
    with open_store(store_target, lease=LEASE) as store:
        Session(compaction_agent(ledger), store, "chat").run("one")
    hold = Hold("two")
    first = _Owner(store_target, ledger, owner, hold)
    first.start()
    try:
        assert hold.entered.wait(WAIT), "turn 2 never compacted"
        before = counted(ledger)
        refusal = _refused(lambda: _ask(store_target, ledger, other, asks))
        assert refusal.run_id == "chat/2"
        time.sleep(LEASE * 1.25)  # longer than a lease: only the heartbeat during compact keeps it
        again = _refused(lambda: _ask(store_target, ledger, other, asks))
        assert again.holder == refusal.holder
        assert counted(ledger) == before  # the refused owner made no model call, no summary, ran no tool
    finally:
        hold.release.set()
        first.join(WAIT)
    assert not first.is_alive()
    if first.error is not None:
        raise first.error
    assert first.result is not None
    assert first.result.final == "noted two"
    assert [step.kind for step in first.result.steps] == ["tool_call", "compaction", "tool_call", "final"]

    if asks == "next turn":
        taken = _ask(store_target, ledger, other, asks)
        assert taken.final == "noted three"
        questions: tuple[str, ...] = ("one", "two", "three")
    else:
        with pytest.raises(ValueError, match="finished in Done; there is nothing to resume"):
            _ask(store_target, ledger, other, asks)  # turn 2 ended: nothing to resume, nothing called
        questions = ("one", "two")
    assert of_kind(ledger, "summary") == {q: 1 for q in questions if q != "one"}
    assert of_kind(ledger, "model") == calls_of(*questions)
    assert of_kind(ledger, "tool") == tools_of(*questions)

    with open_store(store_target) as store:
        head = stored_head(store.load("chat/2"))
        fresh = Session(compaction_agent(ledger), store, "chat")
        assert record_of(fresh.messages) == whole(*questions)
    assert first.session is not None
    assert record_of(first.session.messages) == whole("one", "two")
    assert head[1:] == ["two"]
    assert head[0].startswith("summary: one |")
    compactions = [step.detail for step in first.result.steps if step.kind == "compaction"]
    assert compactions == [f"9 messages -> {len(head)}"]  # the one summary its owner made is the one stored


@pytest.mark.parametrize("owner", ["sync", "async"])
def test_a_turn_deleted_while_it_compacts_is_told_as_deleted_and_calls_nothing_after(
    store_target: str, tmp_path: Path, owner: str
) -> None:
    """Another owner deletes turn 2 while its summary is made: its caller is told so, not that it was taken over."""
    ledger = str(tmp_path / "ledger")
    with open_store(store_target, lease=LEASE) as store:
        Session(compaction_agent(ledger), store, "chat").run("one")
    hold = Hold("two")
    first = _Owner(store_target, ledger, owner, hold)
    first.start()
    try:
        assert hold.entered.wait(WAIT), "turn 2 never compacted"
        with open_store(store_target) as store:
            store.delete("chat/2")
    finally:
        hold.release.set()
        first.join(WAIT)
    assert isinstance(first.error, KeyError), first.error
    assert "was deleted" in str(first.error)
    assert of_kind(ledger, "model") == calls_of("one") + Counter({"two 7": 1, "two 9": 1})  # none after the summary
    assert of_kind(ledger, "tool") == tools_of("one") + Counter({"a-two": 1})
    assert of_kind(ledger, "summary") == {"two": 1}
