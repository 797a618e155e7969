"""A fork past a cut sub-agent call counts the call's tool calls exactly: never short, never twice.

docs/how-to/sub-agents.md "What the child spent" and fork-a-run.md: a cut
counts every tool call its child's run completed in the parent's
``tool_calls``; the call's recorded outcome then brings only what the child
did beyond what was counted (``drivers.child_spend``).  A fork rebuilds its
source with nothing called and counts no cut, so a recorded outcome it is
given (rebuilt before the fork point, or taken after it, or handed down to a
new sub-agent run) must bring the child's whole run.  It used to bring what
the outcome had brought its parent: a fork just after a stored cut call was
answered counted 5 tool calls for the source's 8.

The tree (``support.prepaid_cuts``): the parent asks ``helper`` for ``c1``;
the helper does ``work`` (1), asks ``deep`` (2), ``wait`` (3), ``work`` (4);
the deep run ``work`` (1), ``wait`` (2), ``work`` (3): 8 tool calls in all
(``WHOLE``).  Counted on both drivers and both stores: each tool execution
by (item, step), every model call by who made it, and ``tool_calls``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from support.forkcount_cuts import answered_at, as_json, fork_driven, tool_calls
from support.prepaid_cuts import ASKS_WAIT_FIRST, EVERY_CALL, FIRST_CUT, WHOLE, cut, finish
from support.storeless_children import Counts

from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
AT_FIRST_CUT = 3
"""What a cut in the deep run's ``wait`` counts: the helper's step 1 and the deep run's steps 1 and 2."""


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_just_after_a_stored_cut_call_was_answered_counts_the_cut_child_s_calls_once(
    store_target: str, driver: str
) -> None:
    """Cut with a store (3 counted), resumed to its end (8); forked just after ``c1``'s answer, the rebuilt fork
    holds 8 as the source did there (it held 5: the outcome brought only what the taken-back helper did beyond the
    cut), and ends at 8, calling nothing but the parent's model once."""
    counts = Counts()
    with open_store(store_target) as store:
        cut(counts, driver, store=store)
        assert counts.tools == FIRST_CUT
        assert tool_calls(store.load("p")) == AT_FIRST_CUT
        _finished_then_forked_at_the_answer(counts, driver, store)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_just_after_an_answer_whose_runs_took_a_storeless_cut_s_hand_down_counts_each_call_once(
    store_target: str, driver: str
) -> None:
    """Cut without a store (3), resumed with one and cut in the helper's wait (6), resumed to its end (8): the helper
    and its deep run took the first cut's hand-down (``prepaid``).  Forked just after ``c1``'s answer: 8, not 5."""
    counts = Counts()
    first = cut(counts, driver)
    with open_store(store_target) as store:
        counts.arm()
        cut(counts, driver, as_json(first.snapshot), store)
        assert tool_calls(store.load("p")) == AT_FIRST_CUT + 3
        _finished_then_forked_at_the_answer(counts, driver, store)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_of_a_stored_cut_whose_new_helper_is_cut_before_it_takes_its_hand_down_counts_each_call_once(
    store_target: str, driver: str
) -> None:
    """A stored cut (in the deep run's wait) forked from its recording at its stop, without a store: the fork's new
    helper takes its step 1, then asks ``wait`` (3) before ``deep`` and is cut there, still holding the deep run's
    steps 1 and 2, handed down by the fork, which no cut counted.  The fork resumed from its snapshot: its helper
    and deep runs take every outcome, the deep run makes its step 3 and the helper its step 4: 8 in all."""
    counts = Counts()
    with open_store(store_target) as store:
        cut(counts, driver, store=store)
        recording = store.export("p")
    at = len(recording["trace"]) - 1
    stopped, rebuilt = fork_driven(counts, driver, recording, at, script=ASKS_WAIT_FIRST, cut=True)
    assert rebuilt == 0  # rebuilt, the fork counts no cut
    assert counts.tools == FIRST_CUT + Counter({("c1", 3): 1})
    assert stopped.snapshot is not None
    assert tool_calls(stopped.snapshot) == 2  # the helper's step 1 (taken) and step 3
    result = finish(counts, driver, as_json(stopped.snapshot), script=ASKS_WAIT_FIRST)
    assert result.final == "done"
    assert counts.tools == EVERY_CALL  # nothing ran twice
    assert result.steps[-1].counters["tool_calls"][0] == WHOLE


def _finished_then_forked_at_the_answer(counts: Counts, driver: str, store: Any) -> None:
    """The stored cut source resumed to its end (8), then forked just after ``c1``'s answer: the rebuilt fork holds
    8 as the source did there and ends at 8, making no tool call and no sub-agent model call again."""
    source = finish(counts, driver, as_json(store.load("p")), store)
    stored = as_json(store.load("p"))
    assert source.final == "done"
    assert counts.tools == EVERY_CALL
    assert tool_calls(stored) == WHOLE
    before = Counter(counts.child)
    result, rebuilt = fork_driven(counts, driver, "p", answered_at(stored), store=store)
    forked = as_json(store.load("f"))
    assert result.final == "done"
    assert counts.tools == EVERY_CALL  # the fork made no tool call again
    assert counts.child - before == Counter({"parent": 1})  # nor a sub-agent's model call
    assert rebuilt == stored["steps"][0]["counters"]["tool_calls"][0] == WHOLE  # as the source at its answer
    assert tool_calls(forked) == result.steps[-1].counters["tool_calls"][0] == WHOLE
