"""A fork past a cut sub-agent call counts the call's tokens, dollars and model calls exactly, as its tool calls.

docs/how-to/fork-a-run.md and sub-agents.md "Each reply counted once": a
cut counts what its child's run spent so far; the call made again takes the
child's stored run back and its outcome brings only what the run spent
beyond that.  A fork counts no cut, so the outcome it is given (rebuilt
before the fork point, or taken after it) must bring the child's whole run:
every token part, the dollars, the priced and unpriced model calls, the
tool calls.  It brought the whole run's tool calls only, so a fork just
after the answer counted 1800 input tokens where its source had counted
2302, 6 priced model calls for 10.

The tree is ``support.forkspend_tree``'s (``support.prepaid_cuts``'s, each
reply's usage its own, each agent priced).  The source is compared with
itself transition by transition (``Seen``: its counters after each), so the
fork is held to what the source had where the fork was taken.  Counted on
both drivers and both stores: each tool execution by (item, step), every
model call by who made it; the fork makes none but its parent's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from support.forkcount_cuts import answered_at, as_json
from support.forkspend_tree import (
    Seen,
    driven,
    parent_agent,
    spent,
    stored_cut_then_finished,
    storeless_then_stored_cut,
)
from support.prepaid_cuts import WHOLE
from support.storeless_children import Counts

from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
POINTS = ["answer", "later", "taken"]
"""Where the fork is taken: just after ``c1``'s answer, after the parent's last reply (both rebuilt past the
answer), or while ``c1`` was in flight, before the cut (its outcome taken after the fork point)."""


def _same(fork: dict[str, Any], source: dict[str, Any]) -> None:
    """``fork``'s spend is ``source``'s (``spent``): every count exactly, the dollars to the 12th decimal."""
    assert {**fork, "cost": None} == {**source, "cost": None}
    if source["cost"] is None:
        assert fork["cost"] is None
    else:
        assert fork["cost"] == pytest.approx(source["cost"], rel=0, abs=1e-12)


def _point(stored: dict[str, Any], point: str) -> int:
    """The transition of the source ``stored`` (its snapshot) a fork is taken after, for ``point`` (``POINTS``)."""
    trace = stored["trace"]
    if point == "answer":
        return answered_at(stored)
    if point == "later":
        return len(trace) - 2  # after the parent's last reply, before the edge into Done
    return next(i for i, entry in enumerate(trace) if entry["dest"] == "ExecuteTool")  # c1 in flight, not cut yet


def _forked_like_the_source(
    counts: Counts, driver: str, store: Any, source_seen: Seen, at: int, *, unpriced: bool = False
) -> dict[str, Any]:
    """Fork ``p`` after ``at`` as ``f``, driven to its end: its spend where it was taken, and where it answered
    ``c1``, is the source's there; it ends as the source ended; it ran no tool and asked no sub-agent's model.

    Returns the fork's spend at its end.
    """
    stored = as_json(store.load("p"))
    tools, models = Counter(counts.tools), Counter(counts.child)
    agent = parent_agent(counts, driver, unpriced=unpriced)
    result, seen = driven(agent, driver, "fork", store=store, source="p", at=at, run_id="f")
    forked = as_json(store.load("f"))
    assert result.final == "done"
    assert counts.tools == tools  # the fork ran no tool again
    asked = Counter({"parent": 1}) if at < len(stored["trace"]) - 2 else Counter()
    assert counts.child - models == asked  # nor any sub-agent's model: its parent's last reply only, if after at
    _same(spent(seen[at]), spent(source_seen[at]))  # rebuilt up to at: the source's counts there
    answer = answered_at(forked)
    if answer > at:  # c1 answered after the fork point (its outcome taken): the source's counts when it answered
        _same(spent(seen[answer]), spent(source_seen[answered_at(stored)]))
    _same(spent(forked["counters"]), spent(stored["counters"]))  # and at the end
    return spent(forked["counters"])


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_past_a_stored_cut_call_counts_every_token_dollar_and_model_call_its_source_counted(
    store_target: str, driver: str, point: str
) -> None:
    """Cut with a store (what the helper and deep runs spent so far counted), resumed to its end (the taken-back
    helper's outcome brings the rest); forked just after ``c1``'s answer, after the parent's last reply, or before
    the cut: the fork counts what the source counted there, field by field, and ends where the source ended."""
    counts = Counts()
    with open_store(store_target) as store:
        seen = stored_cut_then_finished(counts, driver, store)
        stored = as_json(store.load("p"))
        whole = _forked_like_the_source(counts, driver, store, seen, _point(stored, point))
    assert whole["tool_calls"] == WHOLE
    assert whole["priced"] == counts.child.total() - counts.child["parent"] + 2  # every model call made, the fork's
    assert whole["unpriced"] == 0


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_past_a_stored_cut_call_whose_deep_model_is_unpriced_counts_its_cost_unknown(
    store_target: str, driver: str
) -> None:
    """The deep agent has no prices: the source's cost is unknown, and so is the fork's, which counts each unpriced
    model call of the deep run (4: two before the cut, two after) and each priced one, as the source did."""
    counts = Counts()
    with open_store(store_target) as store:
        seen = stored_cut_then_finished(counts, driver, store, unpriced=True)
        stored = as_json(store.load("p"))
        assert spent(stored["counters"])["cost"] is None
        whole = _forked_like_the_source(counts, driver, store, seen, answered_at(stored), unpriced=True)
    assert whole["cost"] is None
    assert whole["unpriced"] == counts.child["deep c1"] == 4
    assert whole["priced"] == counts.child["c1"] + 2  # the helper's and the parent's two


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_past_an_answer_whose_runs_took_a_storeless_cut_s_hand_down_counts_what_the_source_counted(
    store_target: str, driver: str
) -> None:
    """Cut without a store (the first helper's spend counted), resumed with one and cut in the new helper's wait,
    resumed to its end; forked just after ``c1``'s answer: the fork counts what the source counted there."""
    counts = Counts()
    with open_store(store_target) as store:
        source_seen = storeless_then_stored_cut(counts, driver, store)
        stored = as_json(store.load("p"))
        whole = _forked_like_the_source(counts, driver, store, source_seen, answered_at(stored))
    assert whole["tool_calls"] == WHOLE


SOURCES = {"stored cut": stored_cut_then_finished, "store-less cut, then stored": storeless_then_stored_cut}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_of_the_source_s_snapshot_counts_what_the_source_counted(
    store_target: str, driver: str, point: str, source: str
) -> None:
    """A snapshot nests no sub-agent run, but its exchanges keep what the cuts of ``c1`` counted (``cut``): a fork
    of it, with no store, counts what the source counted where it was taken and at the end, field by field; it ran
    no tool and asked no sub-agent's model."""
    counts = Counts()
    with open_store(store_target) as store:
        seen = SOURCES[source](counts, driver, store)
        stored = as_json(store.load("p"))
    at = _point(stored, point)
    tools, models = Counter(counts.tools), Counter(counts.child)
    result, fork_seen = driven(parent_agent(counts, driver), driver, "fork", source=stored, at=at)
    assert result.final == "done"
    assert counts.tools == tools
    asked = Counter({"parent": 1}) if at < len(stored["trace"]) - 2 else Counter()
    assert counts.child - models == asked
    _same(spent(fork_seen[at]), spent(seen[at]))
    _same(spent(fork_seen[max(fork_seen)]), spent(stored["counters"]))
