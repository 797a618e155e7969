"""Exactly once, in combination: a parallel batch with a sub-agent, cut in the middle and taken over by a new owner.

Every tool and every model counts its calls (``support.exactly_once``), so
"no completed call was made again, and none was lost" is counted exactly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.exactly_once import (
    FINAL,
    LEASE,
    SIBLINGS,
    SIDE_EFFECTS,
    Cut,
    Effects,
    ataken_over,
    batch_agent,
    durable_in,
    resumed_by_new_owner,
    taken_over,
)

from fsm_agent import Agent, RunResult, Session
from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]


def _run(agent: Agent, driver: str, store: Any) -> None:
    """Run the batch agent as ``cut`` on ``driver`` (to the end, or until something cuts it)."""
    if driver == "sync":
        agent.run("go", store=store, run_id="cut")
    else:
        asyncio.run(agent.arun("go", store=store, run_id="cut"))


def _turn(session: Session, driver: str) -> None:
    """Take the session's turn "go" on ``driver``."""
    if driver == "sync":
        session.run("go")
    else:
        asyncio.run(session.arun("go"))


def _cut(target: str, driver: str, effects: Effects) -> None:
    """Run the batch agent on ``driver`` until ``finish_up`` cuts it with ``KeyboardInterrupt``."""
    cut = Cut(durable_in(target, "cut", SIBLINGS))
    store = open_store(target, lease=LEASE)
    agent = batch_agent(effects, cut)
    with pytest.raises(KeyboardInterrupt):
        _run(agent, driver, store)
    store.close()


def _resumed(target: str, driver: str, effects: Effects) -> RunResult:
    """A new owner (new agent, new store object) takes the stored run over and finishes it on ``driver``."""
    return resumed_by_new_owner(target, "cut", driver, batch_agent(effects))


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_batch_with_a_sub_agent_cut_by_keyboard_interrupt_is_finished_by_a_new_owner_each_call_made_once(
    store_target: str, cutter: str, resumer: str
) -> None:
    """Cut (Ctrl-C) while the batch's last call runs: resumed elsewhere, parent and child tools each ran once."""
    effects = Effects()
    _cut(store_target, cutter, effects)
    assert dict(effects.done) == {"a": 1, "b": 1, "sub.w": 1}
    assert effects.tries == {"a": 1, "b": 1, "sub.w": 1, "z": 1}
    result = _resumed(store_target, resumer, effects)
    assert result.final == FINAL
    assert dict(effects.done) == SIDE_EFFECTS
    assert effects.tries == {"a": 1, "b": 1, "sub.w": 1, "z": 2}  # only the cut call, in flight, was made again
    # No completed model call was made again either: the batch's reply and the child's two replies were kept.
    assert effects.parent_model == 2
    assert effects.child_model == 2


# --- a fork taken inside a batch that was cut: the source's completed calls are not made again -------------------


def _cut_with_snapshot(target: str, driver: str, effects: Effects) -> dict[str, Any]:
    """Cut the batch as ``_cut`` does, and return the stored run as it was read just before the cut (mid-batch)."""
    seen: list[dict[str, Any]] = []
    durable = durable_in(target, "cut", SIBLINGS)

    def ready() -> bool:
        if not durable():
            return False
        with open_store(target) as store:
            seen.append(store.load("cut"))
        return True

    store = open_store(target, lease=LEASE)
    agent = batch_agent(effects, Cut(ready))
    with pytest.raises(KeyboardInterrupt):
        _run(agent, driver, store)
    store.close()
    (snapshot,) = seen
    return snapshot


def _forked(target: str, driver: str, agent: Agent, source: dict[str, Any], at: int) -> RunResult:
    with open_store(target) as store:
        if driver == "sync":
            return agent.fork(source, at, store=store, run_id=f"f{at}").finish()

        async def go() -> RunResult:
            return await (await agent.afork(source, at, store=store, run_id=f"f{at}")).afinish()

        return asyncio.run(go())


@pytest.mark.parametrize(
    ("source_driver", "fork_driver"),
    [
        ("sync", "sync"),
        ("sync", "async"),
        ("async", "sync"),
        ("async", "async"),
    ],
)
def test_a_fork_at_each_transition_of_a_batch_cut_mid_way_makes_only_the_call_the_source_never_completed(
    store_target: str, source_driver: str, fork_driver: str
) -> None:
    """Forked after each transition of the stored run as it was mid-batch (3 of 4 calls done): the fork takes the
    recorded results of the calls the source completed (the sub-agent's included) and makes the 4th call once."""
    source = _cut_with_snapshot(store_target, source_driver, Effects())
    for at in range(len(source["trace"])):
        effects = Effects()
        result = _forked(store_target, fork_driver, batch_agent(effects), source, at)
        assert result.final == FINAL, at
        assert dict(effects.done) == {"z": 1}, at
        assert effects.parent_model == 1, at  # the batch's reply is the source's; only the answer is asked for
        assert effects.child_model == 0, at
        reused = [s.reused_from for s in result.steps if s.kind == "tool_call"]
        assert reused[-1] is None, at  # finish_up: the source never completed it, the fork made it


def test_afork_inside_a_batch_of_a_run_recorded_on_the_sync_driver_is_taken_as_fork_takes_it() -> None:
    """Minimal: two calls in one reply, the sync driver stopped between them; ``afork`` there as ``fork`` does."""
    effects = Effects()
    run = batch_agent(effects).start("go")
    for _ in range(4):  # the reply, its check, the first call (a) and the edge back to Dispatch
        run.advance()
    snapshot = run.snapshot()
    assert dict(effects.done) == {"a": 1}
    assert batch_agent(Effects()).fork(snapshot, 3).finish().final == FINAL

    async def go() -> RunResult:
        return await (await batch_agent(effects).afork(snapshot, 3)).afinish()

    assert asyncio.run(go()).final == FINAL
    assert dict(effects.done) == {"a": 1, "b": 1, "sub.w": 1, "z": 1}


# --- a session's turn cut in the middle of its batch ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cutter", "resumer"),
    [
        ("sync", "sync"),
        ("sync", "async"),
        ("async", "sync"),
        ("async", "async"),
    ],
)
def test_a_session_turn_cut_mid_batch_is_finished_by_the_next_turn_of_a_new_owner_each_call_made_once(
    store_target: str, cutter: str, resumer: str
) -> None:
    """Ctrl-C in the batch of turn 1; a new Session object's next turn finishes turn 1 first, then answers turn 2."""
    effects = Effects()
    store = open_store(store_target, lease=LEASE)
    cut = Cut(durable_in(store_target, "chat/1", SIBLINGS))
    session = Session(batch_agent(effects, cut), store=store, session_id="chat")
    with pytest.raises(KeyboardInterrupt):
        _turn(session, cutter)
    store.close()
    assert dict(effects.done) == {"a": 1, "b": 1, "sub.w": 1}

    with open_store(store_target, lease=LEASE) as again:
        owner = Session(batch_agent(effects), store=again, session_id="chat")
        if resumer == "sync":
            result = taken_over(lambda: owner.run("and now?"))
        else:

            async def go() -> RunResult:
                return await ataken_over(lambda: owner.arun("and now?"))

            result = asyncio.run(go())
        first = again.load("chat/1")
        assert (first["state"], first["final"]) == ("Done", FINAL)
        assert owner.turns == 2
    assert result.final == FINAL  # turn 2 answers from the same four results, calling nothing
    assert dict(effects.done) == SIDE_EFFECTS
    assert effects.tries == {"a": 1, "b": 1, "sub.w": 1, "z": 2}
    assert effects.parent_model == 3  # turn 1's batch and its answer, turn 2's answer
    assert effects.child_model == 2
