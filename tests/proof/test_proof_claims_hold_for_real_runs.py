"""``check``'s claims held to real runs the fuzz does not make: sub-agents two levels deep under a parent's cap
(``calls_per_reply`` left to the cap), guardrail stop conditions, a cost budget, and clear errors for bad input."""

from __future__ import annotations

from typing import Any

import pytest
from support.proof_audit import ByTurn, ended, ending, hold_to

from fsm_agent import TABLE, Agent, StopCondition, ToolRegistry, Usage
from fsm_agent.core.pricing import Price
from fsm_agent.definition.views import RunView
from fsm_agent.proof import check
from fsm_agent.records import ModelResponse
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn


def _registry(counted: list[str]) -> ToolRegistry:
    registry = ToolRegistry()

    def note(what: str) -> str:
        """Notes its runs; a new result for each argument."""
        counted.append(what)
        return f"noted {what}"

    registry.register(note)
    return registry


def _nested(counted: list[str]) -> tuple[Agent, ByTurn]:
    """A parent (cap 4 tool calls, 3 turns) over a child over a grandchild; every level asks for calls each turn.

    Each reply of the parent and the child asks for its sub-agent and a note; the grandchild makes two notes.
    The sub-agents' calls count towards the parent's cap, so the run stops on it after few calls of its own.
    """

    def grand_turns(n: int) -> ModelResponse:
        return tool_turn(tool_call("note", what=f"g{n}")) if n < 2 else reply("grand done")

    def child_turns(n: int) -> ModelResponse:
        if n < 2:
            return tool_turn(tool_call("grand", input=f"c{n}"), tool_call("note", what=f"c{n}"))
        return reply("child done")

    def parent_turns(n: int) -> ModelResponse:
        if n < 3:
            return tool_turn(tool_call("child", input=f"p{n}"), tool_call("note", what=f"p{n}"))
        return reply("parent done")

    grand = Agent(ByTurn(grand_turns), _registry(counted), max_steps=3)
    child_tools = _registry(counted)
    child_tools.register(grand.as_tool("grand", "asks the grandchild", on_child_stop="raise"))
    child = Agent(ByTurn(child_turns), child_tools, max_steps=3)
    tools = _registry(counted)
    tools.register(child.as_tool("child", "asks the child"))
    model = ByTurn(parent_turns)
    return Agent(model, tools, max_steps=3, max_tool_calls=4), model


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_parent_over_two_levels_of_sub_agents_stays_within_its_proof(driver: str) -> None:
    """Sub-agents nested two deep fill the parent's cap: the run's own model calls, transitions, ending and rows
    stay within the proof computed with the default ``calls_per_reply`` (the cap plus one)."""
    proof = check(_nested([])[0])
    assert proof.bound is not None  # the cap bounds the replies' calls
    counted: list[str] = []
    agent, model = _nested(counted)
    result = ended(agent, driver)
    assert ending(result) == "max_tool_calls"
    assert len(counted) <= 4  # the cap holds across the levels
    hold_to(proof, result, model.calls)


def _guarded(trip: str) -> Agent:
    def bad_input(view: RunView) -> bool:
        """The question is refused before any model call."""
        return trip == "input"

    def bad_answer(view: RunView) -> bool:
        """The final answer is refused."""
        return trip == "answer"

    stops = [StopCondition("bad_input", "input", bad_input), StopCondition("bad_answer", "answer", bad_answer)]
    return Agent(FakeModel(reply("an answer")), demo_registry(), max_steps=2, stop_conditions=stops)


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("trip", ["input", "answer"])
def test_a_guardrail_that_trips_ends_the_run_on_a_reachable_edge(trip: str, driver: str) -> None:
    """An ``input`` guardrail stops on ``start`` without a model call, an ``answer`` one before Done: both endings
    are reachable, and the run stays within the proof."""
    agent = _guarded(trip)
    proof = check(agent)
    result = ended(agent, driver)
    assert ending(result) == f"bad_{trip}"
    calls = 0 if trip == "input" else 1
    assert len([m for m in result.messages if m.role == "assistant"]) == calls
    hold_to(proof, result, calls)


def _costly(**options: Any) -> tuple[Agent, ByTurn]:
    usage = Usage(10, 10)

    def turns(n: int) -> ModelResponse:
        if n >= 1 and options.get("on_stop"):  # the finalize call (offered no tools) answers
            return reply("what I have", usage=usage)
        return tool_turn(tool_call("add", a=n, b=n), usage=usage)

    model = ByTurn(turns)
    price = Price(input_per_mtok=1000, output_per_mtok=1000)  # 20 tokens: 2 cents a call
    return Agent(model, demo_registry(), max_steps=4, cost_budget=0.01, prices=price, **options), model


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_spent_cost_budget_ends_the_run_on_a_reachable_edge(driver: str) -> None:
    """The first call's cost passes the budget: the run stops on ``cost_budget``, which the proof says can happen."""
    agent, model = _costly()
    proof = check(agent)
    result = ended(agent, driver)
    assert ending(result) == "cost_budget"
    hold_to(proof, result, model.calls)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_finalized_cost_budget_ends_on_done_and_is_called_unreachable(driver: str) -> None:
    """Under a finalize policy the run ends on the ``done`` edge (its reason still ``cost_budget``), one more call."""
    agent, model = _costly(on_stop={"cost_budget": "finalize"})
    proof = check(agent)
    assert "cost_budget" in proof.unreachable
    result = ended(agent, driver)
    assert result.reason == "cost_budget"
    assert result.final == "what I have"
    assert model.calls == 2
    hold_to(proof, result, model.calls)


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"calls_per_reply": -1}, ValueError, "calls_per_reply must be None or an integer >= 1, got -1"),
        ({"calls_per_reply": True}, ValueError, "calls_per_reply must be None or an integer >= 1, got True"),
        ({"calls_per_reply": 2.0}, ValueError, "calls_per_reply must be None or an integer >= 1, got 2.0"),
        ({"calls_per_reply": "2"}, ValueError, "calls_per_reply must be None or an integer >= 1, got '2'"),
        ({"every": "always"}, ValueError, "every must be 'transition', 'call' or 'turn', got 'always'"),
        ({"every": None}, ValueError, "every must be 'transition', 'call' or 'turn', got None"),
        ({"max_steps": 0}, ValueError, "max_steps must be an integer >= 1, got 0"),
        ({"max_tool_calls": -1}, ValueError, "max_tool_calls must be an integer >= 0, got -1"),
        ({"timeout": float("nan")}, ValueError, "timeout must be a finite number of seconds > 0, got nan"),
    ],
)
def test_bad_arguments_to_check_are_named_in_the_error(
    kwargs: dict[str, Any], error: type[Exception], says: str
) -> None:
    """A wrong ``calls_per_reply``, ``every`` or limit override: a specific error naming the argument and value."""
    for target in (TABLE, Agent(FakeModel(), demo_registry())):
        with pytest.raises(error) as raised:
            check(target, **kwargs)
        assert str(raised.value) == says


@pytest.mark.parametrize("target", [Agent, None, 3, TABLE.rows, "agent"])
def test_anything_but_an_agent_or_a_table_is_a_type_error_naming_its_type(target: object) -> None:
    """The class itself, a tuple of rows, a string: each refused with its type named."""
    with pytest.raises(TypeError, match=f"check takes an Agent or a Table, got {type(target).__name__}$"):
        check(target)
