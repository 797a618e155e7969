"""A local batch given an open store object, on SQLite and PostgreSQL, run twice over it: the second pass skips.

Each pass drives its runs on an event loop of its own, in a thread of its
own; the caller's store object outlives both and still serves the caller.
"""

from __future__ import annotations

from pathlib import Path

from support.batch_agents import MODEL_LOG, TOOL_LOG, counts, factory

from fsm_agent import CancelToken
from fsm_agent.batch import batch_items, iter_batch, run_batch
from fsm_agent.persist import open_store

QUESTIONS = [f"question {i}" for i in range(6)]


def test_two_passes_over_one_open_store_object_make_each_call_once(store_target: str, tmp_path: Path) -> None:
    """Same results from the store, no model or tool call made again; the object still loads the runs after."""
    with open_store(store_target) as store:
        first = run_batch(factory(tmp_path), QUESTIONS, store=store, executor="local", progress=False)
        made = (counts(tmp_path / MODEL_LOG), counts(tmp_path / TOOL_LOG))
        again = run_batch(factory(tmp_path), QUESTIONS, store=store, executor="local", progress=False)
        assert [r.reason for r in first] == ["done"] * len(QUESTIONS), [r.evidence for r in first]
        assert again == first
        assert (counts(tmp_path / MODEL_LOG), counts(tmp_path / TOOL_LOG)) == made
        assert set(made[1].values()) == {1}
        assert all(store.load(item.run_id)["state"] == "Done" for item in batch_items(QUESTIONS))


def test_a_pass_cancelled_over_a_store_object_is_resumed_by_the_next_pass_over_it(
    store_target: str, tmp_path: Path
) -> None:
    """Cancelled after two results, then run again over the same object: every run done, each tool call once."""
    make = factory(tmp_path, rounds=5, latency=0.02)
    with open_store(store_target) as store:
        token, seen = CancelToken(), 0
        for _ in iter_batch(make, QUESTIONS, store=store, executor="local", max_in_flight=2, cancel=token):
            seen += 1
            if seen == 2:
                token.cancel("enough")
        assert seen == len(QUESTIONS)
        again = run_batch(make, QUESTIONS, store=store, executor="local", progress=False)
    assert [r.evidence for r in again if not r.ok] == []
    tools = counts(tmp_path / TOOL_LOG)
    assert len(tools) == len(QUESTIONS) * 5
    assert set(tools.values()) == {1}
