"""Batches read a store through its declared contract (``JournaledStore``, ``traits``), not by probing attributes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from support.batch_agents import factory

from fsm_agent import SqliteStore
from fsm_agent.batch import derive_run_id, run_batch
from fsm_agent.definition.states import State
from fsm_agent.persist import JournaledStore
from fsm_agent.persist.summary import Entry


class JournaledOnly:
    """A ``JournaledStore`` and nothing more: a ``SqliteStore``'s seven methods, without its ``lease`` or ``every``."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner

    def wants(self, state: State, paused: bool) -> bool:
        return self.inner.wants(state, paused)

    def save(self, run_id: str, snapshot: dict[str, Any]) -> int | None:
        return self.inner.save(run_id, snapshot)

    def load(self, run_id: str) -> dict[str, Any]:
        return self.inner.load(run_id)

    def create(self, run_id: str, snapshot: dict[str, Any], *, owner: str, overwrite: bool = False) -> int:
        return self.inner.create(run_id, snapshot, owner=owner, overwrite=overwrite)

    def claim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        return self.inner.claim(run_id, snapshot, owner=owner)

    def append(self, entry: Entry, *, owner: str) -> None:
        self.inner.append(entry, owner=owner)

    def renew(self, run_id: str, *, owner: str, seq: int, release: bool = False) -> None:
        self.inner.renew(run_id, owner=owner, seq=seq, release=release)


@pytest.mark.slow
def test_a_batch_waits_out_a_dead_holders_lease_in_a_store_that_declares_no_lease(tmp_path: Path) -> None:
    """The wait for a run's holder is the lease the engine uses (``traits``: the default here), not none at all."""
    question = "question 0"
    dead = SqliteStore(tmp_path / "runs.db", lease=1.5)
    run = factory(tmp_path)().start(question, store=dead, run_id=derive_run_id(0, question))
    for _ in range(4):
        run.advance()  # cut after its first tool call, its lease never given up: a dead driver's run
    lapsed = time.time() + 1.5
    store = JournaledOnly(SqliteStore(tmp_path / "runs.db"))
    assert isinstance(store, JournaledStore)
    assert not hasattr(store, "lease")

    [result] = run_batch(factory(tmp_path), [question], store=store, executor="local")

    assert result.reason == "done", result.evidence
    assert time.time() >= lapsed


def test_a_store_object_the_ray_workers_cannot_open_again_is_refused_before_any_run(tmp_path: Path) -> None:
    """Only a ``SqliteStore`` object gives Ray workers a path: another store is a ``TypeError`` naming its class."""
    store = JournaledOnly(SqliteStore(tmp_path / "runs.db"))
    with pytest.raises(TypeError, match="JournaledOnly has neither"):
        run_batch(factory(tmp_path), ["question 0"], store=store, executor="ray")
    assert not (tmp_path / "model.log").exists()
