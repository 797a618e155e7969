"""What a cut counted of a sub-agent's run counts once, however the run is stored between cuts and taken back.

docs/how-to/sub-agents.md "What the child spent": a cut counts every tool
call the cut child completed in the parent's ``tool_calls``; without a store
the call made again starts a new child handed those outcomes, which takes
them and leaves them out of what it reports (``prepaid``).  That mark once
lived only on the new child's stepper.  A store-less cut resumed with a store
stores that new child; cut again and taken back (or read back) from the
store, the child's run came back without it, so what it took counted
a second time (the parent ended at 9 tool calls for 8).  The record a cut
keeps of a child now holds the child's run as its own counters say, taken
outcomes included, so a run taken back agrees with it whatever it knows of
the cut.  The marks are stored with the child's run too (``prepaid``), so a
child cut again before it took its whole hand-down, taken back, still
leaves the rest out; and a fork of such a run counts each call once too
(``drivers/fork_spend``).

The scenario (``support.prepaid_cuts``): the parent asks ``helper`` for
``c1``; the helper does ``work`` (1), asks its ``deep`` sub-agent (2), then
``wait`` (3) and ``work`` (4); the deep run does ``work`` (1), ``wait`` (2)
and ``work`` (3).  The first cut lands in the deep run's wait, the second in
the helper's.  Counted on both drivers: each tool execution by (item, step),
every model call by who made it, and ``tool_calls`` at each level.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from support.deadline_cuts import DEADLINE
from support.prepaid_cuts import (
    ASKS_WAIT_FIRST,
    EVERY_CALL,
    FIRST_CUT,
    WHOLE,
    cut,
    deadline_cut,
    finish,
    parent_agent,
)
from support.storeless_children import Counts

from fsm_agent import Agent, CancelToken, RunResult
from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
AT_FIRST_CUT = 3
"""The first cut's count: the helper's step 1 and the deep run's steps 1 and 2."""
AT_SECOND_CUT = AT_FIRST_CUT + 3
"""The second cut adds what the new helper did beyond what it took: the deep call (its run adding its step 3 beyond
the two it took) and the helper's step 3."""


def _json(data: Any) -> dict[str, Any]:
    return json.loads(json.dumps(data))


def _tool_calls(data: Any) -> int:
    """A run's ``tool_calls`` as its snapshot says, through JSON."""
    return int(_json(data)["counters"]["tool_calls"])


def _deep_run(store: Any) -> dict[str, Any]:
    """The stored run of the helper's ``deep`` call (its id names the helper's call id, made by its model)."""
    [run_id] = [run.run_id for run in store.list_runs() if run.run_id.startswith("p/c1/")]
    return dict(store.load(run_id))


def _storeless_cut(counts: Counts, driver: str) -> dict[str, Any]:
    """The parent cut without a store in the deep run's wait (step 2): its snapshot, checked, through JSON."""
    first = cut(counts, driver)
    assert first.snapshot is not None
    assert counts.tools == FIRST_CUT
    assert _tool_calls(first.snapshot) == AT_FIRST_CUT
    return _json(first.snapshot)


def _cut_again_with(counts: Counts, driver: str, source: dict[str, Any], store: Any) -> dict[str, Any]:
    """``source`` resumed with ``store`` and cut in the helper's wait (step 3): the stored parent, checked."""
    counts.arm()
    cut(counts, driver, source, store)
    stored = _json(store.load("p"))
    assert counts.tools == FIRST_CUT + Counter({("deep c1", 3): 1, ("c1", 3): 1})  # nothing handed down ran again
    assert _tool_calls(stored) == AT_SECOND_CUT
    return stored


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_storeless_cut_resumed_with_a_store_cut_again_and_taken_back_counts_each_call_once(
    store_target: str, driver: str
) -> None:
    """SQLite and PostgreSQL: 3 at the first cut, 6 at the second, 8 at the end, each call made once."""
    counts = Counts()
    source = _storeless_cut(counts, driver)
    with open_store(store_target) as store:
        stored = _cut_again_with(counts, driver, source, store)
        cut_helper = _json(store.load("p/c1"))
        result = finish(counts, driver, stored, store)
        final, helper, deep = _json(store.load("p")), _json(store.load("p/c1")), _deep_run(store)
    assert result.final == "done"
    assert counts.tools == EVERY_CALL  # every tool call ran once
    # The parent's two replies; each helper run's replies (2 cut, 3 again, 2 taken back); the deep runs' (2, 4).
    assert counts.child == Counter({"parent": 2, "c1": 2 + 3 + 2, "deep c1": 2 + 4})
    assert _tool_calls(final) == result.steps[-1].counters["tool_calls"][0] == WHOLE
    assert _tool_calls(helper) == 5  # its step 1 (taken), the deep call and step 3 of the deep run, steps 3 and 4
    assert _tool_calls(deep) == 3  # steps 1 and 2 taken, step 3 made
    # What the second cut kept of the helper agrees with its stored run then: its step 1 (taken), the deep call (the
    # deep run bringing its step 3, beyond the two it took) and its step 3.
    assert _tool_calls(cut_helper) == stored["cut_children"]["c1"]["tool_calls"] == 4


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stored_cut_resumed_without_its_store_makes_the_call_afresh_and_counts_each_execution_once(
    store_target: str, driver: str
) -> None:
    """The other way round: a stored cut hands nothing down; resumed without the store, a new helper makes every call
    again, and each execution counts once (3 at the cut, the fresh tree's 8 after it)."""
    counts = Counts()
    with open_store(store_target) as store:
        first = cut(counts, driver, store=store)
        source = _json(store.load("p"))
    assert first.reason == "cancelled"
    assert counts.tools == FIRST_CUT
    assert _tool_calls(source) == AT_FIRST_CUT
    assert not source["carried_down"]  # a store keeps the child's run: nothing is handed down
    result = finish(counts, driver, source)
    assert result.final == "done"
    assert counts.tools == EVERY_CALL + FIRST_CUT
    assert counts.child == Counter({"parent": 2, "c1": 2 + 5, "deep c1": 2 + 4})
    assert result.steps[-1].counters["tool_calls"][0] == AT_FIRST_CUT + WHOLE


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_cut_without_a_store_then_with_one_and_resumed_without_it_counts_each_execution_once(
    store_target: str, driver: str
) -> None:
    """The second cut's stored parent resumed without the store: its new helper starts afresh (the stored helper
    took the hand-down), so its 8 calls count beside the 6 the two cuts counted."""
    counts = Counts()
    source = _storeless_cut(counts, driver)
    with open_store(store_target) as store:
        stored = _cut_again_with(counts, driver, source, store)
    assert not stored["carried_down"]
    result = finish(counts, driver, stored)
    assert result.final == "done"
    assert counts.tools == EVERY_CALL + FIRST_CUT + Counter({("deep c1", 3): 1, ("c1", 3): 1})
    assert counts.child == Counter({"parent": 2, "c1": 2 + 3 + 5, "deep c1": 2 + 4 + 4})
    assert result.steps[-1].counters["tool_calls"][0] == AT_SECOND_CUT + WHOLE


def _forked(agent: Agent, driver: str, store: Any, at: int) -> RunResult:
    """A fork ``f`` of the stored run ``p`` after transition ``at``, driven to its end."""
    if driver == "sync":
        return agent.fork("p", at, store=store, run_id="f", cancel=CancelToken()).finish()

    async def go() -> RunResult:
        return await (await agent.afork("p", at, store=store, run_id="f", cancel=CancelToken())).afinish()

    return asyncio.run(go())


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_of_a_run_cut_without_a_store_then_with_one_counts_each_call_once(
    store_target: str, driver: str
) -> None:
    """A fork of the second cut's stored parent at its stop: rebuilt, it counts none of the cuts; its new helper
    takes every call the stored helper and deep run completed (8 in all), and only the helper's step 4 runs."""
    counts = Counts()
    source = _storeless_cut(counts, driver)
    with open_store(store_target) as store:
        stored = _cut_again_with(counts, driver, source, store)
        result = _forked(parent_agent(counts, driver), driver, store, len(stored["trace"]) - 1)
        final = _json(store.load("f"))
    assert result.final == "done"
    assert counts.tools == EVERY_CALL
    assert _tool_calls(final) == result.steps[-1].counters["tool_calls"][0] == WHOLE


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_storeless_cut_resumed_with_a_store_and_cut_at_its_deadline_takes_its_child_back_counting_each_call_once(
    store_target: str, driver: str
) -> None:
    """The second cut is the parent's deadline (``DEADLINE``, 2 s against milliseconds of work before the held call,
    ``support.deadline_cuts``); the helper's stored run ends then (sync: on its thread, at its own deadline, the
    parent's; async: cancelled with the parent's task), its step 3 left in flight or come back.  Its stop is the
    parent's, so the parent's resume takes it back and it goes on: its step 3 made again if it was in flight (as
    any call cut in flight is), its taken step 1 not again, each call counted once."""
    counts = Counts()
    source = _storeless_cut(counts, driver)
    with open_store(store_target) as store:
        counts.arm()
        stopped = deadline_cut(counts, driver, source, store, DEADLINE)
        at_cut = _json(store.load("p"))
        assert stopped.reason == "timeout"
        assert at_cut["pending"]  # cut in flight: the helper's stop at the same deadline is no answer
        # The helper's step 1 (taken) and the deep call, its run bringing its step 3: the cut adds 2 to the 3.
        assert _tool_calls(at_cut) == AT_FIRST_CUT + 2
        helper = _json(store.load("p/c1"))
        assert helper["reason"] == ("timeout" if driver == "sync" else "cancelled")
        result = finish(counts, driver, at_cut, store, timeout=60.0)
        final, after = _json(store.load("p")), _json(store.load("p/c1"))
    assert (result.final, after["state"]) == ("done", "Done")
    assert result.messages[2].content == '"found c1"'  # its answer, not its stop
    came_back = sum(1 for step in helper["steps"] if step["detail"].startswith("wait("))
    assert counts.tools == EVERY_CALL + Counter({("c1", 3): 1 - came_back})  # step 3 again only if in flight
    # The parent's two replies; the helper's (2 cut, 3 again, 2 taken back); the deep runs' (2, 4).
    assert counts.child == Counter({"parent": 2, "c1": 2 + 3 + 2, "deep c1": 2 + 4})
    assert _tool_calls(final) == result.steps[-1].counters["tool_calls"][0] == WHOLE


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_helper_cut_again_before_it_takes_its_whole_hand_down_counts_the_rest_once_when_taken_back(
    store_target: str, driver: str
) -> None:
    """Asked again, the helper's model asks ``wait`` (step 3) before ``deep``: the second cut lands there, while the
    helper still holds what the deep run had completed (steps 1 and 2), counted by the first cut.  Taken back from
    the store, it hands them to its new deep run, which takes them: they must not count again."""
    counts = Counts()
    source = _storeless_cut(counts, driver)
    with open_store(store_target) as store:
        counts.arm()
        cut(counts, driver, source, store, ASKS_WAIT_FIRST)
        stored = _json(store.load("p"))
        assert _json(store.load("p/c1"))["carried_down"]  # the deep run's hand-down, not taken yet
        assert _tool_calls(stored) == AT_FIRST_CUT + 1  # the helper's step 3 (its step 1 taken)
        result = finish(counts, driver, stored, store, ASKS_WAIT_FIRST)
        final = _json(store.load("p"))
    assert result.final == "done"
    assert counts.tools == EVERY_CALL
    assert _tool_calls(final) == result.steps[-1].counters["tool_calls"][0] == WHOLE
