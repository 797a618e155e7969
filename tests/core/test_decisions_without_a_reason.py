"""A rejection with no reason, as ``False`` or as ``""``, is one decision; a call that needs no approval takes none.

``False`` and ``""`` both mean "rejected, no reason given": the call never
runs, the model is told the same words, the run keeps the decision as
``False``, and the decision given again in the other spelling is taken as
given (a retried request goes on).  A decision on a pending call the run
does not hold back is refused before anything is recorded: nobody is asked
about such a call, and a rejection would drop a call the agent lets run.
Side effects are counted per call id, so a call that ran shows.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from fsm_agent import Agent, RunResult, ToolCall, ToolRegistry
from fsm_agent.testing import ManualClock, reply, tool_turn
from fsm_agent.testing.store_kit import Script

NOT_TOLD_WHY = '{"error": "a person rejected this call to \'charge\': no reason given"}'


def _agent(counter: Counter[str], script: list[Any], **options: Any) -> Agent:
    """``charge`` (held back) and ``note`` (free), each counting its executions by call id."""
    registry = ToolRegistry()

    @registry.register
    def charge(card: int, call_id: str) -> str:
        """Charge a card."""
        counter[call_id] += 1
        return f"charged {card}"

    @registry.register
    def note(text: str, call_id: str) -> str:
        """Write a note."""
        counter[call_id] += 1
        return text

    return Agent(Script(*script), registry, clock=ManualClock(), approve={"charge"}, **options)


def _script() -> list[Any]:
    """One turn: charge ``a`` and ``b`` (both held back), then note ``n`` (free); then the answer."""
    calls = (
        ToolCall("a", "charge", {"card": 1}),
        ToolCall("b", "charge", {"card": 2}),
        ToolCall("n", "note", {"text": "x"}),
    )
    return [tool_turn(*calls), reply("ok")]


def _told(result: RunResult) -> dict[str, str]:
    return {m.tool_call_id or "": m.content for m in result.messages if m.role == "tool"}


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("decision", [False, ""], ids=["False", "empty text"])
def test_false_and_an_empty_reason_reject_a_call_alike_and_it_never_runs(decision: bool | str, driver: str) -> None:
    """Either spelling: the rejected call runs zero times, the others once, the model is told "no reason given"."""
    counter: Counter[str] = Counter()
    agent = _agent(counter, _script())
    paused = agent.run("pay")
    assert [c.id for c in paused.pending] == ["a", "b"], "n waits for nobody"
    run = agent.resume(paused, approvals={"a": decision, "b": True})
    assert run.snapshot()["approvals"] == {"a": False, "b": True}, "the rejection is kept as False"
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert (result.reason, counter) == ("done", Counter({"b": 1, "n": 1}))
    assert _told(result) == {"a": NOT_TOLD_WHY, "b": '"charged 2"', "n": '"x"'}


def test_both_spellings_give_the_same_run() -> None:
    """The results of a run rejected with ``False`` and one rejected with ``""`` are equal, message for message."""
    results = []
    for decision in (False, ""):
        agent = _agent(Counter(), _script())
        results.append(agent.resume(agent.run("pay"), approvals={"a": decision, "b": decision}).finish())
    assert results[0] == results[1]


@pytest.mark.parametrize(("first", "again"), [(False, ""), ("", False)], ids=["False then empty", "empty then False"])
def test_a_rejection_without_a_reason_given_again_in_the_other_spelling_is_taken_as_given(
    first: bool | str, again: bool | str
) -> None:
    """A retried request that spells "no reason" the other way is the same decision, not one that overturns it."""
    counter: Counter[str] = Counter()
    run = _agent(counter, _script()).start("pay")
    while not run.paused:
        run.advance()
    run.decide({"a": first})
    run.decide({"a": again, "b": True})
    assert run.snapshot()["approvals"] == {"a": False, "b": True}
    with pytest.raises(ValueError, match=r"tool call 'a' was already decided \(rejected\); a decision holds"):
        run.decide({"a": "a reason after all"})
    assert run.finish().reason == "done"
    assert counter == Counter({"b": 1, "n": 1})


@pytest.mark.parametrize("decision", [False, "", "not this one", True])
def test_a_decision_on_a_call_that_needs_no_approval_is_refused_and_nothing_is_recorded(decision: bool | str) -> None:
    """``n`` is pending but not held back: deciding it (with a decision on ``a`` beside it) is a ValueError naming the
    calls that do wait, no decision is recorded, and ``n`` then runs once as the agent lets it."""
    counter: Counter[str] = Counter()
    agent = _agent(counter, _script())
    paused = agent.run("pay")
    with pytest.raises(ValueError, match=r"tool call 'n': it needs no approval, .*\(held back for a decision: a, b\)"):
        agent.resume(paused, approvals={"a": True, "n": decision})
    run = agent.start("pay")
    while not run.paused:
        run.advance()
    with pytest.raises(ValueError, match="needs no approval"):
        run.decide({"a": True, "n": decision})
    assert run.snapshot()["approvals"] == {}, "a refused decision recorded another"
    run.decide({"a": True, "b": True})
    assert run.finish().reason == "done"
    assert counter == Counter({"a": 1, "b": 1, "n": 1})
