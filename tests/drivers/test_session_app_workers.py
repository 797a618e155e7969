"""Two app workers take the next turn of one stored conversation at the same moment, each with its own ``Session``.

Whichever gets there first, each request either takes a whole turn after
every turn before it or is refused with ``RunLeasedError`` before its model
is called: the stored turns are numbered without a gap, each one's history
is every earlier turn in order, and each taken turn's tool ran exactly once
(SQLite and PostgreSQL; sync, async and one of each).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from support.app_owners import staggered

from fsm_agent import Agent, Message, ModelResponse, RunLeasedError, Session, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

ROUNDS = 8


class Noter:
    """Asks, once per turn, to note the turn's question, then answers with every question it was shown."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.lock:
            self.calls += 1
        asked = [m.content for m in messages if m.role == "user"]
        last_user = max(i for i, m in enumerate(messages) if m.role == "user")
        if not any(m.role == "tool" for m in messages[last_user:]):
            return tool_turn(tool_call("note", id=f"n-{asked[-1]}", text=asked[-1]))
        return reply(" / ".join(asked))


def _agent(model: Noter, noted: list[str], lock: threading.Lock) -> Agent:
    registry = ToolRegistry()

    @registry.register
    def note(text: str, call_id: str) -> str:
        """Note a question (counted by call id)."""
        with lock:
            noted.append(call_id)
        time.sleep(0.05)  # a turn long enough for the other worker to arrive in it (not a wait for anything)
        return f"noted {text}"

    return Agent(model, registry)


@pytest.mark.slow
@pytest.mark.parametrize("drivers", [("sync", "sync"), ("async", "async"), ("sync", "async")])
def test_two_workers_taking_the_next_turn_at_once_take_one_whole_turn_each_or_are_refused(
    store_target: str, drivers: tuple[str, str]
) -> None:
    """Per round two fresh Sessions ask for the next turn at once; turns stay gapless, ordered, each tool once."""
    model, noted, lock = Noter(), [], threading.Lock()
    taken: list[str] = []
    with open_store(store_target) as store:
        for round_ in range(ROUNDS):

            def worker(name: str, driver: str) -> Any:
                session = Session(_agent(model, noted, lock), store=store, session_id="chat")
                if driver == "sync":
                    return session.run(name)
                return asyncio.run(session.arun(name))

            names = (f"q{round_}a", f"q{round_}b")
            first, second = (lambda n=name, d=driver: worker(n, d) for name, driver in zip(names, drivers, strict=True))
            answers = staggered(first, second, round_, ROUNDS, step=0.04)
            for name, answer in zip(names, answers, strict=True):
                if isinstance(answer, RunLeasedError):
                    continue
                assert not isinstance(answer, BaseException), answer
                assert answer.reason == "done"
                taken.append(name)
                assert answer.final.endswith(name)
            assert any(not isinstance(a, BaseException) for a in answers)  # one of them got there, at least
        runs = sorted(store.list_runs(session="chat"), key=lambda r: int(r.run_id.rsplit("/", 1)[1]))
        assert [r.run_id for r in runs] == [f"chat/{n}" for n in range(1, len(taken) + 1)]
        order = []
        for n, run in enumerate(runs, start=1):
            data = store.load(run.run_id)
            assert data["state"] == "Done"
            asked = [m["content"] for m in data["messages"] if m["role"] == "user"]
            assert asked[:-1] == order, f"turn {n} was built on {asked[:-1]}, not on the turns before it {order}"
            order.append(asked[-1])
    assert sorted(order) == sorted(taken)
    assert sorted(noted) == sorted(f"n-{name}" for name in taken)  # each taken turn's tool once, none for a refusal
    assert model.calls == 2 * len(taken)
