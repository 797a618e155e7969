"""Exactly once with a cut inside a sub-agent: Ctrl-C while the child's own tool runs, then a new owner.

docs/how-to/sub-agents.md "A child belongs to its call": a parent resumed
after a crash takes its stored child; one under way goes on from its own
checkpoint, waiting out the dead owner's lease.  docs/how-to/conversations.md
"A turn whose owner died": the next turn finishes it first.  Every tool and
model counts its calls (``support.exactly_once``); only the call in flight at
the cut (the child's ``sub.w``) may be made twice.  The child's tokens and
tool calls must reach the parent after the takeover as after a plain run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.exactly_once import (
    FINAL,
    LEASE,
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


def _done_before_cut(driver: str) -> set[str]:
    """The parent's calls whose outcomes are durable before the child's call is cut.

    The sync driver runs the batch in order (a, b, then the sub-agent; finish_up never starts); the async one runs
    all four at once, so finish_up completes too before the cut fires.
    """
    return {"a", "b"} if driver == "sync" else {"a", "b", "z"}


def _run(agent: Agent, driver: str, store: Any) -> None:
    if driver == "sync":
        agent.run("go", store=store, run_id="cut")
    else:
        asyncio.run(agent.arun("go", store=store, run_id="cut"))


def _turn(session: Session, driver: str) -> None:
    if driver == "sync":
        session.run("go")
    else:
        asyncio.run(session.arun("go"))


TRIES = {"a": 1, "b": 1, "sub.w": 2, "z": 1}
"""Every call tried once, but the child's ``sub.w``: it was in flight at the cut, so it is made again."""


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_run_cut_inside_its_sub_agents_tool_is_finished_by_a_new_owner_each_completed_call_once(
    store_target: str, cutter: str, resumer: str
) -> None:
    effects = Effects()
    before = _done_before_cut(cutter)
    cut = Cut(durable_in(store_target, "cut", before), at="sub.w")
    store = open_store(store_target, lease=LEASE)
    with pytest.raises(KeyboardInterrupt):
        _run(batch_agent(effects, cut), cutter, store)
    store.close()
    assert dict(effects.done) == dict.fromkeys(before, 1)
    assert effects.child_model == 1  # the child's first reply, stored before its call was cut

    result = resumed_by_new_owner(store_target, "cut", resumer, batch_agent(effects))
    assert result.final == FINAL
    assert dict(effects.done) == SIDE_EFFECTS
    assert effects.tries == TRIES  # only sub.w, in flight at the cut, was made again
    assert effects.parent_model == 2
    assert effects.child_model == 2  # the child's stored reply was kept: one more call, its answer
    # The child's one tool call reached the parent's count: a, b, research, z and sub.w.
    assert result.steps[-1].counters["tool_calls"][0] == 5
    with open_store(store_target) as check:
        child = check.load("cut/sub")
        assert (child["state"], child["parent_run_id"], child["parent_call_id"]) == ("Done", "cut", "sub")
        assert check.load("cut")["state"] == "Done"


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_session_turn_cut_inside_its_sub_agent_is_finished_by_a_new_session_objects_next_turn(
    store_target: str, cutter: str, resumer: str
) -> None:
    effects = Effects()
    before = _done_before_cut(cutter)
    store = open_store(store_target, lease=LEASE)
    cut = Cut(durable_in(store_target, "chat/1", before), at="sub.w")
    session = Session(batch_agent(effects, cut), store=store, session_id="chat")
    with pytest.raises(KeyboardInterrupt):
        _turn(session, cutter)
    store.close()
    assert dict(effects.done) == dict.fromkeys(before, 1)

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
        assert again.load("chat/1/sub")["state"] == "Done"
        assert owner.turns == 2
        turns = sorted(run.run_id for run in again.list_runs(session="chat"))
    assert turns == ["chat/1", "chat/2"]  # the child run is not listed as a turn
    assert result.final == FINAL
    assert dict(effects.done) == SIDE_EFFECTS
    assert effects.tries == TRIES
    assert effects.child_model == 2
    # The session's history holds both turns whole: two questions, four tool answers, two answers.
    roles = [m.role for m in owner.messages]
    assert roles == ["user", "assistant", "tool", "tool", "tool", "tool", "assistant", "user", "assistant"]
