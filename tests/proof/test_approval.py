"""``Proof.approval_safe`` against real runs: held calls counted, both drivers, parallel batches too."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest

from fsm_agent import Agent, AgentLoopError, ToolRegistry
from fsm_agent.proof import check
from fsm_agent.records import RunResult
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


class Ledger:
    """Counts each call's runs and which ran while still undecided."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.decided: dict[str, bool | str] = {}
        self.undecided: list[str] = []


def _agent(ledger: Ledger, held: set[str], **limits: object) -> Agent:
    registry = ToolRegistry()

    def send(to: str, call_id: str) -> str:
        """A call the rule holds back."""
        ledger.runs[call_id] += 1
        if ledger.decided.get(call_id) is not True:
            ledger.undecided.append(call_id)
        return f"sent to {to}"

    def look(what: str, call_id: str) -> str:
        """A call that needs no decision."""
        ledger.runs[call_id] += 1
        return f"saw {what}"

    registry.register(send)
    registry.register(look)
    script = (
        tool_turn(
            tool_call("look", id="a", what="1"),
            tool_call("send", id="b", to="x"),
            tool_call("look", id="c", what="2"),
            tool_call("send", id="d", to="y"),
        ),
        tool_turn(tool_call("send", id="e", to="z"), tool_call("look", id="f", what="3")),
        reply("all done"),
    )
    return Agent(FakeModel(*script), registry, approve=held, **limits)  # type: ignore[arg-type]


def _decide(ledger: Ledger, run: object, answers: itertools.cycle[bool | str]) -> None:
    waiting = {call.id: next(answers) for call in run.awaiting()}  # type: ignore[attr-defined]
    ledger.decided.update(waiting)
    run.decide(waiting)  # type: ignore[attr-defined]


def _drive(agent: Agent, ledger: Ledger, driver: str, answers: list[bool | str]) -> tuple[RunResult, int]:
    cycle = itertools.cycle(answers)
    pauses = 0
    if driver == "sync":
        run = agent.start("q")
        while not run.done:
            if run.paused:
                pauses += 1
                _decide(ledger, run, cycle)
            else:
                run.advance()
        return run.result, pauses

    async def go() -> RunResult:
        nonlocal pauses
        arun = await agent.astart("q")
        while not arun.done:
            if arun.paused:
                pauses += 1
                _decide(ledger, arun, cycle)
            else:
                await arun.aadvance()
        return arun.result

    return asyncio.run(go()), pauses


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("answers", [[True], [False], [True, "not now"], ["no", True]])
def test_no_held_call_runs_before_its_decision_and_no_rejected_call_runs(
    driver: str, answers: list[bool | str]
) -> None:
    """Held and free calls interleaved in one turn (the async driver batches the free ones): the proof says safe,
    and no held call runs undecided, a rejected one never, an approved or free one exactly once."""
    ledger = Ledger()
    proof = check(_agent(Ledger(), {"send"}), calls_per_reply=4)
    assert proof.approval_safe
    assert proof.approval_counterexample == ()
    result, pauses = _drive(_agent(ledger, {"send"}), ledger, driver, answers)
    assert result.final == "all done"
    assert pauses >= 1
    assert ledger.undecided == []
    assert set(ledger.decided) == {"b", "d", "e"}
    expected = {"a": 1, "c": 1, "f": 1} | {call: 1 for call, yes in ledger.decided.items() if yes is True}
    assert dict(ledger.runs) == expected


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stop_in_the_middle_of_a_gated_turn_runs_no_held_call(driver: str) -> None:
    """max_tool_calls=1 stops the turn after 'a': the held calls behind it never run, decided or not."""
    ledger = Ledger()
    assert check(_agent(Ledger(), {"send"}, max_tool_calls=1)).approval_safe
    agent = _agent(ledger, {"send"}, max_tool_calls=1)
    try:
        result, _ = _drive(agent, ledger, driver, [True])
    except AgentLoopError as stop:
        result = stop.result
    assert result.trace[-1].reason == "max_tool_calls"
    assert dict(ledger.runs) == {"a": 1}
    assert ledger.undecided == []


def test_a_held_call_resumed_by_an_agent_without_a_rule_still_waits() -> None:
    """The run keeps which calls wait: an agent without ``approve=`` resuming the paused run cannot run them."""
    ledger = Ledger()
    paused = _agent(ledger, {"send"}).run("q")
    assert paused.reason == "paused"
    assert dict(ledger.runs) == {"a": 1}
    ungated = Agent(FakeModel(reply("unused")), _agent(ledger, set()).registry)
    again = ungated.resume(paused)
    assert again.paused
    assert again.finish().reason == "paused"
    assert dict(ledger.runs) == {"a": 1}
    assert ledger.undecided == []
