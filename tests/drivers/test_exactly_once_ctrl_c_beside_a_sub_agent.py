"""A Ctrl-C in one call of an async parallel batch while a sibling is a sub-agent call still in flight.

docs/concepts/exactly-once.md and the async driver: a call's
``KeyboardInterrupt`` propagates and leaves the run unfinished, written as
it stands, for its next owner, who makes only the calls cut in flight again.
The sub-agent in flight was cut by the same Ctrl-C: nobody cancelled it, so
its run must be left unfinished too, and the next owner's parent takes it
over from its own checkpoint, its completed call kept, its answer reaching
the parent's model.  (``support.exactly_once_audit.batch_with_child_in_flight``.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.exactly_once import resumed_by_new_owner
from support.exactly_once_audit import (
    LEASE,
    Cutter,
    Hang,
    Tally,
    batch_with_child_in_flight,
    durable_in,
    started,
)

from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
FINAL = 'parent: "a ok", "child: \\"c ok\\", \\"h ok\\"", "z ok"'
"""The parent's answer once the child answered: the child's own answer, not a stop."""


def _cut(target: str, tally: Tally) -> Hang:
    """Async: a and the child's c came back, the child's h hangs, z raises a Ctrl-C.

    Returns the ``hang`` tool, disarmed by the call it hung: the next owner's
    agent is given it, so the call made again comes back.
    """
    durable = durable_in(target, {"cut": ["a"], "cut/sub": ["c"]})
    cut = Cutter("z", lambda: durable() and started(tally, "h")())
    hang = Hang(tally)
    store = open_store(target, lease=LEASE)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(batch_with_child_in_flight(tally, cut, hang).arun("go", store=store, run_id="cut"))
    store.close()
    return hang


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_ctrl_c_beside_a_sub_agent_in_flight_leaves_the_child_unfinished_and_a_new_owner_finishes_it(
    store_target: str, tmp_path: Path, resumer: str
) -> None:
    tally = Tally(tmp_path / "tally")
    hang = _cut(store_target, tally)
    assert tally.counts("done") == {"a": 1, "c": 1}
    with open_store(store_target) as store:
        child = store.load("cut/sub")
    assert "c" in child["ran"] or any(m.get("tool_call_id") == "c" for m in child["messages"])
    assert child["state"] not in ("Done", "Failed"), child.get("evidence")  # nobody stopped the child

    result = resumed_by_new_owner(store_target, "cut", resumer, batch_with_child_in_flight(tally, hang=hang))
    assert result.final == FINAL
    assert tally.counts("done") == {"a": 1, "c": 1, "h": 1, "z": 1}
    assert tally.counts("try") == {"a": 1, "c": 1, "h": 2, "z": 2}  # only the calls in flight at the cut, again
    assert tally.counts("model") == {"parent": 2, "child": 2}


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_ctrl_c_beside_a_sub_agent_in_flight_never_makes_a_completed_call_again(
    store_target: str, tmp_path: Path, resumer: str
) -> None:
    """What holds today: whatever the next owner makes of the cut child, no completed call is made twice."""
    tally = Tally(tmp_path / "tally")
    hang = _cut(store_target, tally)
    resumed_by_new_owner(store_target, "cut", resumer, batch_with_child_in_flight(tally, hang=hang))
    assert tally.counts("try")["a"] == 1
    assert tally.counts("try")["c"] == 1
    assert tally.counts("done")["z"] == 1
    with open_store(store_target) as store:
        assert store.load("cut")["state"] == "Done"
