"""A stored sub-agent resumed with its parent goes on under what its parent has left now: time and tool calls.

docs/how-to/sub-agents.md "What bounds the child": the child's deadline is
its parent's, and the parent never passes its ``max_tool_calls`` total.
A stored child taken back by its parent's resume (after a cancel cut it)
goes on from its own counters, so:

- **Time.** Its clock starts at the time it had used, so it must be given
  that plus what its parent has left.  Given only what the parent had left,
  it lost the time it ran before the cut a second time (the parent's clock
  had counted it already) and stopped ``timeout`` while its parent still
  had time.  One frozen clock serves both agents: the child's first model
  call takes 30 of the parent's 100 seconds, the parent is cancelled while
  the child's tool runs, and on the parent's resume the child's second
  call takes 50 more: 80 in all, within the 100, before its third.
- **Its own timeout.** A child stopped ``timeout`` at its parent's
  deadline goes on when its parent's resume gives it more time, but one
  whose own timeout ends there too is read back as it stopped: its agent's
  table does not resume it, and nothing of it is called again.
- **Tool calls.** Its share is worked out again from the parent's total as
  resumed: it kept the share it was started with, so a parent resumed
  under a lower total passed it.  Two children of one parallel batch
  (async) share the lower total.

Counted: each ``work`` execution by call id, every model call of both agents.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
from support.cancelled_with_parent import Canceller, Counts, ParentModel, child_tools

from fsm_agent import Agent, AgentLoopError, CancelToken, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

TIMEOUT = 100.0
FIRST, SECOND = 30.0, 50.0
"""Seconds the child's first and second model calls take on the shared frozen clock."""


class _Child:
    """Asks for ``work`` once per entry of ``seconds``, each call taking that long on ``clock``, then answers."""

    def __init__(self, counts: Counts, clock: ManualClock, seconds: Sequence[float]) -> None:
        self.counts, self.clock, self.seconds = counts, clock, seconds

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.counts.lock:
            self.counts.child += 1
        asked = next(m.content for m in messages if m.role == "user")
        done = sum(m.role == "tool" for m in messages)
        if done == len(self.seconds):
            return reply(f"found {asked}")
        self.clock.advance(self.seconds[done])
        # The first call's id is the one the held ``work`` waits on (support.cancelled_with_parent).
        return tool_turn(tool_call("work", id=f"w{done or ''}-{asked}", item=str(done)))


def _parent(
    counts: Counts,
    driver: str,
    clock: ManualClock,
    seconds: Sequence[float],
    asks: Sequence[str] = ("c1",),
    child_timeout: float | None = None,
    **limits: Any,
) -> Agent:
    child = Agent(_Child(counts, clock, seconds), child_tools(counts, driver), clock=clock, timeout=child_timeout)
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts, asks), tools, clock=clock, **limits)


def _cut(agent: Agent, driver: str, counts: Counts, store: Any, children: int = 1) -> None:
    """The parent run, cancelled while its ``children`` children's first ``work`` calls run."""
    token = CancelToken()
    if driver == "sync":
        run = partial(agent.run, "go", cancel=token, store=store, run_id="p")
    else:
        run = partial(asyncio.run, agent.arun("go", cancel=token, store=store, run_id="p"))
    with Canceller(counts, token, children), pytest.raises(AgentLoopError) as stop:
        run()
    assert (stop.value.reason, stop.value.result.evidence.get("unfinished")) == ("cancelled", "c1")
    assert store.load("p/c1")["reason"] == "cancelled"


def _resumed(agent: Agent, driver: str, store: Any, **limits: Any) -> RunResult:
    """The stored parent resumed with a fresh token (and ``limits``), driven to its end."""
    if driver == "sync":
        return agent.resume(store.load("p"), cancel=CancelToken(), store=store, **limits).finish()

    async def go() -> RunResult:
        return await (await agent.aresume(store.load("p"), cancel=CancelToken(), store=store, **limits)).afinish()

    return asyncio.run(go())


def _timed_out(agent: Agent, driver: str, store: Any) -> None:
    """The parent run, stopped at its deadline by its child's first model call, the call to its child pending."""
    if driver == "sync":
        run = partial(agent.run, "go", store=store, run_id="p")
    else:
        run = partial(asyncio.run, agent.arun("go", store=store, run_id="p"))
    with pytest.raises(AgentLoopError) as stop:
        run()
    assert (stop.value.reason, stop.value.result.evidence.get("unfinished")) == ("timeout", "c1")
    assert store.load("p/c1")["reason"] == "timeout"


def _answers(result: RunResult) -> dict[str | None, str]:
    return {m.tool_call_id: m.content for m in result.messages if m.role == "tool"}


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stored_child_resumed_with_its_parent_has_the_parents_time_left_beyond_its_own_past(
    store_target: str, driver: str
) -> None:
    """SQLite and PostgreSQL: the child ends at 80 of the parent's 100 seconds and answers; each call made once."""
    counts, clock = Counts(), ManualClock()
    with open_store(store_target) as store:
        _cut(_parent(counts, driver, clock, (FIRST, SECOND), timeout=TIMEOUT), driver, counts, store)
        assert clock.now == FIRST
        result = _resumed(_parent(counts, driver, clock, (FIRST, SECOND), timeout=TIMEOUT), driver, store)
        child = store.load("p/c1")
    assert (child["state"], child["reason"], child["counters"]["elapsed"]) == ("Done", "done", FIRST + SECOND)
    assert child["limits"]["timeout"] == TIMEOUT  # the 70 seconds the parent had left, after the child's own 30
    assert (result.final, _answers(result)) == ("done", {"c1": '"found c1"'})
    assert (counts.parent, counts.child, counts.work) == (2, 3, Counter({"w-c1": 1, "w1-c1": 1}))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stored_child_resumed_under_a_lower_tool_call_total_keeps_its_parent_within_it(
    store_target: str, driver: str
) -> None:
    """The parent's resume lowers ``max_tool_calls`` from 20 to 4: its child's share shrinks with it (its stored share,
    19, let it make all six of its calls), and the parent makes 4 calls in all, each once."""
    counts, clock, six = Counts(), ManualClock(), (0.0,) * 6
    with open_store(store_target) as store:
        _cut(_parent(counts, driver, clock, six, max_tool_calls=20), driver, counts, store)
        result = _resumed(_parent(counts, driver, clock, six, max_tool_calls=20), driver, store, max_tool_calls=4)
        child, made = store.load("p/c1"), store.load("p")["counters"]["tool_calls"]
    assert (child["state"], child["reason"]) == ("Failed", "max_tool_calls")
    assert (result.final, made) == ("done", 4)  # the helper call itself, and the child's three work calls
    assert counts.work == Counter({"w-c1": 1, "w1-c1": 1, "w2-c1": 1})


def test_two_stored_children_of_a_parallel_batch_resumed_under_a_lower_total_share_it(store_target: str) -> None:
    """Async, one batch of two children cut together; resumed under a total of 6: each child's share is 1 call more
    than the one it made, and the parent makes 6 calls in all (2 helper calls, 4 work calls), each once."""
    counts, clock, six = Counts(), ManualClock(), (0.0,) * 6
    asks = ("c1", "c2")
    with open_store(store_target) as store:
        _cut(_parent(counts, "async", clock, six, asks, max_tool_calls=20), "async", counts, store, children=2)
        assert counts.work == Counter({"w-c1": 1, "w-c2": 1})
        resumed = _parent(counts, "async", clock, six, asks, max_tool_calls=20)
        result = _resumed(resumed, "async", store, max_tool_calls=6)
        children = [store.load(f"p/{call_id}") for call_id in asks]
        made = store.load("p")["counters"]["tool_calls"]
    assert [(child["reason"], child["counters"]["tool_calls"]) for child in children] == [("max_tool_calls", 2)] * 2
    assert (result.final, made) == ("done", 6)
    assert counts.work == Counter({"w-c1": 1, "w-c2": 1, "w1-c1": 1, "w1-c2": 1})


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize(
    ("own", "answer", "child_calls", "work"),
    [
        (None, '"found c1"', 2, Counter({"w-c1": 1})),
        (TIMEOUT, '"reason": "timeout"', 1, Counter()),
    ],
    ids=["no-own-timeout-goes-on", "own-timeout-read-back"],
)
def test_a_stored_child_cut_at_its_parents_deadline_goes_on_unless_its_own_timeout_ends_there_too(
    store_target: str, driver: str, own: float | None, answer: str, child_calls: int, work: Counter[str]
) -> None:
    """The child's first model call takes the parent's 100 seconds; resumed with 200, the child goes on (its work
    made once, then its answer), or, with its own timeout of 100, is read back: nothing of it is called again."""
    counts, clock = Counts(), ManualClock()
    with open_store(store_target) as store:
        _timed_out(_parent(counts, driver, clock, (TIMEOUT,), child_timeout=own, timeout=TIMEOUT), driver, store)
        counts.hold = False
        resumed = _parent(counts, driver, clock, (TIMEOUT,), child_timeout=own, timeout=TIMEOUT)
        result = _resumed(resumed, driver, store, timeout=2 * TIMEOUT)
        child = store.load("p/c1")
    assert (child["reason"], result.final) == ("timeout" if own else "done", "done")
    assert answer in _answers(result)["c1"]
    assert (counts.parent, counts.child, counts.work) == (2, child_calls, work)
