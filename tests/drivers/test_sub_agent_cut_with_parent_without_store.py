"""A sub-agent cut with its parent by a cancel, without a store: the parent's resume repeats none of its tool calls.

docs/how-to/sub-agents.md "Cancelled with its parent": the call stays
pending and the parent stops ``cancelled``; its resume makes the call again.
With a store the child's stored run goes on where it stopped.  Without one
(the parent resumed from its snapshot) a fresh child run starts, and it used
to run again every tool call the cut child had completed.  The decision: the
parent's snapshot carries the cut child's completed outcomes for that call
(``carried_down``), and the fresh child takes them instead of calling its
tools again; its model calls are made again (counted below), and a tool call
the cut left in flight (the task's cancel cuts it, it never came back) runs
again, as after any cut.

Counted, on both drivers: the parent's model calls, each child's model calls,
each tool execution by (child input, step), across the cut and the resume.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from support.cancelled_with_parent import Canceller  # reads only the counts' started, go and hold
from support.storeless_children import SCRIPT, USAGE, Counts, nested_parent_agent, parent_agent, task_cut

from fsm_agent import Agent, AgentLoopError, AgentRun, CancelToken, RunResult, Usage
from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
CHILD_REPLIES = len(SCRIPT) + 1
"""The model calls of a child run from its start to its answer: one reply per tool call, then the answer."""


def _once(*items: str) -> Counter[tuple[str, int]]:
    """Each step of ``SCRIPT`` run once for each child input."""
    return Counter({(item, step): 1 for item in items for _, step in SCRIPT})


def _cut(
    counts: Counts, driver: str, asks: tuple[str, ...], expected: int, store: Any = None, agent: Agent | None = None
) -> RunResult:
    """The parent, its token cancelled from another thread once ``expected`` held ``wait`` calls are in flight."""
    agent, token = agent or parent_agent(counts, driver, asks), CancelToken()

    def run() -> RunResult:
        if driver == "sync":
            return agent.run("go", cancel=token, store=store, run_id="p")
        return asyncio.run(agent.arun("go", cancel=token, store=store, run_id="p"))

    with Canceller(counts, token, expected) as canceller, pytest.raises(AgentLoopError) as stop:
        run()
    assert canceller.done.is_set()  # the cancel came while the tools were in flight
    return stop.value.result


def _resumed(
    counts: Counts, driver: str, asks: tuple[str, ...], source: Any, store: Any = None, agent: Agent | None = None
) -> RunResult:
    """``source`` resumed with a fresh token, driven to its end; every outcome handed down was taken."""
    agent = agent or parent_agent(counts, driver, asks)
    if driver == "sync":
        run = agent.resume(source, cancel=CancelToken(), store=store)
        result = run.finish()
    else:

        async def go() -> tuple[AgentRun, RunResult]:
            run = await agent.aresume(source, cancel=CancelToken(), store=store)
            return run, await run.afinish()

        run, result = asyncio.run(go())
    assert run.snapshot()["carried_down"] == []
    return result


def _recut(counts: Counts, driver: str, source: Any) -> RunResult:
    """``source`` resumed and cut again by its new token, in the second held ``wait`` (step 5)."""
    counts.arm()
    agent, token = parent_agent(counts, driver), CancelToken()

    async def go() -> RunResult:
        return await (await agent.aresume(source, cancel=token)).afinish()

    def run() -> RunResult:
        return agent.resume(source, cancel=token).finish() if driver == "sync" else asyncio.run(go())

    with Canceller(counts, token, 1) as canceller, pytest.raises(AgentLoopError) as stop:
        run()
    assert canceller.done.is_set()
    return stop.value.result


def _answers(result: RunResult) -> dict[str, str]:
    return {m.tool_call_id or "": m.content for m in result.messages if m.role == "tool"}


def _carried(snapshot: dict[str, Any]) -> list[tuple[str, str, list[tuple[str, int]]]]:
    """What the stopped parent carries down, per sub-agent call: its tool, input, each outcome's (tool, step).

    Each entry names the call it was kept for: ``[call id, arguments]`` (each call's id is its input here).
    """
    entries = []
    for name, arguments, outcomes in snapshot["carried_down"]:
        call_id, kept_arguments = json.loads(arguments)
        assert call_id == json.loads(kept_arguments)["input"]
        steps = [(tool, json.loads(kept)["step"]) for tool, kept, _ in outcomes]
        entries.append((name, json.loads(kept_arguments)["input"], steps))
    return entries


@pytest.mark.parametrize("as_json", [False, True], ids=["snapshot", "json"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_child_cut_by_the_shared_token_resumed_without_a_store_runs_each_tool_once(
    driver: str, as_json: bool
) -> None:
    """The child completed steps 1 to 3 (the cancel landed in step 3, which came back); none runs again.

    What is repeated: the cut child's three model calls (the fresh child asks
    its model again, and takes the kept outcomes for the same calls), no more.
    """
    counts = Counts()
    cut = _cut(counts, driver, ("c1",), expected=1)
    assert (cut.reason, [call.id for call in cut.pending]) == ("cancelled", ["c1"])
    assert cut.snapshot is not None
    assert _carried(cut.snapshot) == [("helper", "c1", [("work", 1), ("work", 2), ("wait", 3)])]
    assert (counts.parent, counts.child["c1"]) == (1, 3)
    source = json.loads(json.dumps(cut.snapshot)) if as_json else cut.snapshot

    result = _resumed(counts, driver, ("c1",), source)
    assert result.final == "done"
    assert _answers(result) == {"c1": '"found c1"'}
    assert counts.tools == _once("c1")
    assert counts.parent == 2
    assert counts.child["c1"] == 3 + CHILD_REPLIES  # the cut child's 3 model calls are made again
    assert result.steps[-1].counters["tool_calls"][0] == 1 + len(SCRIPT)  # the helper and each child call, once


@pytest.mark.parametrize("driver", DRIVERS)
def test_two_children_cut_by_the_shared_token_resumed_without_a_store_run_each_tool_once(driver: str) -> None:
    """One reply asks ``c1`` and ``c2``: async cuts both in step 3; sync cuts ``c1`` and never starts ``c2``."""
    counts = Counts()
    asks = ("c1", "c2")
    started = asks if driver == "async" else ("c1",)
    cut = _cut(counts, driver, asks, expected=len(started))
    assert cut.snapshot is not None
    assert sorted(_carried(cut.snapshot)) == [
        ("helper", item, [("work", 1), ("work", 2), ("wait", 3)]) for item in started
    ]
    result = _resumed(counts, driver, asks, json.loads(json.dumps(cut.snapshot)))
    assert _answers(result) == {"c1": '"found c1"', "c2": '"found c2"'}
    assert counts.tools == _once(*asks)
    assert counts.parent == 2
    assert counts.child == Counter({item: (3 if item in started else 0) + CHILD_REPLIES for item in asks})


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_resumed_run_cut_again_and_resumed_again_runs_each_tool_once(driver: str) -> None:
    """Cut in step 3, resumed and cut again in step 5 (the fresh child took steps 1 to 3), resumed: each tool once."""
    counts = Counts()
    first = _cut(counts, driver, ("c1",), expected=1)
    assert first.snapshot is not None
    second = _recut(counts, driver, json.loads(json.dumps(first.snapshot)))
    assert second.reason == "cancelled"
    assert second.snapshot is not None
    assert _carried(second.snapshot) == [("helper", "c1", [*SCRIPT])]
    assert counts.child["c1"] == 3 + 5  # the second child asked for steps 1 to 5 before its cut

    result = _resumed(counts, driver, ("c1",), json.loads(json.dumps(second.snapshot)))
    assert _answers(result) == {"c1": '"found c1"'}
    assert counts.tools == _once("c1")
    assert (counts.parent, counts.child["c1"]) == (2, 3 + 5 + CHILD_REPLIES)
    assert result.steps[-1].counters["tool_calls"][0] == 1 + len(SCRIPT)


def test_a_child_cut_by_the_parents_task_cancel_resumed_without_a_store_runs_each_completed_tool_once() -> None:
    """Async: the task's cancel cuts step 3 in flight (it never came back): it runs again; steps 1 and 2 do not."""
    counts = Counts()
    snapshot = task_cut(parent_agent(counts, "async"), counts)
    assert _carried(snapshot) == [("helper", "c1", [("work", 1), ("work", 2)])]
    assert (counts.parent, counts.child["c1"]) == (1, 3)

    result = _resumed(counts, "async", ("c1",), json.loads(json.dumps(snapshot)))
    assert _answers(result) == {"c1": '"found c1"'}
    assert counts.tools == _once("c1") + Counter({("c1", 3): 1})  # step 3, cut in flight, made again
    assert (counts.parent, counts.child["c1"]) == (2, 3 + CHILD_REPLIES)


def test_a_run_cut_twice_by_its_tasks_cancel_runs_each_completed_tool_once() -> None:
    """Async: cut in step 3, resumed and cut in step 5, resumed: only the two calls cut in flight ran twice."""
    counts = Counts()
    first = task_cut(parent_agent(counts, "async"), counts)
    counts.arm()
    second = task_cut(parent_agent(counts, "async"), counts, json.loads(json.dumps(first)))
    assert _carried(second) == [("helper", "c1", [("work", 1), ("work", 2), ("wait", 3), ("work", 4)])]

    result = _resumed(counts, "async", ("c1",), json.loads(json.dumps(second)))
    assert _answers(result) == {"c1": '"found c1"'}
    assert counts.tools == _once("c1") + Counter({("c1", 3): 1, ("c1", 5): 1})
    assert (counts.parent, counts.child["c1"]) == (2, 3 + 5 + CHILD_REPLIES)


@pytest.mark.parametrize("driver", DRIVERS)
def test_with_a_store_the_cut_child_goes_on_from_its_stored_run_and_nothing_is_carried(
    store_target: str, driver: str
) -> None:
    """SQLite and PostgreSQL: the stored child resumes after step 3: no tool and no model call of it is repeated."""
    counts = Counts()
    with open_store(store_target) as store:
        cut = _cut(counts, driver, ("c1",), expected=1, store=store)
        stored = store.load("p")
        assert stored["carried_down"] == []  # the child's stored run holds what it did
        result = _resumed(counts, driver, ("c1",), stored, store)
    assert _answers(result) == {"c1": '"found c1"'}
    assert cut.reason == "cancelled"
    assert counts.tools == _once("c1")
    assert (counts.parent, counts.child["c1"]) == (2, CHILD_REPLIES)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cut_childs_own_sub_agent_answer_is_taken_again_and_its_tokens_counted_once(driver: str) -> None:
    """The child asked its ``deep`` sub-agent (step 1), then was cut in ``wait`` (step 2): ``deep`` is not asked again.

    The cut counted ``deep``'s reply with the child's spend; the kept answer
    the new child takes brings its tool calls, not its tokens again: the
    parent's usage is every reply made, each once.
    """
    counts = Counts()
    cut = _cut(counts, driver, ("c1",), expected=1, agent=nested_parent_agent(counts, driver))
    assert cut.snapshot is not None
    assert [[tool for tool, _, _ in outcomes] for _, _, outcomes in cut.snapshot["carried_down"]] == [["deep", "wait"]]
    assert (counts.child["c1"], counts.child["deep"]) == (2, 1)

    result = _resumed(
        counts, driver, ("c1",), json.loads(json.dumps(cut.snapshot)), agent=nested_parent_agent(counts, driver)
    )
    assert _answers(result) == {"c1": '"found c1"'}
    assert counts.tools == Counter({("c1", 2): 1})
    assert (counts.parent, counts.child["c1"], counts.child["deep"]) == (2, 2 + 3, 1)
    made = [("parent", counts.parent), ("child", counts.child["c1"]), ("deep", counts.child["deep"])]
    spent = Usage(
        sum(USAGE[who].input_tokens * n for who, n in made), sum(USAGE[who].output_tokens * n for who, n in made)
    )
    assert (result.usage.input_tokens, result.usage.output_tokens) == (spent.input_tokens, spent.output_tokens)
    assert result.steps[-1].counters["tool_calls"][0] == 3  # the helper, and the child's deep and wait, each once
