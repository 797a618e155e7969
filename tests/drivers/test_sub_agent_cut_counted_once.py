"""A sub-agent cut by its parent's deadline is counted once: at the cut, through a resume, to the parent's end.

docs/how-to/sub-agents.md "What bounds the child", Tokens: what the child
spent before the cut is in the parent's stopped result; a resume that takes
the child's run back adds only what that run spends beyond it; a call made
again with a fresh child adds the fresh run whole.  Every model call the
parent and its children make is on record (``support.cut_children.Calls``),
so "once" is checked against the replies really made: the parent's usage is
their sum, and the child's calls are counted to show none ran twice.  The
clocks are frozen; only the real ``DEADLINE`` cuts.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from support.cut_children import LEASE, WAIT, Block, Calls, parent_agent
from support.exactly_once import ataken_over, taken_over
from support.store_cases import in_child

from fsm_agent import Agent, AgentLoopError, AgentRun, RunResult
from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
BUDGET = 10_000
"""The parent's token budget where one is set: far from reached, so only the child's share of it is checked."""
AT_CUT = {"tool": (510, 51, 561e-6), "model": (10, 1, 11e-6)}
"""The parent's usage at the cut: its first reply, and the child's if the child had replied (cut in its tool)."""


def _cut(agent: Agent, driver: str, store: Any = None, resume_from: dict[str, Any] | None = None) -> RunResult:
    """Run ``agent`` (or resume the stored run ``resume_from``) until its deadline stops it with ``c1`` in flight."""

    async def aran() -> RunResult:
        if resume_from is None:
            return await agent.arun("go", run_id="p", store=store)
        return await (await agent.aresume(resume_from, store=store)).afinish()

    def ran() -> RunResult:
        if driver == "async":
            return asyncio.run(aran())
        if resume_from is None:
            return agent.run("go", run_id="p", store=store)
        return agent.resume(resume_from, store=store).finish()

    with pytest.raises(AgentLoopError) as stop:
        ran()
    result = stop.value.result
    assert (result.reason, result.evidence["unfinished"]) == ("timeout", "c1")  # the deadline cut the child
    return result


def _finished(run: AgentRun, driver: str) -> RunResult:
    return run.finish() if driver == "sync" else asyncio.run(run.afinish())


def _spent(result: RunResult) -> tuple[int, int, float | None]:
    usage = result.usage
    return usage.input_tokens, usage.output_tokens, None if usage.cost is None else round(usage.cost, 12)


def _each_reply_once(calls: Calls) -> tuple[int, int, float | None]:
    total = calls.total()
    return total.input_tokens, total.output_tokens, None if total.cost is None else round(total.cost, 12)


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_child_cut_without_a_store_still_brings_its_tokens_and_cost(driver: str, tmp_path: Path) -> None:
    """No store: the stopped parent's usage holds the child's first reply, and its snapshot keeps it by call."""
    calls = Calls(tmp_path / "calls.log", block="tool")
    try:
        result = _cut(parent_agent(calls, driver), driver)
    finally:
        calls.let_go()
    assert (calls.count("parent"), calls.count("child")) == (1, 1)
    assert _spent(result) == AT_CUT["tool"] == _each_reply_once(calls)
    assert result.snapshot is not None
    kept = result.snapshot["cut_children"]["c1"]
    assert (kept["run_id"], kept["input_tokens"], kept["output_tokens"]) == ("p/c1", 500, 50)


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_child_cut_before_its_first_reply_adds_nothing_at_the_cut(driver: str, tmp_path: Path) -> None:
    """Cut in its first model call, the child spent nothing known: the parent's usage is its own reply alone."""
    calls = Calls(tmp_path / "calls.log", block="model")
    try:
        result = _cut(parent_agent(calls, driver), driver)
    finally:
        calls.let_go()
    assert (calls.count("parent"), calls.count("child")) == (1, 1)
    assert _spent(result) == AT_CUT["model"] == _each_reply_once(calls)
    assert not result.steps  # no outcome was recorded for the cut call
    assert result.evidence["counters"]["tool_calls"][0] == 0
    assert result.snapshot is not None
    kept = result.snapshot["cut_children"]["c1"]
    assert (kept["input_tokens"], kept["output_tokens"], kept["tool_calls"]) == (0, 0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("block", ["tool", "model"], ids=["after_a_reply", "before_any_reply"])
def test_a_call_made_again_without_a_store_adds_its_fresh_child_whole(
    driver: str, block: Block, tmp_path: Path
) -> None:
    """Resumed from the snapshot without a store, the call starts a new child: each child's replies count once."""
    calls = Calls(tmp_path / "calls.log", block=block)
    try:
        cut = _cut(parent_agent(calls, driver), driver)
        result = _finished(parent_agent(calls, driver).resume(cut, timeout=60), driver)
    finally:
        calls.let_go()
    assert result.final == "done"
    assert _spent(cut) == AT_CUT[block]
    assert (calls.count("parent"), calls.count("child")) == (2, 3)  # the cut child's one call, the fresh child's two
    assert _spent(result) == _each_reply_once(calls)


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("block", ["tool", "model"], ids=["after_a_reply", "before_any_reply"])
def test_a_stored_child_cut_is_taken_back_by_a_resume_and_counted_once(
    store_target: str, driver: str, block: Block, tmp_path: Path
) -> None:
    """The child's run stops with the cut (cancelled, or at its own deadline, the parent's); the resume goes on with it.

    Its stop is its parent's, so the parent's resume lifts it for both: the
    child goes on from its stored run, making the call the cut left in
    flight again (its tool, or its first model call), and answers.  After
    its first reply the child's 550 tokens are in the stopped parent and
    stay counted once; cut before any reply, there is nothing to count at
    the cut, and its first reply is made (and counted) by the resume.
    """
    calls = Calls(tmp_path / "calls.log", block=block)
    store = open_store(store_target, lease=LEASE)
    try:
        cut = _cut(parent_agent(calls, driver), driver, store=store)
        assert calls.stopped.wait(WAIT)  # the child's run is stored stopped (the sync child: at its own deadline)
        result = _finished(parent_agent(calls, driver).resume(store.load("p"), store=store, timeout=60), driver)
        child, parent = store.load("p/c1"), store.load("p")
    finally:
        calls.let_go()
        store.close()
    assert (result.final, child["state"]) == ("done", "Done")
    assert (calls.count("parent"), calls.count("child")) == (2, {"tool": 2, "model": 3}[block])
    assert calls.lines().count("tool") == {"tool": 2, "model": 1}[block]  # a tool cut in flight is made again, once
    assert _spent(cut) == AT_CUT[block]
    assert _spent(result) == (513, 54, 567e-6) == _each_reply_once(calls)
    assert parent["cut_children"] == {}  # the call is answered: its cut is settled


@pytest.mark.slow
def test_a_batch_cut_at_its_deadline_counts_the_child_that_answered_and_the_one_cut_each_once(tmp_path: Path) -> None:
    """Async, two sub-agent calls in one reply: ``q1`` answers in time, ``c1`` is cut after its child's first reply."""
    calls = Calls(tmp_path / "calls.log", block="tool")
    try:
        result = _cut(parent_agent(calls, "async", asks=(("quick", "q1"), ("helper", "c1"))), "async")
    finally:
        calls.let_go()
    assert (calls.count("quick"), calls.count("child")) == (1, 1)
    assert result.steps[0].child == "p/q1"  # the answered call is recorded with its child's tokens
    assert _spent(result) == (517, 54, 571e-6) == _each_reply_once(calls)


def _cut_then_killed(target: str, log: str, every: str) -> None:
    """The parent's process: its deadline cuts the child in its tool, and it dies the moment that stop is stored.

    The child's run is left as its last write has it, leased to the dead
    process: with ``every="call"`` its first reply is stored, with
    ``every="turn"`` it is not (written before model calls only).
    """
    calls = Calls(Path(log), block="tool")
    agent = parent_agent(calls, "sync", token_budget=BUDGET)
    agent.on("failed", lambda event: os._exit(9))
    agent.run("go", store=open_store(target, lease=LEASE, every=every), run_id="p")


@pytest.mark.subprocess
@pytest.mark.parametrize("every", ["call", "turn"])
@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_child_whose_owner_died_at_the_cut_is_taken_over_and_its_replies_counted_once(
    store_target: str, resumer: str, every: str, tmp_path: Path
) -> None:
    """The resumed parent takes the child over from its last write; the parent ends with each reply counted once.

    ``every="call"``: the child goes on after its stored first reply (2 child
    calls in all), adding only its last reply.  ``every="turn"``: its first
    reply was never stored, so it is made again and counted again, as it was
    billed again (3 child calls); the 550 tokens counted at the cut stay.
    The parent's token budget is not spent twice either: the child's share
    is what the parent has left, plus what its stored run holds of the 550
    tokens the cut counted, since the child counts from its stored run on.
    """
    log = tmp_path / "calls.log"
    assert in_child(_cut_then_killed, store_target, str(log), every) == 9
    calls = Calls(log)  # nothing hangs for the new owner
    with open_store(store_target) as look:
        parent, child = look.load("p"), look.load("p/c1")
    assert (parent["state"], parent["evidence"]["unfinished"]) == ("Failed", "c1")
    assert child["state"] not in ("Done", "Failed")  # its owner died with its tool in flight
    assert parent["counters"]["input_tokens"] == 510
    assert child["counters"]["input_tokens"] == (500 if every == "call" else 0)

    store = open_store(store_target, lease=LEASE)
    try:
        agent = parent_agent(calls, resumer)
        if resumer == "sync":
            result = taken_over(lambda: agent.resume(store.load("p"), store=store, timeout=60)).finish()
        else:

            async def go() -> RunResult:
                async def claim() -> AgentRun:
                    return await agent.aresume(await store.aload("p"), store=store, timeout=60)

                return await (await ataken_over(claim)).afinish()

            result = asyncio.run(go())
        child = store.load("p/c1")
    finally:
        store.close()
    assert (result.final, child["state"]) == ("done", "Done")
    assert calls.count("child") == {"call": 2, "turn": 3}[every]
    assert calls.lines().count("tool") == 2  # the tool in flight at the cut is made again, once
    expected = {"call": (513, 54, 567e-6), "turn": (1013, 104, 1117e-6)}[every]
    assert _spent(result) == expected == _each_reply_once(calls)
    left = BUDGET - (510 + 51)  # what the parent had left when it made the call again
    assert child["limits"]["token_budget"] == {"call": left + 550, "turn": left}[every]


@pytest.mark.subprocess
@pytest.mark.parametrize("every", ["call", "turn"])
@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_child_taken_over_and_cut_again_adds_only_what_it_spent_since_the_first_cut(
    store_target: str, resumer: str, every: str, tmp_path: Path
) -> None:
    """Cut, its owner dead; taken over and cut again by the next owner's deadline; then resumed to the parent's end.

    The second owner's child goes on from its last write: after the stored
    first reply (``every="call"``) it spends nothing new before the second
    cut, which adds nothing; without it (``every="turn"``) it makes that
    reply again, and the second cut adds it.  The last owner takes the
    child back from where the second cut stopped it (its tool made again)
    and it answers, adding only that answer.
    """
    log = tmp_path / "calls.log"
    assert in_child(_cut_then_killed, store_target, str(log), every) == 9
    time.sleep(LEASE * 1.5)  # the dead owner's leases lapse: the next owner takes the child over at once
    again = Calls(log, block="tool")
    with open_store(store_target, lease=LEASE) as store:
        second = _cut(parent_agent(again, "async"), "async", store=store, resume_from=store.load("p"))
        again.let_go()
    assert again.count("child") == {"call": 1, "turn": 2}[every]  # the first reply made again only if never stored
    assert _spent(second) == {"call": AT_CUT["tool"], "turn": (1010, 101, 1111e-6)}[every] == _each_reply_once(again)

    last = Calls(log)
    with open_store(store_target, lease=LEASE) as store:
        run = parent_agent(last, resumer).resume(store.load("p"), store=store, timeout=60)
        result = _finished(run, resumer)
        child = store.load("p/c1")
    assert (result.final, child["state"]) == ("done", "Done")
    assert last.count("child") == {"call": 2, "turn": 3}[every]  # its replies before the cuts never made again
    assert last.lines().count("tool") == 3  # the tool each cut left in flight made again, once each
    assert _spent(result) == {"call": (513, 54, 567e-6), "turn": (1013, 104, 1117e-6)}[every] == _each_reply_once(last)
