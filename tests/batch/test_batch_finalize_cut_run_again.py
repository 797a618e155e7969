"""A batch run again resumes a run whose finalize call the first pass cut: the resume makes that call again.

Such a run keeps the stop that asked for the finalize as its reason (here
``max_steps``); the cut, ``cancelled``, is on its last edge.  Before, the
batch judged by the reason and returned the stop.
"""

from __future__ import annotations

import pytest
from support import batch_finalize_agents as slow_batch

from fsm_agent.persist import open_store


def test_a_batch_run_again_makes_the_finalize_call_the_first_pass_cut(
    store_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving the batch (as at a Ctrl-C) cuts ``slow`` in its finalize call; running it again makes that call."""
    import fsm_agent.batch.local as local
    from fsm_agent.batch.runner import iter_batch, run_batch

    monkeypatch.setattr(local, "GRACE", 0.5)  # how long a left batch waits for its runs to write their cut
    slow_batch.reset()
    items = [{"input": "slow", "run_id": "slow"}, {"input": "fast", "run_id": "fast"}]
    for item, _ in iter_batch(slow_batch.make_agent, items, store=store_target, executor="local"):
        assert item.run_id == "fast"
        break
    with open_store(store_target) as store:
        cut = store.load("slow")
    assert (cut["state"], cut["reason"], cut["trace"][-1]["reason"]) == ("Failed", "max_steps", "cancelled")

    results = run_batch(slow_batch.make_agent, items, store=store_target, executor="local", progress=False)

    assert slow_batch.counted() == {
        "model": {"slow:tools": 1, "slow:finalize": 2, "fast:tools": 1},
        "tools": {"slow": 1},
    }
    slow = results[0]
    assert (slow.reason, slow.evidence["finalize"], slow.final) == ("max_steps", {"outcome": "answered"}, "slow final")
