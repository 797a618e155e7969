"""A cut's hand-down marks each outcome it counted (``prepaid``), so a mixed hand-down counts each call once.

docs/how-to/sub-agents.md "What bounds the child": a cut counts in the
parent's ``tool_calls`` what its child's run did (ran, or took), and hands
down those outcomes beside the ones the run was handed and never took.  Only
the first are marked counted (the snapshot's ``prepaid``, by where each came
from); the run that takes the others counts them.  One mark for the whole
hand-down used to leave the untaken ones counted nowhere: 6 tool calls for 8.

The tree (``support.prepaid_cuts``): the parent asks ``helper`` for ``c1``;
the helper does ``work`` (1), ``wait`` (3) (asked before ``deep`` here,
``ASKS_WAIT_FIRST``), ``deep`` (2), ``work`` (4); the deep run ``work`` (1),
``wait`` (2), ``work`` (3): 8 tool calls in all (``WHOLE``).  A stored cut in
the deep run's wait is forked without a store; the fork's new helper takes
step 1 and is cut in its ``wait``, still holding the deep run's steps 1 and 2.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from support.forkcount_cuts import as_json, fork_driven, tool_calls
from support.prepaid_cuts import ASKS_WAIT_FIRST, EVERY_CALL, FIRST_CUT, WHOLE, cut, finish, parent_agent
from support.storeless_children import Counts

from fsm_agent import SnapshotError
from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
RESUMED_MODEL_CALLS = Counter({"parent": 1, "c1": 5, "deep c1": 4})
"""The resumed fork's model calls: its parent's answer, the new helper's 4 calls and answer, the deep run's 3 and
answer (a store-less cut's model calls are made again; its tool calls are not)."""


def _fork_cut(counts: Counts, driver: str, store_target: str) -> dict[str, Any]:
    """The stored cut of ``p`` forked at its stop without a store, and the fork cut in its helper's ``wait``."""
    with open_store(store_target) as store:
        cut(counts, driver, store=store)
        recording = store.export("p")
    stopped, _ = fork_driven(counts, driver, recording, len(recording["trace"]) - 1, script=ASKS_WAIT_FIRST, cut=True)
    assert stopped.snapshot is not None
    return as_json(stopped.snapshot)


def _handed(snapshot: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Where the outcomes handed down for ``c1`` came from: the helper's own, and those for its ``deep`` run."""
    [(_, _, outcomes)] = snapshot["carried_down"]
    own = {result["reused_from"] for _, arguments, result in outcomes if not arguments.startswith("[")}
    below = {result["reused_from"] for _, arguments, result in outcomes if arguments.startswith("[")}
    return own, below


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cut_marks_what_its_child_did_and_not_what_it_was_handed_and_never_took(
    store_target: str, driver: str
) -> None:
    """The fork's cut counts 2 (the helper's step 1, taken, and step 3, run) and marks those two outcomes only."""
    counts = Counts()
    snapshot = _fork_cut(counts, driver, store_target)
    assert counts.tools == FIRST_CUT + Counter({("c1", 3): 1})  # the fork ran only the helper's wait
    own, below = _handed(snapshot)
    assert len(own) == 2
    assert len(below) == 2
    assert tool_calls(snapshot) == 2
    assert set(snapshot["prepaid"]) == own  # the deep run's steps 1 and 2, which no cut counted, are not marked


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_mixed_hand_down_resumed_with_a_store_counts_each_call_once_and_stores_the_marks_with_the_helper(
    store_target: str, driver: str
) -> None:
    """The fork's cut resumed with a store: 8, nothing run twice; the marks move to the helper's stored run, and
    the parent's stored snapshot keeps none once the helper took them (a journal entry drops no field)."""
    counts = Counts()
    snapshot = _fork_cut(counts, driver, store_target)
    own, _ = _handed(snapshot)
    before = Counter(counts.child)
    with open_store(store_target) as store:
        result = finish(counts, driver, snapshot, store, script=ASKS_WAIT_FIRST)
        parent = as_json(store.load(snapshot["run_id"]))
        [helper_id] = [step.child for step in result.steps if step.child]
        helper = as_json(store.load(helper_id))
    assert result.final == "done"
    assert counts.tools == EVERY_CALL  # each tool call of the tree ran once, over the cut and the resume
    assert counts.child - before == RESUMED_MODEL_CALLS
    assert result.steps[-1].counters["tool_calls"][0] == tool_calls(parent) == WHOLE
    assert parent["prepaid"] == []
    assert parent["carried_down"] == []
    assert set(helper["prepaid"]) == own


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_mixed_hand_down_resumed_without_a_store_counts_each_call_once(store_target: str, driver: str) -> None:
    """The fork's cut resumed from its snapshot alone: 8, each tool call of the tree run once, each model call
    of the new runs made once."""
    counts = Counts()
    snapshot = _fork_cut(counts, driver, store_target)
    before = Counter(counts.child)
    result = finish(counts, driver, snapshot, script=ASKS_WAIT_FIRST)
    assert result.final == "done"
    assert counts.tools == EVERY_CALL
    assert counts.child - before == RESUMED_MODEL_CALLS
    assert result.steps[-1].counters["tool_calls"][0] == WHOLE


def _resumed(counts: Counts, driver: str, snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` loaded by a resume on ``driver``, nothing driven: the run's snapshot as loaded."""
    agent = parent_agent(counts, driver, ASKS_WAIT_FIRST)
    if driver == "async":

        async def load() -> dict[str, Any]:
            return (await agent.aresume(snapshot)).snapshot()

        return asyncio.run(load())
    return agent.resume(snapshot).snapshot()


@pytest.mark.parametrize(
    ("prepaid", "why"),
    [
        (True, "must be a list of texts"),
        ("p/c1", "must be a list of texts"),
        ([1], "must be a list of texts"),
        (["same", "same"], "names one outcome twice"),
        (["nowhere/c9"], "neither took nor holds"),
    ],
)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_malformed_prepaid_is_refused_naming_it_and_nothing_runs(
    store_target: str, driver: str, prepaid: object, why: str
) -> None:
    """A ``prepaid`` that is not a list of distinct texts, each naming an outcome the run holds, is refused."""
    counts = Counts()
    snapshot = _fork_cut(counts, driver, store_target)
    ran, asked = Counter(counts.tools), Counter(counts.child)
    with pytest.raises(SnapshotError, match="prepaid") as refused:
        _resumed(counts, driver, {**snapshot, "prepaid": prepaid})
    assert why in str(refused.value)
    assert counts.tools == ran
    assert counts.child == asked


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_snapshot_without_prepaid_loads_as_nothing_prepaid(store_target: str, driver: str) -> None:
    """Absent (a snapshot from before the field), nothing is marked; the marks a loaded run holds are written."""
    counts = Counts()
    snapshot = _fork_cut(counts, driver, store_target)
    assert _resumed(counts, driver, {k: v for k, v in snapshot.items() if k != "prepaid"})["prepaid"] == []
    assert _resumed(counts, driver, snapshot)["prepaid"] == snapshot["prepaid"]
