"""A fork of a stored parent cut inside its grandchild's call hands the grandchild's completed calls down two levels.

The agent (``support.fork_grandchildren``): the parent asks ``helper`` (call
``c1``); the helper makes ``work`` step 1, asks its ``deep`` sub-agent
(step 2), then ``work`` step 3; the deep run makes steps 1, 2 and 3.  A
Ctrl-C lands in the deep run's step 2, after its step 1 completed.  A fork
of the parent makes the helper call again (it was cut in flight): the new
helper run takes its step 1 from the source's helper, and its new deep run
takes step 1 from the source's deep run (``fork._outcomes``, encoded one
level down as ``core.hand_down.below`` does), so only the call cut in flight
and the calls never made run.  Each tool execution is counted by
``(item, step)``, across the source and its forks, on both drivers and both
stores.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from support.fork_grandchildren import Counts, cut_run, fork_run, nested

from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
CUT = ("deep c1", 2)
"""The grandchild's second call: the Ctrl-C lands in it, after its first completed."""
FORK_MAKES = {("deep c1", 2): 1, ("deep c1", 3): 1, ("c1", 3): 1}
"""What a fork of the cut source makes: the call cut in flight again, and the calls never made; nothing else."""


def _grandchild_steps(store: Any, run_id: str) -> list[Any]:
    """The ``reused_from`` of each tool step of the deep run under the fork ``run_id`` (read from its export)."""
    (deep,) = store.export(run_id)["children"]["c1"]["children"].values()
    return [step["reused_from"] for step in deep["steps"] if step["kind"] == "tool_call"]


@pytest.mark.parametrize("fork_driver", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_fork_of_a_parent_cut_inside_its_grandchild_s_second_call_makes_the_grandchild_s_first_call_no_more(
    store_target: str, cutter: str, fork_driver: str
) -> None:
    source = Counts(cut=CUT)
    with open_store(store_target, lease=0.5) as store:
        cut_run(nested(source), cutter, store, "p")
    assert source.tools == {("c1", 1): 1, ("deep c1", 1): 1, ("deep c1", 2): 1}
    assert source.done == {("c1", 1): 1, ("deep c1", 1): 1}  # the Ctrl-C came before step 2's side effect

    with open_store(store_target) as store:
        for at in range(len(store.load("p")["trace"])):  # before the helper call, and with it cut in flight
            fork = Counts()
            result = fork_run(nested(fork), "p", at, fork_driver, store, f"f{at}")
            assert result is not None
            assert result.final == "done", at
            assert fork.tools == FORK_MAKES, at
            # Across source and fork each call ran once; step 2 of the deep run, cut in flight, twice.
            total = source.tools + fork.tools
            assert total == {("c1", 1): 1, ("c1", 3): 1, ("deep c1", 1): 1, ("deep c1", 2): 2, ("deep c1", 3): 1}, at
            assert (source.done + fork.done) == dict.fromkeys(total, 1), at
            reused = _grandchild_steps(store, f"f{at}")
            assert reused[0] is not None
            assert reused[0].startswith("p/c1/"), at  # the source's deep run's call, named
            assert reused[1:] == [None, None], at


@pytest.mark.parametrize("fork_driver", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_fork_of_a_fork_cut_in_its_grandchild_again_makes_only_what_neither_completed(
    store_target: str, cutter: str, fork_driver: str
) -> None:
    """The first fork is cut in the deep run's step 3; a fork of it takes steps 1 (the source's) and 2 (its own)."""
    source, first = Counts(cut=CUT), Counts(cut=("deep c1", 3))
    with open_store(store_target, lease=0.5) as store:
        cut_run(nested(source), cutter, store, "p")
        last = len(store.load("p")["trace"]) - 1
        assert fork_run(nested(first), "p", last, fork_driver, store, "f") is None  # cut by the Ctrl-C
    assert first.tools == {("deep c1", 2): 1, ("deep c1", 3): 1}
    assert first.done == {("deep c1", 2): 1}

    with open_store(store_target) as store:
        for at in range(len(store.load("f")["trace"])):
            second = Counts()
            result = fork_run(nested(second), "f", at, fork_driver, store, f"ff{at}")
            assert result is not None
            assert result.final == "done", at
            assert second.tools == {("deep c1", 3): 1, ("c1", 3): 1}, at
            total = source.tools + first.tools + second.tools
            # Each cut in flight once (steps 2 and 3 of the deep run), each made again once; the rest once.
            assert total == Counter(
                {("c1", 1): 1, ("c1", 3): 1, ("deep c1", 1): 1, ("deep c1", 2): 2, ("deep c1", 3): 2}
            ), at
            assert (source.done + first.done + second.done) == dict.fromkeys(total, 1), at
            reused = _grandchild_steps(store, f"ff{at}")
            assert reused[0] is not None
            assert reused[1] is not None
            assert reused[1].startswith("f/c1/"), at  # step 2, made by the first fork's deep run
            assert reused[2] is None, at
