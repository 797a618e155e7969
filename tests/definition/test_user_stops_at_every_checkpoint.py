"""Users' ``StopCondition``s on both drivers: true at each checkpoint, raising there, and named like a built-in.

A user's stop is a row of the agent's own table, after the built-in stops of
its checkpoint; a check that raises stops the run with
``stop_condition_error``; a reason that collides with a built-in one is a
``ValueError`` when the agent is built (docs/concepts/stops.md).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, RunResult, RunView, StopCondition, ToolRegistry
from fsm_agent.definition.table import BUILTIN_REASONS
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
PLACES = ["input", "AwaitModel", "CheckTruncation", "Dispatch", "ExecuteTool", "answer"]


def counted_registry(ran: Counter[str]) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    def echo(text: str) -> str:
        """Return the text unchanged."""
        ran[text] += 1
        return text

    return registry


def finish(agent: Agent, driver: str) -> RunResult | AgentLoopError:
    try:
        if driver == "sync":
            return agent.run("go")
        return asyncio.run(agent.arun("go"))
    except AgentLoopError as stop:
        return stop


def always(view: RunView) -> bool:
    """Always true."""
    return True


def broken(view: RunView) -> bool:
    raise KeyError("missing")


def never(view: RunView) -> bool:
    return False


def script() -> FakeModel:
    return FakeModel(tool_turn(tool_call("echo", id="c1", text="a"), content="thinking"), reply("the answer"))


# Where a condition true from the start stops the run: the edge, the model calls made, the calls run, final.
TRUE_AT: dict[str, tuple[str, int, int, str]] = {
    "input": ("AwaitModel->Failed[mine]", 0, 0, ""),
    "AwaitModel": ("AwaitModel->Failed[mine]", 1, 0, ""),
    "CheckTruncation": ("CheckTruncation->Failed[mine]", 1, 0, ""),
    "Dispatch": ("Dispatch->Failed[mine]", 1, 0, ""),
    "ExecuteTool": ("ExecuteTool->Failed[mine]", 1, 1, ""),
    "answer": ("Dispatch->Failed[mine]", 2, 1, "the answer"),
}


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("at", PLACES)
def test_a_condition_true_from_the_start_stops_at_its_first_checkpoint(driver: str, at: str) -> None:
    ran: Counter[str] = Counter()
    model = script()
    stop = finish(
        Agent(model, counted_registry(ran), stop_conditions=[StopCondition("mine", at, always, "why")]), driver
    )
    assert isinstance(stop, AgentLoopError)
    edge, model_calls, tool_calls, final = TRUE_AT[at]
    assert stop.reason == "mine"
    assert edges(stop.result)[-1] == edge
    assert len(model.seen) == model_calls
    assert sum(ran.values()) == tool_calls
    assert stop.result.final == final
    assert stop.evidence["condition"] == "always"
    assert stop.evidence["description"] == "why"
    assert {"step", "counters"} <= stop.evidence.keys()
    if model_calls:
        assert stop.result.messages[1].content == "thinking"  # the reply it stopped on, or before, is kept


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("at", PLACES)
def test_a_check_that_raises_stops_the_run_with_stop_condition_error_naming_it(driver: str, at: str) -> None:
    ran: Counter[str] = Counter()
    stop = finish(Agent(script(), counted_registry(ran), stop_conditions=[StopCondition("mine", at, broken)]), driver)
    assert isinstance(stop, AgentLoopError)
    assert stop.reason == "stop_condition_error"
    assert edges(stop.result)[-1].endswith("->Failed[stop_condition_error]")
    assert stop.evidence["condition"] == "broken"
    assert stop.evidence["type"] == "KeyError"
    assert stop.evidence["error"] == "'missing'"
    assert isinstance(stop.__cause__, KeyError)
    assert sum(ran.values()) == TRUE_AT[at][2]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_Dispatch_condition_is_checked_before_every_call_of_a_batch(driver: str) -> None:
    """Stop before the second call of one turn: the first ran once, the second and third never (both drivers)."""
    ran: Counter[str] = Counter()

    def second_call(view: RunView) -> bool:
        """The next call is the one with text b."""
        return bool(view.pending) and view.pending[0].arguments.get("text") == "b"

    model = FakeModel(
        tool_turn(
            tool_call("echo", id="a", text="a"),
            tool_call("echo", id="b", text="b"),
            tool_call("echo", id="c", text="c"),
        )
    )
    stop = finish(
        Agent(model, counted_registry(ran), stop_conditions=[StopCondition("no_b", "Dispatch", second_call)]), driver
    )
    assert isinstance(stop, AgentLoopError)
    assert stop.reason == "no_b"
    assert ran == Counter({"a": 1})
    assert [call.id for call in stop.result.pending] == ["b", "c"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_built_in_stop_of_the_same_checkpoint_wins_over_a_users(driver: str) -> None:
    """Both hold before the same model call: max_steps (built in) is tried first at ExecuteTool."""
    model = FakeModel(tool_turn(tool_call("echo", text="a")), reply("z"))
    agent = Agent(
        model, counted_registry(Counter()), max_steps=1, stop_conditions=[StopCondition("mine", "ExecuteTool", always)]
    )
    stop = finish(agent, driver)
    assert isinstance(stop, AgentLoopError)
    assert stop.reason == "max_steps"


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("how", ["ctor", "on_stop"])
def test_a_users_stop_can_return_instead_of_raise(driver: str, how: str) -> None:
    if how == "ctor":
        stop = StopCondition("mine", "Dispatch", always, policy="return")
        agent = Agent(script(), counted_registry(Counter()), stop_conditions=[stop])
    else:
        stop = StopCondition("mine", "Dispatch", always)
        agent = Agent(script(), counted_registry(Counter()), stop_conditions=[stop], on_stop={"mine": "return"})
    result = finish(agent, driver)
    assert isinstance(result, RunResult)
    assert (result.reason, result.ok) == ("mine", False)


def test_a_users_stop_may_not_finalize() -> None:
    with pytest.raises(ValueError, match="not allowed"):
        Agent(script(), counted_registry(Counter()), stop_conditions=[StopCondition("mine", "Dispatch", never)],
              on_stop={"mine": "finalize"})  # fmt: skip


@pytest.mark.parametrize("reason", sorted(BUILTIN_REASONS | {"done", "paused", "running"}))
def test_a_users_stop_named_like_a_built_in_reason_is_refused_when_the_agent_is_built(reason: str) -> None:
    with pytest.raises(ValueError, match="collides"):
        Agent(script(), counted_registry(Counter()), stop_conditions=[StopCondition(reason, "Dispatch", never)])


def test_a_users_stop_named_stop_condition_error_is_refused_when_the_agent_is_built() -> None:
    with pytest.raises(ValueError, match="collides"):
        Agent(
            script(),
            counted_registry(Counter()),
            stop_conditions=[StopCondition("stop_condition_error", "Dispatch", never)],
        )


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_users_stop_named_stop_condition_error_is_either_refused_or_reports_its_own_evidence(driver: str) -> None:
    """Accepted, it fires with condition '' and error 'None' (NoneType): its own name and description are lost."""
    try:
        agent = Agent(
            script(),
            counted_registry(Counter()),
            stop_conditions=[StopCondition("stop_condition_error", "Dispatch", always, "mine")],
        )
    except ValueError:
        return
    stop = finish(agent, driver)
    assert isinstance(stop, AgentLoopError)
    evidence: dict[str, Any] = stop.evidence
    assert evidence.get("condition") == "always"
    assert evidence.get("description") == "mine"
