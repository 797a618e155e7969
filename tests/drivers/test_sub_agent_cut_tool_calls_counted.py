"""A sub-agent cut in flight: every tool call its run completed counts once in the parent's ``tool_calls``.

docs/how-to/sub-agents.md "What the child spent": a cut (the parent's cancel
token, its task cancelled) counts what the child's run spent, its tool calls
included, whatever becomes of the call: made again and answered, refused (a
budget leaves it nothing), rejected by a person, or cut again.  It used to
count the tool calls only with the call's outcome, so a refused or rejected
call lost them, though its tokens counted.  Never twice: the call made again
takes the cut child's completed outcomes (no store) or its stored run (a
store), and neither brings them again.

The scenario (``support.storeless_grandchildren``): the parent asks its
``helper`` sub-agent for ``c1``; the helper did ``work`` (step 1) and asked
its ``deep`` sub-agent, which did ``work`` (step 1) and ``wait`` (step 2), the
cut's, when the parent's token is cancelled: 3 tool calls completed.  Run
to its end, the parent counts 7: the helper call, the helper's 3 calls (its
``deep`` call among them) and the deep run's 3.  Counted, on both drivers:
each tool execution by (item, step), every model call by who made it, and
the parent's ``tool_calls`` exactly (its snapshot's counters, through JSON).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from support.storeless_children import Counts, task_cut
from support.storeless_children import parent_agent as flat_parent
from support.storeless_grandchildren import CHILD_SCRIPT, DEEP_SCRIPT, cut_together, parent_agent, resumed

from fsm_agent import CancelToken, RunResult
from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
AT_CUT = 3
"""The tool calls the cut helper and its deep run completed: the helper's step 1, the deep run's steps 1 and 2."""
DONE_AT_CUT = Counter({("c1", 1): 1, ("deep c1", 1): 1, ("deep c1", 2): 1})
WHOLE = 1 + len(CHILD_SCRIPT) + len(DEEP_SCRIPT)
"""The parent's tool calls of one helper call run to its end: the call, the helper's calls, the deep run's."""


def _everything_once(item: str = "c1") -> Counter[tuple[str, int]]:
    steps = [(item, step) for tool, step in CHILD_SCRIPT if tool != "deep"]
    return Counter(dict.fromkeys([*steps, *((f"deep {item}", step) for _, step in DEEP_SCRIPT)], 1))


def _counted(snapshot: dict[str, Any]) -> int:
    """The parent's ``tool_calls``, as its snapshot says after a JSON round trip."""
    return int(json.loads(json.dumps(snapshot))["counters"]["tool_calls"])


def _told(result: RunResult, call_id: str) -> str:
    return next(m.content for m in result.messages if m.role == "tool" and m.tool_call_id == call_id)


def _cut(counts: Counts, driver: str, store: Any = None, **settings: Any) -> dict[str, Any]:
    """The parent cut by its token with the deep run's ``wait`` in flight: its snapshot (the stored one, if any)."""
    cut = cut_together(counts, driver, store=store, **settings)
    assert cut.reason == "cancelled"
    assert counts.tools == DONE_AT_CUT
    assert cut.snapshot is not None
    source = cut.snapshot if store is None else dict(store.load("p"))
    return json.loads(json.dumps(source))


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cut_counts_the_tool_calls_its_child_completed_and_the_resume_adds_only_the_rest(driver: str) -> None:
    """No store: 3 at the cut (through JSON); the call made again takes them and brings only its new ones: 7."""
    counts = Counts()
    source = _cut(counts, driver)
    assert _counted(source) == AT_CUT
    assert source["cut_children"]["c1"]["tool_calls"] == AT_CUT  # the evidence the snapshot's check reads

    final, result = resumed(parent_agent(counts, driver), driver, source)
    assert result.final == "done"
    assert counts.tools == _everything_once()  # no completed call ran twice
    assert _counted(final) == WHOLE
    assert result.steps[-1].counters["tool_calls"][0] == WHOLE


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stored_cut_counts_the_tool_calls_its_child_completed_and_the_taken_back_run_adds_only_the_rest(
    store_target: str, driver: str
) -> None:
    """SQLite and PostgreSQL: the stored parent holds 3 at the cut; its child's stored run, taken back, adds 4."""
    counts = Counts()
    with open_store(store_target) as store:
        source = _cut(counts, driver, store)
        assert _counted(source) == AT_CUT
        final, result = resumed(parent_agent(counts, driver), driver, source, store=store)
    assert result.final == "done"
    assert counts.tools == _everything_once()
    assert _counted(final) == WHOLE


def _refused(counts: Counts, driver: str, store: Any) -> None:
    """Resumed with the token budget the cut used up: the call is refused, and its cut child's 3 calls still count.

    The refused call is one more of the parent's tool calls (its step).
    """
    source = _cut(counts, driver, store)
    spent = source["counters"]["input_tokens"] + source["counters"]["output_tokens"]
    final, result = resumed(parent_agent(counts, driver), driver, source, store=store, token_budget=spent)
    assert result.reason == "token_budget"
    assert "token budget is used up" in _told(result, "c1")
    assert counts.tools == DONE_AT_CUT  # nothing ran again
    assert _counted(final) == AT_CUT + 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cut_call_refused_by_the_token_budget_keeps_the_tool_calls_its_child_completed(driver: str) -> None:
    """No store: the refused call's cut child's 3 calls count."""
    _refused(Counts(), driver, None)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stored_cut_call_refused_by_the_token_budget_keeps_the_tool_calls_its_child_completed(
    store_target: str, driver: str
) -> None:
    """SQLite and PostgreSQL: the refused call's cut child's 3 calls count."""
    with open_store(store_target) as store:
        _refused(Counts(), driver, store)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cut_call_the_tool_call_total_leaves_no_room_for_keeps_its_count_and_runs_nothing(driver: str) -> None:
    """Resumed with ``max_tool_calls=3``: the cut's 3 calls reach it, so the parent stops before making the call."""
    counts = Counts()
    source = _cut(counts, driver)
    final, result = resumed(parent_agent(counts, driver), driver, source, max_tool_calls=AT_CUT)
    assert result.reason == "max_tool_calls"
    assert result.evidence["counters"]["tool_calls"] == [AT_CUT, AT_CUT]
    assert counts.tools == DONE_AT_CUT
    assert counts.child == Counter({"parent": 1, "c1": 2, "deep c1": 2})  # no model call made again
    assert _counted(final) == AT_CUT


def _rejected(counts: Counts, driver: str, store: Any) -> None:
    """Resumed with the helper call rejected: the cut's 3, the rejected call, ``note`` and the new request's 7."""
    source = _cut(counts, driver, store, again=True)
    assert _counted(source) == AT_CUT
    agent = parent_agent(counts, driver, again=True, approve=lambda call: call.id == "c1")
    final, result = resumed(agent, driver, source, store=store, approvals={"c1": "not now"})
    assert result.final == "done"
    assert "a person rejected this call" in _told(result, "c1")
    assert counts.tools == _everything_once() + DONE_AT_CUT + Counter({("note", 0): 1})
    assert _counted(final) == AT_CUT + 1 + 1 + WHOLE


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cut_call_a_person_rejects_keeps_the_tool_calls_its_child_completed(driver: str) -> None:
    """No store: the rejected call's cut child's 3 calls count."""
    _rejected(Counts(), driver, None)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stored_cut_call_a_person_rejects_keeps_the_tool_calls_its_child_completed(
    store_target: str, driver: str
) -> None:
    """SQLite and PostgreSQL: the rejected call's cut child's 3 calls count."""
    with open_store(store_target) as store:
        _rejected(Counts(), driver, store)


def test_two_children_cut_in_one_batch_count_each_ones_calls_once() -> None:
    """Async, ``c1`` and ``c2`` in one batch, both cut: 3 each at the cut, 7 each at the end."""
    counts = Counts()
    cut = cut_together(counts, "async", ("c1", "c2"))
    assert cut.snapshot is not None
    assert _counted(cut.snapshot) == 2 * AT_CUT
    final, result = resumed(parent_agent(counts, "async", ("c1", "c2")), "async", json.loads(json.dumps(cut.snapshot)))
    assert result.final == "done"
    assert counts.tools == _everything_once("c1") + _everything_once("c2")
    assert _counted(final) == 2 * WHOLE


def test_a_run_cut_twice_by_its_tasks_cancel_counts_each_completed_call_once() -> None:
    """Async, no store: cut in step 3 (2 completed), resumed and cut in step 5 (the new child took 2, did 2 more).

    The calls cut in flight (steps 3 and 5 of the first and second child)
    never came back: they ran again, and count once, when they completed.
    """
    counts = Counts()
    first = task_cut(flat_parent(counts, "async"), counts)
    assert _counted(first) == 2
    counts.arm()
    second = task_cut(flat_parent(counts, "async"), counts, json.loads(json.dumps(first)))
    assert _counted(second) == 4  # steps 1 and 2 taken, not counted again; steps 3 and 4 completed
    final, result = resumed(flat_parent(counts, "async"), "async", json.loads(json.dumps(second)))
    assert result.final == "done"
    assert counts.tools == Counter({("c1", step): 1 for step in range(1, 6)}) + Counter({("c1", 3): 1, ("c1", 5): 1})
    assert _counted(final) == 1 + 5


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_of_a_stored_cut_counts_each_completed_call_once(store_target: str, driver: str) -> None:
    """A fork of the stored cut parent at its stop: its child takes the cut child's completed calls, counted once."""
    counts = Counts()
    with open_store(store_target) as store:
        source = _cut(counts, driver, store)
        agent = parent_agent(counts, driver)
        at = len(source["trace"]) - 1
        if driver == "sync":
            result = agent.fork("p", at, store=store, run_id="f", cancel=CancelToken()).finish()
        else:

            async def go() -> RunResult:
                return await (await agent.afork("p", at, store=store, run_id="f", cancel=CancelToken())).afinish()

            result = asyncio.run(go())
        final = dict(store.load("f"))
    assert result.final == "done"
    assert counts.tools == _everything_once()
    assert _counted(final) == WHOLE


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_of_a_cut_snapshot_counts_each_completed_call_once(driver: str) -> None:
    """No store: a fork of the cut's snapshot starts from 0 (rebuilt, it counted no cut) and ends at 7, not 10."""
    counts = Counts()
    source = _cut(counts, driver)
    agent = parent_agent(counts, driver)
    at = len(source["trace"]) - 1
    if driver == "sync":
        run = agent.fork(source, at, cancel=CancelToken())
        assert run.snapshot()["counters"]["tool_calls"] == 0
        result = run.finish()
    else:

        async def go() -> RunResult:
            run = await agent.afork(source, at, cancel=CancelToken())
            assert run.snapshot()["counters"]["tool_calls"] == 0
            return await run.afinish()

        result = asyncio.run(go())
    assert result.final == "done"
    assert counts.tools == _everything_once()
    assert result.steps[-1].counters["tool_calls"][0] == WHOLE
