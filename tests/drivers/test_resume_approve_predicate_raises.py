"""An ``approve=`` predicate that raises while a run is resumed: raised as it is, noted, the run left as it was.

docs/decisions.md "An approve= predicate that raises while a run is
resumed": during a first run the predicate's exception stops the run
``stop_condition_error`` (the edge ``RULE_RAISED``); a resume asks this
agent's predicate about the calls the run left pending before anything is
claimed (``AgentRun._resumed``, ``stepper.gate()``), so its exception is
raised as it is, with a note naming the predicate and the run and saying
nothing was claimed, written or called: the same resume, made again once the
predicate answers, runs each call once.  Every tool execution is counted by
call id and every model call counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, RunResult, ToolCall, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class Sent:
    """A ``send`` tool that counts its executions by call id."""

    def __init__(self) -> None:
        self.ran: Counter[str] = Counter()
        self.registry = ToolRegistry()
        ran = self.ran

        @self.registry.register
        def send(to: str, call_id: str) -> str:
            """Send a report."""
            ran[call_id] += 1
            return f"sent to {to}"


def policy_down(call: ToolCall) -> bool:
    """The ``approve=`` predicate whose policy lookup fails."""
    msg = "policy service unreachable"
    raise RuntimeError(msg)


def _asks() -> FakeModel:
    return FakeModel(tool_turn(tool_call("send", id="s1", to="ada")), reply("done"))


def _stopped_first(sent: Sent, how: str, store: Any) -> tuple[RunResult, FakeModel]:
    """The first run, with the call ``s1`` left pending: paused for a decision, or stopped by ``max_tool_calls``."""
    model = _asks()
    if how == "paused":
        agent = Agent(model, sent.registry, approve={"send"})
        result = agent.run("go", store=store, run_id="r1")
        assert result.reason == "paused"
        return result, model
    with pytest.raises(AgentLoopError) as stop:
        Agent(model, sent.registry, max_tool_calls=0).run("go", store=store, run_id="r1")
    assert stop.value.result.reason == "max_tool_calls"
    return stop.value.result, model


def _drive(agent: Agent, source: Any, driver: str, store: Any, **keywords: Any) -> RunResult:
    """``source`` resumed by ``agent`` and driven to its end on ``driver``."""
    if driver == "sync":
        return agent.resume(source, store=store, **keywords).finish()

    async def go() -> RunResult:
        return await (await agent.aresume(source, store=store, **keywords)).afinish()

    return asyncio.run(go())


def _refused(agent: Agent, source: Any, driver: str, store: Any, **keywords: Any) -> RuntimeError:
    """``_drive``, which must raise the predicate's own ``RuntimeError``: it, with its note checked."""
    with pytest.raises(RuntimeError, match="policy service unreachable") as raised:
        _drive(agent, source, driver, store, **keywords)
    notes = " ".join(getattr(raised.value, "__notes__", ()))
    assert "raised by approve=policy_down while resuming run" in notes
    assert "nothing was claimed, written or called" in notes
    return raised.value


def _lifted(how: str) -> dict[str, Any]:
    return {"max_tool_calls": 5} if how == "stopped" else {}


def _again(how: str) -> dict[str, Any]:
    """What the resume made again once the predicate answers is given: the decision, or the lifted limit."""
    return {"approvals": {"s1": True}} if how == "paused" else _lifted(how)


@pytest.mark.parametrize("how", ["paused", "stopped"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_resumed_snapshot_whose_approve_predicate_raises_raises_it_noted_and_calls_nothing(
    driver: str, how: str
) -> None:
    """No store: the predicate's error comes out as it is, noted; the same resume made again runs ``send`` once."""
    sent = Sent()
    first, first_model = _stopped_first(sent, how, None)
    model = FakeModel(reply("done"))
    _refused(Agent(model, sent.registry, approve=policy_down), first, driver, None, **_lifted(how))
    assert sent.ran == Counter()
    assert (len(first_model.seen), len(model.seen)) == (1, 0)  # the first reply paid once; the refusal pays nothing
    result = _drive(Agent(model, sent.registry), first, driver, None, **_again(how))
    assert result.final == "done"
    assert sent.ran == Counter({"s1": 1})
    assert len(model.seen) == 1


@pytest.mark.parametrize("how", ["paused", "stopped"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stored_run_resumed_under_a_raising_approve_predicate_is_left_as_it_was_and_free(
    store_target: str, driver: str, how: str
) -> None:
    """With a store (SQLite, PostgreSQL): nothing is written, anyone may claim the run, and the retry runs once."""
    sent = Sent()
    with open_store(store_target) as store:
        _, first_model = _stopped_first(sent, how, store)
        before = store.load("r1")
        model = FakeModel(reply("done"))
        _refused(Agent(model, sent.registry, approve=policy_down), before, driver, store, **_lifted(how))
        assert store.load("r1") == before  # not a field written, not the version moved
        assert sent.ran == Counter()
        assert (len(first_model.seen), len(model.seen)) == (1, 0)
        result = _drive(Agent(model, sent.registry), store.load("r1"), driver, store, **_again(how))
        assert result.final == "done"
        assert store.load("r1")["state"] == "Done"
    assert sent.ran == Counter({"s1": 1})
    assert len(model.seen) == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_raising_predicate_leaves_a_paused_stored_run_as_it_was_until_the_stop_is_taken(
    store_target: str, driver: str
) -> None:
    """Whatever the resume does with the raise, it never runs the call nor leaves the run leased or half-written.

    The stored run is still paused and free: refused before the claim.
    """
    sent = Sent()
    with open_store(store_target) as store:
        _stopped_first(sent, "paused", store)
        model = FakeModel(reply("never asked"))
        agent = Agent(model, sent.registry, approve=policy_down)
        _refused(agent, store.load("r1"), driver, store)
        stored = store.load("r1")
        assert (stored["state"], stored["paused"]) == ("ExecuteTool", True)
        store.claim("r1", stored, owner="probe")
    assert sent.ran == Counter()
    assert model.seen == []


@pytest.mark.parametrize("driver", DRIVERS)
def test_late_decisions_on_a_finished_run_are_refused_in_words_even_if_the_predicate_raises(
    store_target: str, driver: str
) -> None:
    """Approvals given to the resume of a run that finished ``Done``: a ``ValueError`` saying so, not the raise.

    ``too_late`` asks the agent's predicate whether the call made was one it
    held back; a predicate that raises there leaves that unsaid.
    """
    sent = Sent()
    with open_store(store_target) as store:
        _stopped_first(sent, "paused", store)
        approved = Agent(FakeModel(reply("done")), sent.registry, approve={"send"})
        assert approved.resume(store.load("r1"), store=store, approvals={"s1": True}).finish().final == "done"
        agent = Agent(FakeModel(reply("never asked")), sent.registry, approve=policy_down)
        with pytest.raises(ValueError, match="nothing to resume") as refused:
            _drive(agent, store.load("r1"), driver, store, approvals={"s1": True})
        assert "tool call 's1' was already made" in str(refused.value)
    assert sent.ran == Counter({"s1": 1})
