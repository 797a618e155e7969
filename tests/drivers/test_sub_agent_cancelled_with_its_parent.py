"""A sub-agent cancelled by the token it shares with its parent: the parent's stop, not the child's answer.

docs/how-to/sub-agents.md "Cancelled with its parent": the parent's cancel
token is its children's.  Cancelled while a child runs, the child stops
``cancelled``; that used to become the parent's tool error for the call, so
a resume of the parent (with a fresh token) showed the model the error and
never ran the child again.  The decision: the call stays pending, as a call
cut by the parent's deadline does, the parent stops ``cancelled`` naming it,
and the parent's resume makes it again: with a store the child's stored run
is resumed where it stopped (its tool not run again, its paid model call not
made again); without one a fresh child takes the cut child's completed tool
outcomes (its model calls are made again).
Counted: each ``work`` execution by call id, the children's model calls and
the parent's, across the cut and the resume, on both drivers.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from support.cancelled_with_parent import Canceller, Counts, ParentModel, child_tools, parent_agent

from fsm_agent import Agent, AgentLoopError, CancelToken, RunResult, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
DEADLINE = 1.0


def _run(agent: Agent, driver: str, token: CancelToken, store: Any) -> RunResult:
    if driver == "sync":
        return agent.run("go", cancel=token, store=store, run_id="p")
    return asyncio.run(agent.arun("go", cancel=token, store=store, run_id="p"))


def _cut(agent: Agent, driver: str, counts: Counts, store: Any, expected: int) -> RunResult:
    """The parent run, its token cancelled once ``expected`` children's tools are in flight: its stopped result."""
    token = CancelToken()
    with Canceller(counts, token, expected) as canceller, pytest.raises(AgentLoopError) as stop:
        _run(agent, driver, token, store)
    assert canceller.done.is_set()  # the cancel came from the other thread, while the tools were in flight
    return stop.value.result


def _resumed(agent: Agent, driver: str, source: Any, store: Any) -> RunResult:
    """``source`` resumed with a fresh token and driven to its end."""
    if driver == "sync":
        return agent.resume(source, cancel=CancelToken(), store=store).finish()

    async def go() -> RunResult:
        return await (await agent.aresume(source, cancel=CancelToken(), store=store)).afinish()

    return asyncio.run(go())


def _answers(result: RunResult) -> dict[str, str]:
    return {m.tool_call_id or "": m.content for m in result.messages if m.role == "tool"}


def _check_cut(cut: RunResult, asks: tuple[str, ...]) -> None:
    """The parent stopped ``cancelled`` with every sub-agent call pending, none answered with the child's stop."""
    assert cut.reason == "cancelled"
    assert cut.evidence["why"] == "the user pressed stop"
    assert [call.id for call in cut.pending] == list(asks)
    assert _answers(cut) == {}  # no call answered: the child's cancel is no answer
    assert cut.snapshot is not None
    assert set(cut.snapshot["cut_children"]) <= set(asks)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stored_child_cancelled_with_its_parent_is_resumed_with_the_parent_each_call_once(
    store_target: str, driver: str
) -> None:
    """SQLite and PostgreSQL: the child's stored run goes on from its stop; ``w-c1`` ran once, nothing paid twice."""
    counts = Counts()
    with open_store(store_target) as store:
        cut = _cut(parent_agent(counts, driver), driver, counts, store, expected=1)
        _check_cut(cut, ("c1",))
        assert cut.evidence.get("unfinished") == "c1"
        child = store.load("p/c1")
        assert (child["state"], child["reason"]) == ("Failed", "cancelled")
        assert (counts.parent, counts.child, counts.work) == (1, 1, Counter({"w-c1": 1}))

        result = _resumed(parent_agent(counts, driver), driver, store.load("p"), store)
        child = store.load("p/c1")
    assert result.final == "done"
    assert _answers(result) == {"c1": '"found c1"'}
    assert child["state"] == "Done"
    assert (counts.parent, counts.child, counts.work) == (2, 2, Counter({"w-c1": 1}))


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_child_cancelled_with_its_parent_without_a_store_is_made_again_its_finished_tool_not_run_again(
    driver: str,
) -> None:
    """No store: a fresh child makes the call again, taking the cut child's finished tool outcome (not run again)."""
    counts = Counts()
    cut = _cut(parent_agent(counts, driver), driver, counts, None, expected=1)
    _check_cut(cut, ("c1",))
    assert (counts.parent, counts.child, counts.work) == (1, 1, Counter({"w-c1": 1}))

    result = _resumed(parent_agent(counts, driver), driver, cut, None)
    assert result.final == "done"
    assert _answers(result) == {"c1": '"found c1"'}
    # The fresh child's two model calls are made again; its tool's outcome comes from the parent's snapshot.
    assert (counts.parent, counts.child, counts.work) == (2, 3, Counter({"w-c1": 1}))


def test_a_parallel_batch_of_two_children_cancelled_with_their_parent_resumes_both_each_call_once(
    store_target: str,
) -> None:
    """Async: ``c1`` and ``c2`` run at once, both cut in their tools; the resume goes on with both stored runs."""
    counts = Counts()
    asks = ("c1", "c2")
    with open_store(store_target) as store:
        cut = _cut(parent_agent(counts, "async", asks), "async", counts, store, expected=2)
        _check_cut(cut, asks)
        assert (counts.parent, counts.child, counts.work) == (1, 2, Counter({"w-c1": 1, "w-c2": 1}))
        assert {store.load(f"p/{call_id}")["reason"] for call_id in asks} == {"cancelled"}

        result = _resumed(parent_agent(counts, "async", asks), "async", store.load("p"), store)
        states = {store.load(f"p/{call_id}")["state"] for call_id in asks}
    assert result.final == "done"
    assert _answers(result) == {"c1": '"found c1"', "c2": '"found c2"'}
    assert states == {"Done"}
    assert (counts.parent, counts.child, counts.work) == (2, 4, Counter({"w-c1": 1, "w-c2": 1}))


@pytest.mark.parametrize("driver", DRIVERS)
def test_two_children_asked_at_once_cancelled_with_their_parent_each_run_once_across_the_resume(
    store_target: str, driver: str
) -> None:
    """Both drivers, two calls in one reply: the sync driver cuts ``c1`` and never starts ``c2``; async cuts both."""
    counts = Counts()
    asks = ("c1", "c2")
    started = 1 if driver == "sync" else 2
    with open_store(store_target) as store:
        cut = _cut(parent_agent(counts, driver, asks), driver, counts, store, expected=started)
        _check_cut(cut, asks)
        assert counts.child == started
        result = _resumed(parent_agent(counts, driver, asks), driver, store.load("p"), store)
    assert _answers(result) == {"c1": '"found c1"', "c2": '"found c2"'}
    assert (counts.parent, counts.child, counts.work) == (2, 4, Counter({"w-c1": 1, "w-c2": 1}))


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_spend_of_a_child_cut_with_its_parent_is_counted_once_through_the_resume(
    store_target: str, driver: str
) -> None:
    """The parent's counters at its end hold each child tool call once (the cut counted it; the resume adds none)."""
    counts = Counts()
    with open_store(store_target) as store:
        cut = _cut(parent_agent(counts, driver), driver, counts, store, expected=1)
        assert cut.snapshot is not None
        kept = cut.snapshot["cut_children"]["c1"]
        # The child's completed tool call counts at the cut, whatever the call's outcome; its kept cut says so.
        assert (kept["run_id"], kept["tool_calls"], cut.evidence["counters"]["tool_calls"][0]) == ("p/c1", 1, 1)
        result = _resumed(parent_agent(counts, driver), driver, store.load("p"), store)
    # The parent's own call of the helper, plus the child's one work call, counted once.
    assert result.steps[-1].counters["tool_calls"][0] == 2


def test_a_stored_child_cut_when_its_parents_task_is_cancelled_is_resumed_with_the_parent(store_target: str) -> None:
    """Async, the parent's task cancelled while the child's tool is in flight: the child is resumed, not read back.

    The tool in flight at the cut is made again (it never came back), as
    after any cut; the child's paid first reply is not.
    """
    counts = Counts()

    async def cut(store: Any) -> None:
        task = asyncio.create_task(parent_agent(counts, "async").arun("go", store=store, run_id="p"))
        assert await asyncio.to_thread(counts.started.acquire, True, 30.0)
        task.cancel()
        counts.go.set()  # the tool's waiting thread ends (asyncio.run waits for it); its coroutine is cancelled
        with pytest.raises(asyncio.CancelledError):
            await task

    with open_store(store_target) as store:
        try:
            asyncio.run(cut(store))
        finally:
            counts.go.set()
            counts.hold = False
        parent, child = store.load("p"), store.load("p/c1")
        assert (parent["reason"], child["reason"]) == ("cancelled", "cancelled")
        assert (counts.parent, counts.child, counts.work) == (1, 1, Counter({"w-c1": 1}))
        result = _resumed(parent_agent(counts, "async"), "async", store.load("p"), store)
        child = store.load("p/c1")
    assert _answers(result) == {"c1": '"found c1"'}
    assert child["state"] == "Done"
    assert (counts.parent, counts.child, counts.work) == (2, 2, Counter({"w-c1": 2}))


class _AnswersLate:
    """A child's model: asks for ``work``, then (the first time) hangs in its answer until its task is cancelled."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    async def acomplete(self, messages: Any, tools: Any) -> Any:
        self.counts.child += 1
        if not any(m.role == "tool" for m in messages):
            return tool_turn(tool_call("work", id="w-c1", item="c1"))
        if self.counts.hold:
            self.counts.started.release()
            await asyncio.Event().wait()  # cut by the parent's deadline
        return reply("found c1")

    def complete(self, messages: Any, tools: Any) -> Any:
        raise AssertionError("the async driver awaits acomplete")


@pytest.mark.slow
def test_a_parent_cut_at_its_deadline_after_its_child_ran_a_tool_resumes_counting_that_tool_once() -> None:
    """Async, no store: the deadline cuts the child in its second model call, after its ``work`` ran.

    The cut counted the child's tool call without a step naming the child,
    so the stopped parent's snapshot contradicted itself and refused to
    resume (``SnapshotError``).  ``DEADLINE`` is 1 s against the
    milliseconds the steps before the hang take (a factor of over 100).
    """
    counts = Counts()

    def agent(timeout: float | None) -> Agent:
        child = Agent(_AnswersLate(counts), child_tools(counts, "async"))
        tools = ToolRegistry()
        tools.register(child.as_tool("helper", "Looks things up."))
        return Agent(ParentModel(counts, ("c1",)), tools, timeout=timeout)

    counts.hold = True
    counts.go.set()  # the tool never waits: its hold is only the child's answer's
    with pytest.raises(AgentLoopError) as stop:
        asyncio.run(agent(DEADLINE).arun("go"))
    counts.hold = False
    cut = stop.value.result
    assert (cut.reason, cut.evidence.get("unfinished")) == ("timeout", "c1")
    assert (counts.parent, counts.child, counts.work) == (1, 2, Counter({"w-c1": 1}))

    result = asyncio.run(agent(None).resume(cut, timeout=60).afinish())
    assert _answers(result) == {"c1": '"found c1"'}
    # No store: the call starts a new child (its two model calls), which takes the cut child's work, not run again.
    assert (counts.parent, counts.child, counts.work) == (2, 4, Counter({"w-c1": 1}))
    # The helper call, and work once: counted at the cut, taken by the new child without counting it again.
    assert result.steps[-1].counters["tool_calls"][0] == 2
