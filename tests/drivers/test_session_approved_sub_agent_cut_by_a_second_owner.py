"""A session turn paused for approval of a sub-agent call, approved by a second owner whose Ctrl-C lands two levels
down, then finished by a third owner's next turn: each completed call is made once.

docs/how-to/conversations.md "A turn paused for approval" and "A turn whose
owner died"; docs/how-to/sub-agents.md "A child belongs to its call".  The
agent is ``support.exactly_once_audit``'s three levels, its ``outer``
sub-agent call held for a person's approval.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.exactly_once import ataken_over, taken_over
from support.exactly_once_audit import (
    LEASE,
    NESTED_EFFECTS,
    NESTED_FINAL,
    Cutter,
    Tally,
    durable_in,
    nested_agent,
)

from fsm_agent import Agent, RunResult, Session
from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]


def _careful(tally: Tally, cut: Cutter | None = None) -> Agent:
    return nested_agent(tally, cut, approve={"outer"})


@pytest.mark.slow
@pytest.mark.parametrize(("decider", "finisher"), [("sync", "async"), ("async", "sync"), ("async", "async")])
def test_an_approved_sub_agent_call_cut_in_its_grandchild_is_finished_by_the_next_turn_of_a_third_owner(
    store_target: str, tmp_path: Path, decider: str, finisher: str
) -> None:
    tally = Tally(tmp_path / "tally")
    with open_store(store_target, lease=LEASE) as store:
        paused = Session(_careful(tally), store=store, session_id="chat").run("go")
    assert (paused.reason, [call.id for call in paused.pending]) == ("paused", ["sub"])
    assert tally.counts("done") == {"a": 1}  # the call needing no approval ran before the pause

    cut = Cutter("g", durable_in(store_target, {"chat/1": ["a"], "chat/1/sub": ["c"]}))
    store = open_store(store_target, lease=LEASE)
    second = Session(_careful(tally, cut), store=store, session_id="chat")
    with pytest.raises(KeyboardInterrupt):
        second.resume({"sub": True}) if decider == "sync" else asyncio.run(second.aresume({"sub": True}))
    store.close()
    assert tally.counts("done") == {"a": 1, "c": 1}

    with open_store(store_target, lease=LEASE) as again:
        third = Session(_careful(tally), store=again, session_id="chat")
        if finisher == "sync":
            result = taken_over(lambda: third.run("and now?"))
        else:

            async def go() -> RunResult:
                return await ataken_over(lambda: third.arun("and now?"))

            result = asyncio.run(go())
        first = again.load("chat/1")
        turns = sorted(run.run_id for run in again.list_runs(session="chat"))
    assert (first["state"], first["final"]) == ("Done", NESTED_FINAL)
    assert turns == ["chat/1", "chat/2"]
    assert result.final == NESTED_FINAL  # turn 2 answers from turn 1's results, calling nothing
    assert tally.counts("done") == NESTED_EFFECTS
    assert tally.counts("try") == {"a": 1, "c": 1, "g": 2}  # only g, in flight at the cut, again
    assert tally.counts("model") == {"parent": 3, "child": 2, "grand": 2}
