"""The compiled fires (``core.firing``) take the row ``first_row`` takes, and each guard they test in line is its guard.

The stepper fires every transition through functions generated from a run's
rows, with the one-expression guards written into them (``core.inlining``);
the walk everything else uses (lookahead, batch planning, the differential
tests against the ``transitions`` library) is ``first_row`` over the same
rows.  These tests hold the two together for generated run states.
"""

from __future__ import annotations

import inspect
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm_agent import Agent, CancelToken, Message, ModelResponse, ToolCall, ToolRegistry, Usage
from fsm_agent.core.firing import fires_for
from fsm_agent.core.inlining import inline_expression
from fsm_agent.definition import guards
from fsm_agent.definition.run import Run, signature
from fsm_agent.definition.states import TERMINAL
from fsm_agent.definition.table import first_row
from fsm_agent.errors import ContextOverflowError
from fsm_agent.testing import FakeModel, demo_registry

SETUPS: dict[str, dict[str, Any]] = {
    "bare": {},
    "every limit": {"timeout": 5, "token_budget": 50, "max_tool_calls": {"echo": 2, "*": 3}, "cycle_window": 6},
    "an int cap, no cycle guard": {"max_tool_calls": 2, "cycle_window": 0},
    "strict hooks": {"strict_hooks": True},
}

states = st.fixed_dictionaries(
    {
        "turns": st.integers(0, 6),
        "failures": st.integers(0, 4),
        "pending": st.integers(0, 3),
        "same_call": st.booleans(),
        "tokens": st.sampled_from([0, 60]),
        "elapsed": st.sampled_from([0.0, 10.0]),
        "stop": st.sampled_from(["end_turn", "max_tokens", "refusal", None]),
        "cycle": st.booleans(),
        "cancelled": st.booleans(),
        "errors": st.booleans(),
        "finalizing": st.booleans(),
    }
)


def _shape(run: Run, facts: dict[str, Any]) -> None:
    """Give ``run`` the counters, calls and flags of ``facts`` (any state; the guards only read them)."""
    run.turns, run.failures, run.input_tokens = facts["turns"], facts["failures"], facts["tokens"]
    run.elapsed = facts["elapsed"]
    same = facts["same_call"]
    calls = [ToolCall(f"c{i}", "echo", {"text": "same" if same else str(i)}) for i in range(facts["pending"])]
    run.pending.extend(calls)
    run.last_signature = signature(calls[0]) if calls and same else None
    if facts["stop"] is not None:
        run.last_response = ModelResponse(Message("assistant", "x", tuple(calls)), facts["stop"], Usage(1, 2))
    pattern = ["a", "b", "a", "b"] if facts["cycle"] else ["a", "b", "c", "d"]
    for name in pattern:
        run.recent.append(((name, "{}"), '"r"'))
    run.calls_by_tool["echo"] = facts["turns"] // 2
    run.tool_calls = facts["turns"]
    run.cancelled = facts["cancelled"]
    if facts["errors"]:
        run.model_exception = ContextOverflowError("too long")
        run.hook_error = RuntimeError("hook")
        run.child_stop = {"reason": "max_steps"}
        run.output_problem = (("bad",), True)
    run.finalizing = "max_steps" if facts["finalizing"] else None


GUARDS = [g for g in vars(guards).values() if inspect.isfunction(g) and g.__module__ == guards.__name__]
INLINED = {guard: expression for guard in GUARDS if (expression := inline_expression(guard)) is not None}


def test_every_built_in_guard_of_one_return_is_written_in_line_and_no_other_function() -> None:
    """The guards read from source are exactly those of one ``return`` over ``run``; the others are called."""
    called = {"cap_reached", "tool_calls_exhausted", "find_cycle", "dormant_guards"}
    assert {guard.__name__ for guard in GUARDS} - {guard.__name__ for guard in INLINED} == called
    assert INLINED[guards.has_pending_calls] == "run.pending"  # bool(...) dropped: the fire's ``if`` asks for truth
    assert "guards.find_cycle(run.recent)" in INLINED[guards.is_cycling]  # what a test patches is what runs
    assert inline_expression(lambda run: run.cancelled) is None  # a user's guard is always called


@settings(max_examples=150, deadline=None, derandomize=True)
@given(setup=st.sampled_from(sorted(SETUPS)), facts=states)
def test_each_inline_guard_is_true_exactly_when_its_guard_is(setup: str, facts: dict[str, Any]) -> None:
    """Each expression read from a guard, evaluated as the compiled fires do, gives the guard's own answer."""
    agent = Agent(FakeModel(), demo_registry(), max_steps=5, **SETUPS[setup])
    run = agent.start("q").position
    _shape(run, facts)
    for guard, expression in INLINED.items():
        assert bool(eval(expression, {"run": run, "guards": guards})) == bool(guard(run)), guard.__name__


@settings(max_examples=150, deadline=None, derandomize=True)
@given(setup=st.sampled_from(sorted(SETUPS)), cancellable=st.booleans(), facts=states)
def test_a_compiled_fire_takes_the_row_first_row_takes(setup: str, cancellable: bool, facts: dict[str, Any]) -> None:
    """For every state and trigger of a run's rows, the compiled fire moves along the row ``first_row`` finds."""
    agent = Agent(FakeModel(), demo_registry(), max_steps=5, **SETUPS[setup])
    for state, trigger in agent.start("q").position.rows:
        if state in TERMINAL:
            continue  # resume rows are taken by Agent.resume through first_row, never by a fire
        handle = agent.start("q", cancel=CancelToken() if cancellable else None)
        run = handle.position
        _shape(run, facts)
        run.state = state
        expected = first_row(run, trigger)
        fire = fires_for(run.rows).get((state, trigger))
        assert fire is not None
        if expected is None:
            continue  # a guard-only trigger none of whose rows holds: fired only after checking one does
        assert fire(handle.stepper, run) == expected.entry, f"{setup}: {state} on {trigger}"  # no finalize policies


def test_the_rows_of_runs_set_up_alike_are_compiled_once() -> None:
    """Kept by the identity of the rows: runs set up alike share their rows, so a run looks its fires up."""
    agent = Agent(FakeModel(), ToolRegistry())
    rows = agent.start("q").position.rows
    assert fires_for(rows) is fires_for(rows)
    assert agent.start("q").position.rows is rows
