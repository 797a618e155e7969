"""Batches on Ray: a cancel given before the batch, the iterator dropped, runs paused for approval, deps that fail once.

Every call is counted in the ledger (``support.batch_agents``); every
input's result is checked, and what the store holds after.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from support.batch_agents import MODEL_LOG, TOOL_LOG, counts, factory, lines, tag
from support.batch_audit import approving_agent, held_unless_broken, paced_agent
from support.batch_leases import PROBE_LEASE, lease_free, numbered_questions
from support.deps_agents import deps_agent
from support.sdk import skip_unless_installed

from fsm_agent import CancelToken, RunResult
from fsm_agent.batch import BatchItem, Counts, Tally, batch_items, iter_batch, run_batch
from fsm_agent.persist import open_store

pytestmark = pytest.mark.ray

skip_unless_installed("ray", reason="the ray extra is installed by `make test`")


@pytest.mark.usefixtures("cluster")
def test_a_ray_batch_whose_token_was_cancelled_before_it_began_starts_no_run(tmp_path: Path) -> None:
    """As on the local executor: every input ends ``cancelled`` without starting, and no call is made."""
    token = CancelToken()
    token.cancel("not today")
    results = run_batch(factory(tmp_path), numbered_questions(6), store=tmp_path / "runs.db", cancel=token,
                        max_in_flight=4, progress=False)  # fmt: skip
    assert [(r.reason, r.evidence.get("started")) for r in results] == [("cancelled", False)] * 6
    assert [r.evidence["why"] for r in results] == ["not today"] * 6
    local = run_batch(factory(tmp_path), numbered_questions(6), store=tmp_path / "runs.db", cancel=token,
                      executor="local", progress=False)  # fmt: skip
    assert results == local
    assert lines(tmp_path / MODEL_LOG) == []
    assert lines(tmp_path / TOOL_LOG) == []


@pytest.mark.usefixtures("cluster")
def test_the_ray_executor_given_a_cancelled_token_starts_no_worker(tmp_path: Path) -> None:
    """``iter_ray`` itself, called with a token already cancelled: no pool, no switch, every run unstarted."""
    import ray

    from fsm_agent.batch import on_ray

    token = CancelToken()
    token.cancel("not today")
    before = set(ray.util.list_named_actors())
    items = batch_items(numbered_questions(3))
    got = list(on_ray.iter_ray(factory(tmp_path), str(tmp_path / "runs.db"), items, max_in_flight=4, max_retries=0,
                               cancel=token, ray_options={}, lease=PROBE_LEASE))  # fmt: skip
    assert [item.index for item, _ in got] == [0, 1, 2]
    assert [(r.reason, r.evidence["started"], r.evidence["why"]) for _, r in got] == [
        ("cancelled", False, "not today")
    ] * 3
    assert set(ray.util.list_named_actors()) == before
    assert lines(tmp_path / MODEL_LOG) == []


@pytest.mark.usefixtures("cluster")
def test_dropping_a_ray_batchs_iterator_gives_up_every_lease_and_the_next_pass_makes_each_call_once(
    store_target: str, tmp_path: Path
) -> None:
    """The loop left after its first result: each begun run is over or cancelled and free; a rerun finishes all."""
    rounds = 30
    questions = ["quick 0", *(f"slow {i}" for i in range(1, 4))]
    # The slow runs sleep 3 s at least: far longer than an actor takes to hear the switch once the quick one ended.
    make = functools.partial(paced_agent, str(tmp_path), rounds, 0.1)
    batch = iter_batch(make, questions, store=store_target, max_in_flight=4, lease=PROBE_LEASE)
    for _ in batch:
        break
    batch.close()
    items = batch_items(questions)
    with open_store(store_target) as store:
        begun, cut = [], []
        for item in items:
            try:
                data = store.load(item.run_id)
            except KeyError:
                continue
            begun.append(item.index)
            assert data["state"] == "Done" or (data["state"], data["reason"]) == ("Failed", "cancelled"), data["state"]
            cut += [item.index] if data["state"] == "Failed" else []
    assert cut, "some run was in flight at the drop"
    assert [i for i in begun if not lease_free(store_target, items[i].run_id)] == [], "leases kept after the drop"
    assert set(counts(tmp_path / TOOL_LOG).values()) <= {1}

    again = run_batch(make, questions, store=store_target, max_in_flight=4, lease=PROBE_LEASE, progress=False)
    assert [r.final for r in again] == [f"answer to {q}" for q in questions]
    tools = counts(tmp_path / TOOL_LOG)
    assert sorted(tools) == sorted(
        f"{tag(q)}-{turn}" for q in questions for turn in range(1 if q.startswith("quick") else rounds)
    )
    assert set(tools.values()) == {1}, "a completed tool call was made again"


@pytest.mark.usefixtures("cluster")
def test_runs_paused_for_approval_on_ray_are_paused_results_free_and_read_back_the_same(tmp_path: Path) -> None:
    """Each run pauses on its first call: no call made, nobody holds it, and a second pass reads the same pauses."""
    questions = numbered_questions(3)
    store = str(tmp_path / "runs.db")
    make = functools.partial(approving_agent, str(tmp_path))
    live = run_batch(make, questions, store=store, max_in_flight=4, lease=PROBE_LEASE, progress=False)
    assert [r.reason for r in live] == ["paused"] * 3
    assert [r.evidence["awaiting"] for r in live] == [[f"{tag(q)}-0"] for q in questions]
    assert lines(tmp_path / TOOL_LOG) == []
    assert all(lease_free(store, item.run_id) for item in batch_items(questions))
    model_calls = len(lines(tmp_path / MODEL_LOG))
    stored = run_batch(make, questions, store=store, max_in_flight=4, lease=PROBE_LEASE, progress=False)
    assert stored == live
    assert len(lines(tmp_path / MODEL_LOG)) == model_calls
    assert lines(tmp_path / TOOL_LOG) == []


@pytest.mark.usefixtures("cluster")
def test_duplicate_questions_and_deps_failing_for_one_item_on_ray_tally_every_input_once(tmp_path: Path) -> None:
    """The same question twice is two runs; the item whose deps fail is an error naming it; the tally adds up."""
    questions = ["same question", "broken one", "same question", "other question"]
    tally = Tally(len(questions))
    seen: dict[int, RunResult] = {}
    starts: list[BatchItem] = []

    def start(item: BatchItem) -> None:
        starts.append(item)
        tally.start(item)

    for item, result in iter_batch(deps_agent, questions, store=tmp_path / "runs.db", max_in_flight=4,
                                   make_deps=held_unless_broken, on_start=start, on_end=tally.end):  # fmt: skip
        assert item.index not in seen
        seen[item.index] = result
        tally.finish(result)
    assert sorted(seen) == [0, 1, 2, 3]
    assert [seen[i].reason for i in range(4)] == ["done", "error", "done", "done"]
    assert seen[1].evidence["type"] == "ConnectionError"
    assert "broken one" in seen[1].evidence["error"]
    assert [seen[i].final.split(" pid=")[0] for i in (0, 2, 3)] == ["item 0", "item 2", "item 3"]
    assert tally.counts() == Counts(total=4, done=3, failed_by=(("error", 1),), in_flight=0)
    assert sorted(item.index for item in starts) == [0, 1, 2, 3]
    with open_store(str(tmp_path / "runs.db")) as store:
        assert sorted(run.state for run in store.list_runs()) == ["Done"] * 3  # the broken item never began
