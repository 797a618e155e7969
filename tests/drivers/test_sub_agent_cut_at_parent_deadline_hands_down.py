"""A store-less sub-agent cut by its parent's deadline hands down what its run completed, as a cancel's does.

docs/how-to/sub-agents.md "Cancellation": without a store, the parent's
snapshot keeps the outcomes of the tool calls a cut child completed, and the
call made again starts a new child that takes them.  A cancel did that; the
parent's deadline did not, so the resumed parent's new child ran its tools
again.  Each child here runs ``work``, then hangs in its answer until the
deadline cuts it; the resume must not run ``work`` again.  Counted: each
``work`` execution by call id, every model call, the parent's ``tool_calls``;
on both drivers, one call and two in one reply (the async driver runs them as
one parallel batch, the sync driver one after the other), two levels down, and
a fork taken at the stop instead of a resume.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from support.cancelled_with_parent import Counts, ParentModel, child_tools
from support.deadline_children import HangsInItsAnswer

from fsm_agent import Agent, AgentLoopError, ForkEdit, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

pytestmark = pytest.mark.slow  # each cut waits out the deadline

DEADLINE = 1.0
"""The parent's timeout: the steps before the hang take milliseconds, a factor of over 100 under two CPU hogs."""


def _agent(
    counts: Counts, driver: str, asks: tuple[str, ...], release: threading.Event, timeout: float | None
) -> Agent:
    child = Agent(HangsInItsAnswer(counts, release), child_tools(counts, driver))
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts, asks), tools, timeout=timeout)


def _cut(agent: Agent, driver: str) -> RunResult:
    def run() -> RunResult:
        return agent.run("go") if driver == "sync" else asyncio.run(agent.arun("go"))

    with pytest.raises(AgentLoopError) as stop:
        run()
    return stop.value.result


def _resumed(agent: Agent, driver: str, snapshot: dict[str, Any]) -> RunResult:
    if driver == "sync":
        return agent.resume(snapshot, timeout=60).finish()
    return asyncio.run(agent.resume(snapshot, timeout=60).afinish())


def _answers(result: RunResult) -> dict[str, str]:
    return {m.tool_call_id or "": m.content for m in result.messages if m.role == "tool"}


@pytest.mark.parametrize("asks", [("c1",), ("c1", "c2")], ids=["one_call", "two_calls_in_one_reply"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_child_cut_by_the_parents_deadline_has_its_completed_tool_taken_not_run_again(
    driver: str, asks: tuple[str, ...]
) -> None:
    """Each ``work`` runs once across the cut and the resume from the snapshot (read back through JSON)."""
    counts, release = Counts(), threading.Event()
    counts.go.set()  # ``work`` never waits: the hold is the child's answer's
    try:
        cut = _cut(_agent(counts, driver, asks, release, DEADLINE), driver)
    finally:
        counts.hold = False
        release.set()
    # Cut: on sync the second call never started (the first holds the run); async ran both together.
    started = asks if driver == "async" else asks[:1]
    assert cut.reason == "timeout"
    assert cut.snapshot is not None
    assert counts.work == Counter({f"w-{ask}": 1 for ask in started})
    assert sorted(name for name, _, _ in cut.snapshot["carried_down"]) == ["helper"] * len(started)
    assert cut.evidence["counters"]["tool_calls"][0] == len(started)  # each child's work, counted at the cut

    snapshot = json.loads(json.dumps(cut.snapshot))
    result = _resumed(_agent(counts, driver, asks, release, None), driver, snapshot)
    assert _answers(result) == {ask: json.dumps(f"found {ask}") for ask in asks}
    assert counts.work == Counter({f"w-{ask}": 1 for ask in asks})  # none ran again
    # The parent: its cut reply and its answer; each child: its two model calls, a new child its two again.
    assert (counts.parent, counts.child) == (2, 2 * len(started) + 2 * len(asks))
    # Each helper call and each work once: the cut counted the cut children's, the new children took them.
    assert result.steps[-1].counters["tool_calls"][0] == 2 * len(asks)
    assert not (result.snapshot or {}).get("carried_down")  # taken, not kept for another call


class AsksDeep:
    """The middle level's model: asks its ``deep`` sub-agent on ``deep <input>``, then answers ``found <input>``."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        asked = next(m.content for m in messages if m.role == "user")
        with self.counts.lock:
            self.counts.parent += 1  # counted with the parent's: the level between
        if any(m.role == "tool" for m in messages):
            return reply(f"found {asked}")
        return tool_turn(tool_call("deep", id=f"d-{asked}", input=f"deep {asked}"))

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return self.complete(messages, tools)


def _two_levels(counts: Counts, driver: str, release: threading.Event, timeout: float | None) -> Agent:
    deep = Agent(HangsInItsAnswer(counts, release), child_tools(counts, driver))
    middle_tools = ToolRegistry()
    middle_tools.register(deep.as_tool("deep", "Looks deeper."))
    middle = Agent(AsksDeep(counts), middle_tools)
    tools = ToolRegistry()
    tools.register(middle.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts, ("c1",)), tools, timeout=timeout)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_grandchild_cut_by_the_parents_deadline_has_its_completed_tool_taken_two_levels_down(driver: str) -> None:
    """The deadline cuts the deep run in its answer, after its ``work``: the resume's new deep run takes ``work``.

    On the sync driver neither sub-agent is cut yet when the parent's deadline
    reads them (each stops at its own deadline, on its own thread): what the
    deep run completed is read through the middle run's call in flight.
    """
    counts, release = Counts(), threading.Event()
    counts.go.set()
    try:
        cut = _cut(_two_levels(counts, driver, release, DEADLINE), driver)
    finally:
        counts.hold = False
        release.set()
    assert cut.reason == "timeout"
    assert cut.snapshot is not None
    assert counts.work == Counter({"w-deep c1": 1})
    [(name, _, kept)] = cut.snapshot["carried_down"]
    one_down = [json.loads(arguments)[1:] for _, arguments, _ in kept]  # [arguments of deep, tool, its arguments]
    assert (name, one_down) == ("helper", [["work", '{"item":"deep c1"}']])

    result = _resumed(_two_levels(counts, driver, release, None), driver, json.loads(json.dumps(cut.snapshot)))
    assert _answers(result) == {"c1": json.dumps("found c1")}
    assert counts.work == Counter({"w-deep c1": 1})  # the new deep run took it
    # The parent's reply and answer; the cut middle run's one (its deep call) and the new one's two; the cut deep
    # run's two (the second cut) and the new one's two.
    assert (counts.parent, counts.child) == (2 + 1 + 2, 2 + 2)
    # The helper call, the deep call and work, each once.
    assert result.steps[-1].counters["tool_calls"][0] == 3


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_at_the_deadline_stop_of_such_a_cut_takes_the_completed_tool_too(driver: str) -> None:
    """Forked at its ``timeout`` stop with the timeout lifted, the snapshot's hand-down goes to the fork's new child."""
    counts, release = Counts(), threading.Event()
    counts.go.set()
    try:
        cut = _cut(_agent(counts, driver, ("c1",), release, DEADLINE), driver)
    finally:
        counts.hold = False
        release.set()
    assert cut.snapshot is not None
    snapshot = json.loads(json.dumps(cut.snapshot))
    stop = len(cut.snapshot["trace"]) - 1
    agent = _agent(counts, driver, ("c1",), release, None)
    run = agent.fork(snapshot, stop, edit=ForkEdit(limits={"timeout": 60}))
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert _answers(result) == {"c1": json.dumps("found c1")}
    assert counts.work == Counter({"w-c1": 1})  # the fork's new child took it
    assert (counts.parent, counts.child) == (2, 4)  # the cut child's two model calls, the fork's child's two
