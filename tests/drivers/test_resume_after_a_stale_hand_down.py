"""A stored fork cut by a Ctrl-C inside the sub-agent run it handed outcomes down to, resumed: nothing runs twice
and nothing is skipped.

The agent (``support.stale_hand_down``): the parent asks ``helper``; each
helper run makes ``work`` steps 1 and 2, then step 1 again (same tool and
arguments as its first call: a new request, which must run).  The source
``p`` is cut by a Ctrl-C in its helper's step 2; its fork ``f`` makes the
helper call again and hands the new helper run step 1's outcome
(``carried_down``), which that run takes; a Ctrl-C in its step 2 cuts the
fork before its next write, so ``f`` as stored still holds the entry its
helper run took.  ``f`` is then resumed once the cut run's lease lapsed (a
plain resume on the fork's own store object, or a second owner, a store
object of its own), on both drivers and
both stores.  Its helper call's stored run (``f/c1``) is taken back, not
started afresh: it takes nothing handed down again, and the stale entry
goes to no other call of the same tool and arguments.  Every tool execution
is counted by ``(item, step)``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from support.stale_hand_down import LEASE, Counts, LookedUpFirst, agent, forked_and_cut, resumed

from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
OWNERS = ["plain resume", "second owner"]
BATCHES = ["one at a time", "all at once"]
"""How the resumed parent makes its turn's calls: in order, or (the async driver's default) all at once."""
pytestmark = pytest.mark.slow  # each test leaves the cut run's lease (0.5 s) to lapse before it resumes the fork

CUT = ("c1", 2)
"""The helper's second call, where both Ctrl-Cs land (the source's, then the fork's)."""


def _cut_fork(target: str, store: Any, cutter: str, asks: tuple[tuple[str, str], ...]) -> tuple[Counts, Counts]:
    """``p`` and its fork ``f`` run and cut on ``cutter``; their counts.  ``f`` as stored holds the stale entry."""
    source, fork = Counts(cut=CUT), Counts(cut=CUT)
    forked_and_cut(target, store, cutter, asks, (source, fork))
    assert source.tools == {("c1", 1): 1, ("c1", 2): 1}
    assert source.done == {("c1", 1): 1}  # the Ctrl-C came before step 2's side effect
    assert fork.tools == {("c1", 2): 1}  # step 1 taken from the source's helper, step 2 cut again
    assert fork.done == {}
    stored = store.load("f")
    assert [entry[:2] for entry in stored["carried_down"]] == [["helper", '{"input":"c1"}']]  # stale: f/c1 took it
    assert store.load("f/c1")["carried"] == []  # the helper run took it, and its store says so
    return source, fork


def _resume(target: str, store: Any, driver: str, owner: str, counts: Counts, asks: Any, batch: str) -> Any:
    """``f`` resumed on ``driver`` by ``owner`` (the fork's own ``store``, or a new store object) and finished."""
    at_once = driver == "async" and batch == "all at once"
    resumer = agent(counts, asks, one_at_a_time=not at_once, held=at_once)
    if owner == "plain resume":
        return resumed(store, driver, resumer)
    with open_store(target, lease=LEASE) as second:
        return resumed(second, driver, resumer)


def _reused(store: Any, run_id: str) -> list[Any]:
    """The ``reused_from`` of each tool step of the stored run ``run_id``, in order."""
    return [step["reused_from"] for step in store.export(run_id)["steps"] if step["kind"] == "tool_call"]


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_resumed_fork_takes_its_helper_run_back_and_that_run_makes_a_repeated_call_for_real(
    store_target: str, cutter: str, driver: str, owner: str
) -> None:
    asks = (("c1", "c1"),)
    with open_store(store_target, lease=LEASE) as store:
        source, fork = _cut_fork(store_target, store, cutter, asks)
        again = Counts()
        result = _resume(store_target, store, driver, owner, again, asks, "one at a time")
        assert result.final == "done"
        # The cut step 2 made again; step 1's repeat, a new request, really made (nothing carried it in again).
        assert again.tools == {("c1", 2): 1, ("c1", 1): 1}
        assert again.child == {"parent": 1, "c1": 2}  # the parent's answer; the helper's asks after steps 2 and 3
        total = source.tools + fork.tools + again.tools
        # Step 1 twice (the first call once, its repeat once); step 2 cut twice in flight, completed once.
        assert total == {("c1", 1): 2, ("c1", 2): 3}
        assert source.done + fork.done + again.done == {("c1", 1): 2, ("c1", 2): 1}
        assert _reused(store, "f/c1")[0].startswith("p/c1/")  # step 1: the source's helper's outcome
        assert _reused(store, "f/c1")[1:] == [None, None]
        assert store.load("f")["carried_down"] == []  # answered: the stale entry lingers in no later snapshot


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_resumed_fork_hands_the_stale_entry_to_no_later_call_of_the_same_sub_agent_and_input(
    store_target: str, cutter: str, driver: str, owner: str, batch: str
) -> None:
    """The parent asks ``helper`` twice with the same input (``c1``, a ``note``, then ``c2``): ``c2`` never started
    before the resume, so its helper run is new and must make every call itself, as it does in a fork never cut."""
    asks = (("c1", "c1"), ("c2", "c1"))
    with open_store(store_target, lease=LEASE) as store:
        source, fork = _cut_fork(store_target, store, cutter, asks)
        again = Counts()
        result = _resume(store_target, store, driver, owner, again, asks, batch)
        assert result.final == "done"
        # c1's run: step 2 made again, its repeat of step 1; c2's new run: steps 1, 2 and 1 again, all made.
        assert again.tools == {("c1", 1): 3, ("c1", 2): 2, ("note", 0): 1}
        assert again.child == {"parent": 1, "c1": 2 + 4}
        total = source.tools + fork.tools + again.tools
        # c1's step 2 cut twice in flight; every other call once per request (step 1 twice per helper run).
        assert total == Counter({("c1", 1): 4, ("c1", 2): 4, ("note", 0): 1})
        assert source.done + fork.done + again.done == {("c1", 1): 4, ("c1", 2): 2, ("note", 0): 1}
        assert _reused(store, "f/c2") == [None, None, None]  # nothing of the source's c1 helper
        assert store.load("f")["carried_down"] == []


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_resumed_fork_keeps_the_stale_entry_from_a_new_call_whose_run_is_looked_up_before_the_taken_back_one(
    store_target: str, cutter: str, owner: str
) -> None:
    """As above, made at once on the async driver, with ``c2``'s lookup answered before ``c1``'s (``LookedUpFirst``):
    ``c2``'s new run starts before ``c1``'s is known to be stored; still it takes nothing of ``c1``'s."""
    asks = (("c1", "c1"), ("c2", "c1"))
    with open_store(store_target, lease=LEASE) as store:
        source, fork = _cut_fork(store_target, store, cutter, asks)
        again = Counts()
        resumer = agent(again, asks, one_at_a_time=False, held=True)
        if owner == "plain resume":
            result = resumed(LookedUpFirst(store, "f/c2", "f/c1"), "async", resumer)
        else:
            with open_store(store_target, lease=LEASE) as second:
                result = resumed(LookedUpFirst(second, "f/c2", "f/c1"), "async", resumer)
        assert result.final == "done"
        assert again.tools == {("c1", 1): 3, ("c1", 2): 2, ("note", 0): 1}
        assert source.tools + fork.tools + again.tools == Counter({("c1", 1): 4, ("c1", 2): 4, ("note", 0): 1})
        assert source.done + fork.done + again.done == {("c1", 1): 4, ("c1", 2): 2, ("note", 0): 1}
        assert _reused(store, "f/c2") == [None, None, None]
        assert store.load("f")["carried_down"] == []
