"""One batch run by two drivers at once over one store: each input answered once per driver, each call made once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from support.batch_agents import TOOL_LOG, counts, factory, tag
from support.batch_leases import lease_free, numbered_questions

from fsm_agent.batch import batch_items, iter_batch
from fsm_agent.persist import open_store
from fsm_agent.records import RunResult

ROUNDS = 3
LEASE = 2.0
"""Seconds a driver holds a run past its last write: a run the other driver holds is tried again after it."""


@pytest.mark.slow
def test_two_drivers_of_one_batch_over_one_store_make_each_call_once(store_target: str, tmp_path: Path) -> None:
    """Two threads each run the batch: every index once for each, ``done`` or ``leased``; every run Done and free."""
    questions = numbered_questions(16)
    make = factory(tmp_path, rounds=ROUNDS, latency=0.01)
    seen: dict[str, list[tuple[int, RunResult]]] = {"a": [], "b": []}
    errors: list[BaseException] = []
    gate = threading.Barrier(2)

    def drive(name: str) -> None:
        try:
            gate.wait(timeout=60)
            for item, result in iter_batch(
                make, questions, store=store_target, executor="local", max_in_flight=4, lease=LEASE
            ):
                seen[name].append((item.index, result))
        except BaseException as exc:  # noqa: BLE001 - judged in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(name,)) for name in seen]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a driver hung"
    assert errors == []
    for name, got in seen.items():
        assert sorted(index for index, _ in got) == list(range(len(questions))), name
        assert {result.reason for _, result in got} <= {"done", "leased"}, name
        assert all(result.final == f"answer to {questions[index]}" for index, result in got if result.ok)
    tools = counts(tmp_path / TOOL_LOG)
    assert sorted(tools) == sorted(f"{tag(q)}-{turn}" for q in questions for turn in range(ROUNDS))
    assert set(tools.values()) == {1}, "a completed tool call was made by both drivers"
    items = batch_items(questions)
    with open_store(store_target) as store:
        assert {store.load(item.run_id)["state"] for item in items} == {"Done"}
    assert all(lease_free(store_target, item.run_id) for item in items)
