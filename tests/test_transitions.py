"""One test per row of the transition table: put a run where the guard holds, advance once, check the edge."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fsm_agent import TABLE, Agent, AgentLoopError, Row, State
from fsm_agent.engine import AgentRun
from fsm_agent.run import signature
from fsm_agent.testing import (
    CounterModel,
    FakeModel,
    LoopingModel,
    demo_registry,
    edge_id,
    reply,
    tool_call,
    tool_turn,
)

Arrange = Callable[[], AgentRun]


def _at(state: State, responses: tuple[object, ...] = (), **counters: object) -> AgentRun:
    """A fresh run of a 3-step agent, moved to ``state`` with the given counters."""
    agent = Agent(FakeModel(list(responses)), demo_registry(), max_steps=3, max_consecutive_failures=3)
    run = agent.start("question")
    run.state = state
    for name, value in counters.items():
        if name == "pending":
            run.pending.extend(value)
        else:
            setattr(run, name, value)
    return run


ECHO = tool_call("echo", id="e1", text="hi")
ECHO2 = tool_call("echo", id="e2", text="again")
FAIL = tool_call("fail", id="f1", reason="nope")

ARRANGE: dict[str, Arrange] = {
    "AwaitModel->Failed[model_error]": lambda: _at(State.AwaitModel, (RuntimeError("provider down"),)),
    "AwaitModel->CheckTruncation": lambda: _at(State.AwaitModel, (reply("hello"),)),
    "CheckTruncation->Failed[max_tokens]": lambda: _at(
        State.CheckTruncation, turns=1, last_response=reply("half an ans", stop_reason="max_tokens")
    ),
    "CheckTruncation->Failed[refusal]": lambda: _at(
        State.CheckTruncation, turns=1, last_response=reply("I can't help", stop_reason="refusal")
    ),
    "CheckTruncation->Dispatch": lambda: _at(State.CheckTruncation, turns=1, last_response=reply("fine")),
    "Dispatch->Done[has_no_tool_calls]": lambda: _at(State.Dispatch, turns=1, last_response=reply("42")),
    "Dispatch->Failed[repeated_action]": lambda: _at(
        State.Dispatch, turns=2, last_response=tool_turn(ECHO), pending=[ECHO], last_signature=signature(ECHO)
    ),
    "Dispatch->ExecuteTool": lambda: _at(State.Dispatch, turns=1, last_response=tool_turn(ECHO), pending=[ECHO]),
    "ExecuteTool->Failed[tool_failures]": lambda: _at(State.ExecuteTool, turns=1, pending=[FAIL], failures=2),
    "ExecuteTool->Dispatch[has_pending_calls]": lambda: _at(State.ExecuteTool, turns=1, pending=[ECHO, ECHO2]),
    "ExecuteTool->Failed[max_steps]": lambda: _at(State.ExecuteTool, turns=3, pending=[ECHO]),
    "ExecuteTool->AwaitModel": lambda: _at(State.ExecuteTool, turns=1, pending=[ECHO]),
}


def test_every_row_has_a_transition_test() -> None:
    """Adding a row to the table without arranging a test for it fails here."""
    assert sorted(ARRANGE) == sorted(edge_id(row) for row in TABLE.rows)


@pytest.mark.parametrize("row", TABLE.rows, ids=edge_id)
def test_row_fires_when_its_guard_holds(row: Row) -> None:
    """From the row's source, with its guard true and every earlier guard false, advance takes exactly this row."""
    run = ARRANGE[edge_id(row)]()
    taken = run.advance()
    assert (taken.source, taken.trigger, taken.dest, taken.guard, taken.reason) == (
        row.source,
        row.trigger,
        row.dest,
        row.guard_name,
        row.reason,
    )
    assert run.state is row.dest
    if row.dest is State.Failed:
        assert run.result.reason == row.reason
        assert run.result.ok is False
        assert "step" in run.result.evidence


def test_truncation_outranks_tool_calls() -> None:
    """CheckTruncation->Failed[max_tokens] wins even when the cut reply also asks for tools."""
    cut = tool_turn(ECHO, content="let me")
    cut = type(cut)(cut.message, "max_tokens")
    run = _at(State.CheckTruncation, turns=1, last_response=cut, pending=[ECHO])
    assert edge_id(run.advance()) == "CheckTruncation->Failed[max_tokens]"
    assert run.result.final == "let me"


def test_failures_outrank_pending_calls_and_max_steps() -> None:
    """ExecuteTool->Failed[tool_failures] is tried before more calls of the turn and before max_steps."""
    run = _at(State.ExecuteTool, turns=3, pending=[FAIL, ECHO], failures=2)
    assert edge_id(run.advance()) == "ExecuteTool->Failed[tool_failures]"
    assert run.result.pending == (ECHO,)


def test_pending_calls_outrank_max_steps() -> None:
    """The calls of the last allowed turn all run before max_steps stops the run."""
    run = _at(State.ExecuteTool, turns=3, pending=[ECHO, ECHO2])
    assert edge_id(run.advance()) == "ExecuteTool->Dispatch[has_pending_calls]"


def test_final_answer_outranks_repeat_check() -> None:
    """Dispatch->Done is the first row of Dispatch: an answer that arrived is never thrown away."""
    run = _at(State.Dispatch, turns=3, last_response=reply("done"), last_signature=signature(ECHO))
    assert edge_id(run.advance()) == "Dispatch->Done[has_no_tool_calls]"


def _trace_of(go: Callable[[], object]) -> list[str]:
    try:
        result = go()
    except AgentLoopError as exc:
        result = exc.result
    return [edge_id(t) for t in result.trace]


def test_every_row_fires_in_some_end_to_end_scenario() -> None:
    """The seed's scenarios plus a model failure, a refusal and a multi-call turn together use every row."""
    registry = demo_registry()
    scenarios = [
        lambda: Agent(CounterModel(), registry, max_steps=3).run("go"),
        lambda: Agent(LoopingModel(ECHO), registry).run("go"),
        lambda: Agent(FakeModel([reply("cut", stop_reason="max_tokens")]), registry).run("go"),
        lambda: Agent(FakeModel([reply("no", stop_reason="refusal")]), registry).run("go"),
        lambda: Agent(FakeModel([tool_turn(FAIL, tool_call("nope"), tool_call("add", a="1", b=2))]), registry).run(
            "go"
        ),
        lambda: Agent(FakeModel([tool_turn(ECHO, ECHO2), reply("ok")]), registry).run("go"),
        lambda: Agent(FakeModel([]), registry).run("go"),
    ]
    seen = {edge for go in scenarios for edge in _trace_of(go)}
    assert seen == {edge_id(row) for row in TABLE.rows}
