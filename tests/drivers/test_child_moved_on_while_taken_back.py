"""A parent's resume takes back a stored child that moved on between its read and its claim: read again, not raised.

The tree is cut (a Ctrl-C in the grandchild's ``paused`` hook) with the
grandchild stored paused on ``work("g")``.  A fresh parent's resume reads the
stored grandchild to take it back; just then another owner writes it: a
person's decision, or the person resuming it by its run id to the end.
Before, the claim's ``StaleRunError`` (for a run the caller never loaded) came
out of the parent's resume; now the grandchild is read again and taken back,
or its result read.  Every side effect and model call is tallied in a file.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.exactly_once import ataken_over, taken_over
from support.exactly_once_audit import LEASE, NESTED_EFFECTS, NESTED_FINAL, NESTED_MODELS, Tally, nested_levels

from fsm_agent import AgentRun, RunResult
from fsm_agent.persist import open_store

GRAND = "p/sub/gc"


def _cut_at_the_grandchilds_pause(tally: Tally, target: str, driver: str) -> None:
    levels = nested_levels(tally, inner_approve={"work"})
    fired: list[bool] = []

    def ctrl_c(event: Any) -> None:
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt

    levels["grand"].on("paused", ctrl_c)
    parent = levels["parent"]
    with open_store(target, lease=LEASE) as store, pytest.raises(KeyboardInterrupt):
        parent.run("go", store=store, run_id="p") if driver == "sync" else asyncio.run(
            parent.arun("go", store=store, run_id="p")
        )
    with open_store(target) as store:
        assert (store.load(GRAND)["paused"], store.load(GRAND)["to_approve"]) == (True, ["g"])


def _after_the_take_overs_read(store: Any, action: Callable[[], None]) -> None:
    """``action`` (another owner's, on a store object of its own) runs once, right after ``store`` read the grandchild.

    That is between the take-over's read of the stored child and its claim (``child_stored.taken_over``).
    """
    load, aload, done = store.load, store.aload, threading.Event()

    def once() -> None:
        if not done.is_set():
            done.set()
            action()

    def loaded(run_id: str) -> Any:
        data = load(run_id)
        if run_id == GRAND:
            once()
        return data

    async def aloaded(run_id: str) -> Any:
        data = await aload(run_id)
        if run_id == GRAND:
            await asyncio.to_thread(once)
        return data

    store.load, store.aload = loaded, aloaded


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("meanwhile", ["decided", "finished"])
def test_a_grandchild_that_moved_on_between_the_take_overs_read_and_claim_is_read_again(
    store_target: str, tmp_path: Path, driver: str, meanwhile: str
) -> None:
    tally = Tally(tmp_path / "tally")
    _cut_at_the_grandchilds_pause(tally, store_target, driver)
    if meanwhile == "finished":
        with open_store(store_target) as store:
            store.decide(GRAND, "g", True)

    def person() -> None:
        with open_store(store_target, lease=LEASE) as other:
            if meanwhile == "decided":
                other.decide(GRAND, "g", True)
            else:
                grand = nested_levels(tally)["grand"]
                assert grand.resume(other.load(GRAND), store=other).finish().final == 'grand: "g ok"'

    parent = nested_levels(tally)["parent"]
    with open_store(store_target, lease=LEASE) as store:  # a new owner: it waits out the cut one's lease
        _after_the_take_overs_read(store, person)
        if driver == "sync":
            result = taken_over(lambda: parent.resume(store.load("p"), store=store)).finish()
        else:

            async def claim() -> AgentRun:
                return await parent.aresume(await store.aload("p"), store=store)

            async def go() -> RunResult:
                return await (await ataken_over(claim)).afinish()

            result = asyncio.run(go())
    assert result.final == NESTED_FINAL
    assert tally.counts("done") == NESTED_EFFECTS
    assert tally.counts("model") == NESTED_MODELS
