"""Owners racing for one run of a store written from the guide: each write is checked against the version it read.

The store is ``MemoryStore`` as docs/how-to/store.md prints it (section 2),
a store of a third party's.  Threads (and event loops in threads) drive the
engine at the same run at once; each test counts the tools' side effects,
so a write that was not fenced shows as a call made twice.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, RunExistsError, RunLeasedError, RunResult, StaleRunError, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.testing.store_kit import RACERS, Script, race

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "store.md"
REFUSED = (RunLeasedError, StaleRunError, RunExistsError)


def _guide_module() -> types.ModuleType:
    found = re.search(r'```python title="memory_store.py"\n(.*?)```', GUIDE.read_text(encoding="utf-8"), re.S)
    assert found is not None, "the guide no longer prints memory_store.py"
    module = types.ModuleType("memory_store")
    exec(compile(found.group(1), "memory_store.py", "exec"), module.__dict__)
    return module


MemoryStore: Any = _guide_module().MemoryStore


class Effects:
    """Side effects of the tools, per call id, counted under a lock (the calls come from many threads)."""

    def __init__(self) -> None:
        self.made: dict[str, int] = {}
        self.lock = threading.Lock()

    def agent(self, calls: int = 2, **options: Any) -> Agent:
        """An agent (stateless model) that sends ``calls`` mails, ``m0``, ``m1``, ..., then answers ``"sent"``."""
        registry = ToolRegistry()
        effects = self

        @registry.register
        def send(to: str) -> str:
            """Send a mail (counted)."""
            with effects.lock:
                effects.made[to] = effects.made.get(to, 0) + 1
            return f"sent to {to}"

        turns = [tool_turn(tool_call("send", id=f"m{i}", to=f"m{i}")) for i in range(calls)]
        return Agent(Script(*turns, reply("sent")), registry, **options)


def _won(outcomes: list[Any]) -> list[Any]:
    assert all(isinstance(o, (RunResult, *REFUSED)) for o in outcomes), outcomes
    return [o for o in outcomes if isinstance(o, RunResult)]


def test_owners_starting_the_same_run_id_at_once_one_runs_it_and_each_mail_is_sent_once() -> None:
    """RACERS threads run a new run under one id: one creates and finishes it, the rest are refused."""
    store, effects = MemoryStore(lease=60), Effects()
    outcomes = race([partial(effects.agent().run, "send", store=store, run_id="job") for _ in range(RACERS)])
    assert len(_won(outcomes)) == 1
    assert effects.made == {"m0": 1, "m1": 1}
    assert store.load("job")["state"] == "Done"


def _stopped(store: Any, effects: Effects) -> dict[str, Any]:
    """A run stopped on max_steps after its first mail; its snapshot as the store has it."""
    with pytest.raises(AgentLoopError):
        effects.agent(max_steps=1).run("send", store=store, run_id="job")
    assert effects.made == {"m0": 1}
    return store.load("job")  # type: ignore[no-any-return]


def test_owners_resuming_one_snapshot_at_once_one_goes_on_and_no_mail_is_sent_twice() -> None:
    """RACERS threads resume the snapshot they all read: one claim wins, and the second mail is sent once."""
    store, effects = MemoryStore(lease=60), Effects()
    read = _stopped(store, effects)

    def resume() -> RunResult:
        return effects.agent().resume(read, store=store, max_steps=8).finish()

    outcomes = race([resume for _ in range(RACERS)])
    assert len(_won(outcomes)) == 1
    assert effects.made == {"m0": 1, "m1": 1}
    assert store.load("job")["final"] == "sent"


def test_owners_resuming_on_event_loops_of_their_own_at_once_one_goes_on() -> None:
    """The same race on the async driver: each thread runs its own loop; aresume's claim is the fence."""
    store, effects = MemoryStore(lease=60), Effects()
    read = _stopped(store, effects)

    async def aresume() -> RunResult:
        return await (await effects.agent().aresume(read, store=store, max_steps=8)).afinish()

    outcomes = race([partial(asyncio.run, aresume()) for _ in range(RACERS)])  # type: ignore[arg-type]
    assert len(_won(outcomes)) == 1
    assert effects.made == {"m0": 1, "m1": 1}


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_owner_whose_run_was_taken_over_and_finished_makes_no_call_after(driver: str) -> None:
    """A's lease lapses before its call; B takes the run over and finishes it; A's next step is refused, no mail."""
    store, effects = MemoryStore(lease=0.3), Effects()
    agent = effects.agent(calls=1)
    if driver == "sync":
        owner_a = agent.start("send", store=store, run_id="job")
        step: Callable[[], Any] = owner_a.advance
    else:
        owner_a = asyncio.run(agent.astart("send", store=store, run_id="job"))

        def step() -> Any:
            return asyncio.run(owner_a.aadvance())

    while str(owner_a.state) != "ExecuteTool":
        step()  # up to the call, not made yet
    time.sleep(0.9)  # A went quiet for three leases
    taken = effects.agent(calls=1).resume(store.load("job"), store=store).finish()
    assert taken.final == "sent"
    assert effects.made == {"m0": 1}
    with pytest.raises(REFUSED):
        step()
    assert effects.made == {"m0": 1}, "a stale owner made its call on a run it no longer held"
    assert store.load("job")["final"] == "sent"


def test_saves_of_one_loaded_snapshot_at_once_exactly_one_is_kept() -> None:
    """RACERS threads save the snapshot they all loaded: one save wins, the rest are StaleRunError."""
    store, effects = MemoryStore(lease=60), Effects()
    read = _stopped(store, effects)
    outcomes = race([partial(store.save, "job", read) for _ in range(RACERS)])
    kept = [o for o in outcomes if not isinstance(o, Exception)]
    assert kept == [read["stored_seq"] + 1]
    assert all(isinstance(o, StaleRunError) for o in outcomes if isinstance(o, Exception)), outcomes
