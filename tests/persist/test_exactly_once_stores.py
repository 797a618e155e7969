"""Exactly once across owners of one stored run: decisions taken half in the store, cuts, takeovers and races.

Every tool and every model counts its calls (``support.exactly_once``), on
both stores and both drivers, so "an approved call ran once, a rejected one
never, no completed call again" is counted exactly.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from support.exactly_once import LEASE, Cut, Effects, batch_agent, durable_in, resumed_by_new_owner, taken_over

from fsm_agent import Agent, AgentRun, RunLeasedError, RunResult
from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]


def _driven(run: AgentRun, driver: str) -> RunResult:
    if driver == "sync":
        return run.finish()

    async def go() -> RunResult:
        return await run.afinish()

    return asyncio.run(go())


def _take_over(target: str, driver: str, agent: Agent, **options: Any) -> RunResult:
    """A new owner resumes the stored run ``cut`` once it is free, and drives it on ``driver``."""
    return resumed_by_new_owner(target, "cut", driver, agent, **options)


@pytest.mark.slow
@pytest.mark.parametrize("second", DRIVERS)
@pytest.mark.parametrize("first", DRIVERS)
def test_a_half_decided_batch_cut_in_its_sub_agent_is_taken_over_then_decided_each_approved_call_once(
    store_target: str, first: str, second: str
) -> None:
    """Paused on three calls; two decided in the store (one approved, one rejected); the owner that goes on is cut
    inside the sub-agent; a new owner finishes the sub-agent and pauses on the undecided call; once decided, it
    runs: the approved calls ran once, the rejected one never, the cut one exactly twice (it was in flight)."""
    effects = Effects()
    approve = {"work", "finish_up"}  # a, b and z wait for a person; the sub-agent does not
    with open_store(store_target, lease=LEASE) as store:
        paused = _driven(batch_agent(effects, approve=approve).start("go", store=store, run_id="cut"), first)
        assert paused.reason == "paused"
        assert [c.id for c in paused.pending] == ["a", "b", "z"]
        store.decide("cut", "a", True)
        store.decide("cut", "b", "not today")
    assert dict(effects.done) == {}

    # The owner that goes on (another agent object) makes a, skips b, and is cut inside the sub-agent's own call.
    cut = Cut(durable_in(store_target, "cut", {"a"}), at="sub.w")
    with pytest.raises(KeyboardInterrupt):
        _take_over(store_target, first, batch_agent(effects, cut, approve=approve))
    assert dict(effects.done) == {"a": 1}
    assert effects.tries == {"a": 1, "sub.w": 1}

    # A new owner takes the parent (and the sub-agent's run) over, and pauses on the call nobody decided yet.
    again = _take_over(store_target, second, batch_agent(effects, approve=approve))
    assert again.reason == "paused"
    assert [c.id for c in again.pending] == ["z"]
    assert dict(effects.done) == {"a": 1, "sub.w": 1}

    with open_store(store_target, lease=LEASE) as store:
        store.decide("cut", "z", True)
    result = _take_over(store_target, first, batch_agent(effects, approve=approve))
    assert result.reason == "done"
    assert dict(effects.done) == {"a": 1, "sub.w": 1, "z": 1}
    assert effects.tries == {"a": 1, "sub.w": 2, "z": 1}  # b, rejected, never ran; sub.w was in flight at the cut
    assert "b" not in effects.tries
    assert effects.parent_model == 2
    assert effects.child_model == 2
    tool_texts = [m.content for m in result.messages if m.role == "tool"]
    assert len(tool_texts) == 4
    assert "not today" in tool_texts[1]


# --- two new owners racing for one cut run ----------------------------------------------------------------------


def _racer(target: str, driver: str, effects: Effects, barrier: threading.Barrier, out: dict[str, Any]) -> None:
    """Load the stored run, wait for the other racer, then claim it at the same moment and finish it if it won."""
    try:
        with open_store(target, lease=LEASE) as store:
            agent = batch_agent(effects)
            if driver == "sync":
                snapshot = store.load("cut")
                barrier.wait()
                out["result"] = agent.resume(snapshot, store=store).finish()
                return

            async def go() -> RunResult:
                snapshot = await store.aload("cut")
                await asyncio.to_thread(barrier.wait)
                return await (await agent.aresume(snapshot, store=store)).afinish()

            out["result"] = asyncio.run(go())
    except RunLeasedError as refused:
        out["refused"] = refused
    except BaseException as other:  # noqa: BLE001 - reported by the test
        out["other"] = other


@pytest.mark.slow
@pytest.mark.parametrize(("one", "two"), [("sync", "sync"), ("async", "async"), ("sync", "async")])
def test_two_owners_racing_to_take_over_a_cut_batch_one_wins_the_other_is_refused_each_call_made_once(
    store_target: str, one: str, two: str
) -> None:
    """Both load the cut run and claim it at once (threads, each its own store object and driver): one finishes it,
    the other gets RunLeasedError naming the run, before it calls anything; every call ran once, the cut one twice."""
    effects = Effects()
    cut = Cut(durable_in(store_target, "cut", ("a", "b", "sub")))
    with open_store(store_target, lease=LEASE) as store, pytest.raises(KeyboardInterrupt):
        batch_agent(effects, cut).run("go", store=store, run_id="cut")
    # The cut owner's lease lapses (it is never renewed again); checked by a claim that gives the run back at once.
    with open_store(store_target, lease=LEASE) as store:
        probe = taken_over(lambda: batch_agent(Effects()).resume(store.load("cut"), store=store))
        owner = probe._journal.owner  # type: ignore[union-attr]
        store.renew("cut", owner=owner, seq=store.load("cut")["stored_seq"], release=True)
    outs: list[dict[str, Any]] = [{}, {}]
    barrier = threading.Barrier(2)
    threads = [
        threading.Thread(target=_racer, args=(store_target, driver, effects, barrier, out))
        for driver, out in zip((one, two), outs, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert [o.get("other") for o in outs] == [None, None]
    won = [o["result"] for o in outs if "result" in o]
    refused = [o["refused"] for o in outs if "refused" in o]
    assert len(won) == 1, outs
    assert len(refused) == 1, outs
    assert refused[0].run_id == "cut"
    assert won[0].final == 'done: "a ok", "b ok", "child: \\"sub.w ok\\"", "z ok"'
    assert dict(effects.done) == {"a": 1, "b": 1, "sub.w": 1, "z": 1}
    assert effects.tries == {"a": 1, "b": 1, "sub.w": 1, "z": 2}
    assert effects.parent_model == 2
    assert effects.child_model == 2
