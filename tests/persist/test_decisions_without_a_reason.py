"""A stored decision: ``False`` and ``""`` are one rejection with no reason; a call that needs no approval takes none.

Every test runs on a SQLite file and a PostgreSQL database, through ``decide``
and through its awaited twin ``adecide``.  Side effects are counted per call
id, so a call that ran shows.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from support.shared_runs import SECRET, Effects, office, office_registry
from support.shared_runs import Office as OfficeModel

from fsm_agent import Agent, DecisionError
from fsm_agent.persist import open_store

RUN = "job"
NOT_TOLD_WHY = json.dumps({"error": "a person rejected this call to 'read_file': no reason given"})


def _decide(target: str, how: str, call_id: str, decision: bool | str) -> dict[str, Any]:
    """One decision, with ``decide`` or with ``adecide`` on a store of its own."""
    if how == "decide":
        with open_store(target) as store:
            return store.decide(RUN, call_id, decision)

    async def awaited() -> dict[str, Any]:
        async with open_store(target) as store:
            return await store.adecide(RUN, call_id, decision)

    return asyncio.run(awaited())


@pytest.mark.parametrize("how", ["decide", "adecide"])
@pytest.mark.parametrize(("first", "again"), [(False, ""), ("", False)], ids=["False then empty", "empty then False"])
def test_false_and_an_empty_reason_are_stored_as_one_decision_and_the_call_never_runs(
    store_target: str, how: str, first: bool | str, again: bool | str
) -> None:
    """Either spelling is stored as False; the other, given again, writes nothing; the read never runs, and the model
    is told "no reason given" either way."""
    with open_store(store_target) as store:
        agent, _ = office(Effects())
        assert agent.run("tidy up", store=store, run_id=RUN).reason == "paused"
        decided = _decide(store_target, how, "read", first)
        assert decided["approvals"] == {"read": False}
        assert _decide(store_target, how, "read", again) == decided, "the same decision again wrote something"
        with pytest.raises(DecisionError, match=r"already decided \(rejected\)"):
            _decide(store_target, how, "read", "a reason after all")
        assert store.load(RUN) == decided
        _decide(store_target, how, "mail", True)
        effects = Effects()
        plain, model = office(effects, approve=False)
        result = plain.resume(store.load(RUN), store=store).finish()
    assert (result.reason, effects) == ("done", {"mail": 1})
    told = {m.tool_call_id: m.content for m in result.messages if m.role == "tool"}
    assert told == {"read": NOT_TOLD_WHY, "mail": '"mailed boss"'}
    assert SECRET not in model.shown


@pytest.mark.parametrize("how", ["decide", "adecide"])
def test_a_decision_on_a_call_that_needs_no_approval_is_refused_and_stores_nothing(store_target: str, how: str) -> None:
    """Only ``read`` is held back: a decision on ``mail`` (pending, free to run) is a DecisionError saying it needs no
    approval and naming the call that does; the stored run, its version included, is as it was, and mail runs once."""
    effects = Effects()
    agent = Agent(OfficeModel(), office_registry(effects), approve={"read_file"})
    with open_store(store_target) as store:
        assert agent.run("tidy up", store=store, run_id=RUN).reason == "paused"
        before = store.load(RUN)
        assert before["to_approve"] == ["read"]
        for decision in (False, "", "no mail today", True):
            with pytest.raises(DecisionError) as refused:
                _decide(store_target, how, "mail", decision)
            assert str(refused.value) == (
                f"no decision taken on call 'mail' of run {RUN!r}: "
                "it needs no approval, so there is nothing to decide (held back for a decision: read)"
            )
        assert store.load(RUN) == before, "a refused decision changed the run"
        _decide(store_target, how, "read", True)
        result = agent.resume(store.load(RUN), store=store).finish()
    assert (result.reason, effects) == ("done", {"read": 1, "mail": 1})
