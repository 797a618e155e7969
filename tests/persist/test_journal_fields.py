"""A snapshot field that goes absent is not kept stale in the store: the journal writes the run whole instead.

A journal entry sets the fields it names and can drop none, so a field the
run's snapshot stops holding would live on in the store with its last
value.  Every field of today's snapshot is always written (``None`` or
empty when it holds nothing), so these tests make one go absent: a
``dump_small`` that adds ``probe`` for the first turns only.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.store_cases import tick_agent

from fsm_agent.core import snapshot
from fsm_agent.persist import open_store

TURNS = 4
"""Tool turns of the run; ``probe`` is in its snapshot while it has made fewer than 2 model calls."""


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dump_small`` with a ``probe`` field until the run's second model call, as a future optional field might be."""
    real = snapshot.dump_small

    def dump_small(run: Any, **extra: Any) -> dict[str, Any]:
        small = real(run, **extra)
        return {**small, "probe": run.counts.turns} if run.counts.turns < 2 else small

    monkeypatch.setattr(snapshot, "dump_small", dump_small)


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.usefixtures("probed")
def test_a_field_gone_from_the_snapshot_is_gone_from_the_store(store_target: str, driver: str) -> None:
    """The store held ``probe`` while the run's snapshot did, and holds it no more once the snapshot lost it."""
    seen: list[bool] = []
    with open_store(store_target, every="transition") as store:
        agent = tick_agent(TURNS)
        agent.on("transition", lambda event: seen.append("probe" in store.load("r")))
        if driver == "sync":
            result = agent.run("go", store=store, run_id="r")
        else:
            import asyncio

            result = asyncio.run(agent.arun("go", store=store, run_id="r"))
        assert result.ok
        stored = store.load("r")
    assert True in seen, "the store never held the probe: the test tests nothing"
    assert seen[-1] is False
    assert "probe" not in stored
