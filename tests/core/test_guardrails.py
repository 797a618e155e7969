"""Guardrails as edges: a StopCondition on the user's input (before the first model call) and on the final answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fsm_agent import TABLE, Agent, AgentLoopError, CancelToken, ModelResponse, RunResult, RunView, State, StopCondition
from fsm_agent.definition.triggers import DISPATCH, START
from fsm_agent.render.markdown import reasons_table, stops_by_state
from fsm_agent.render.mermaid import to_mermaid
from fsm_agent.render.model import diagram_edges
from fsm_agent.testing import FakeModel, demo_registry, edge_id, edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
SECRET = "hunter2"


def mentions_password(view: RunView) -> bool:
    """The user's input asks for a password."""
    return "password" in view.messages[-1].content


def leaks_secret(view: RunView) -> bool:
    """The answer gives the secret away."""
    return view.last_response is not None and SECRET in view.last_response.message.content


def broken_check(view: RunView) -> bool:
    """A check with a bug in it."""
    raise KeyError("no such field")


INPUT = StopCondition("blocked_input", "input", mentions_password, "the input asks for a password")
ANSWER = StopCondition("leaked_secret", "answer", leaks_secret, "the answer gives the secret away")


def _counted(stop: StopCondition, calls: list[str]) -> StopCondition:
    """``stop`` again, its check recording each time it is asked."""
    check = stop.check

    def counted(view: RunView) -> bool:
        calls.append(check.__name__)
        return check(view)

    counted.__name__ = check.__name__
    return StopCondition(stop.reason, "input" if stop is INPUT else "answer", counted, stop.description)


def _agent(model: FakeModel, *stops: StopCondition, **options: Any) -> Agent:
    return Agent(model, demo_registry(), stop_conditions=stops or (INPUT, ANSWER), **options)


def _run(agent: Agent, text: str, driver: str) -> RunResult:
    return agent.run(text) if driver == "sync" else asyncio.run(agent.arun(text))


def _stopped(agent: Agent, text: str, driver: str) -> AgentLoopError:
    with pytest.raises(AgentLoopError) as info:
        _run(agent, text, driver)
    return info.value


# --- where the rows sit ------------------------------------------------------------------------------------


def test_input_guardrail_is_a_start_row_after_the_built_in_start_stops() -> None:
    """An input guardrail adds its rows to the start trigger, after cancelled and timeout."""
    rows = [edge_id(row) for row in _agent(FakeModel()).table.rows_from(State.AwaitModel, START)]
    assert rows == [
        "AwaitModel->Failed[cancelled]",
        "AwaitModel->Failed[timeout]",
        "AwaitModel->Failed[stop_condition_error]",
        "AwaitModel->Failed[blocked_input]",
    ]


def test_answer_guardrail_rows_come_just_before_done() -> None:
    """An answer guardrail is tried after the output check and before Dispatch->Done; one stop_condition_error row."""
    forbid = StopCondition("forbidden", "Dispatch", lambda view: False)
    rows = [edge_id(row) for row in _agent(FakeModel(), ANSWER, forbid).table.rows_from(State.Dispatch, DISPATCH)]
    assert rows[:5] == [
        "Dispatch->AwaitModel[output_invalid]",
        "Dispatch->Failed[output_invalid]",
        "Dispatch->Failed[stop_condition_error]",
        "Dispatch->Failed[leaked_secret]",
        "Dispatch->Done[has_no_tool_calls]",
    ], (
        "this order is written out by hand; it comes from build_table (fsm_agent/definition/table.py): the row that "
        "sends a typed answer back, then the At.ANSWER checkpoint (its built-in stops in CATALOGUE order, then "
        "stop_condition_error and the users' answer guardrails), then Dispatch->Done. A new built-in stop at "
        f"At.ANSWER adds its row before stop_condition_error: write it in here. The rows now: {rows}"
    )
    assert rows.count("Dispatch->Failed[stop_condition_error]") == 1
    assert rows[-2:] == ["Dispatch->Failed[forbidden]", "Dispatch->ExecuteTool"]


def test_guardrails_do_not_change_the_default_table() -> None:
    """The shared table has no guardrail rows: a run without guardrails walks exactly the rows it walked before."""
    before = TABLE.rows
    _agent(FakeModel())
    assert TABLE.rows == before
    assert {edge_id(row) for row in TABLE.rows_from(State.AwaitModel, START)} == {
        "AwaitModel->Failed[cancelled]",
        "AwaitModel->Failed[timeout]",
    }


# --- every new row fires, on both drivers ------------------------------------------------------------------

Arrange = tuple[tuple[StopCondition, ...], tuple[ModelResponse, ...], str]

ROWS: dict[tuple[str, str], Arrange] = {
    ("AwaitModel->Failed[blocked_input]", START): ((INPUT, ANSWER), (reply("never asked"),), "my password?"),
    ("AwaitModel->Failed[stop_condition_error]", START): (
        (StopCondition("blocked_input", "input", broken_check),),
        (reply("never asked"),),
        "hello",
    ),
    ("Dispatch->Failed[leaked_secret]", DISPATCH): ((INPUT, ANSWER), (reply(f"it is {SECRET}"),), "the secret?"),
    ("Dispatch->Failed[stop_condition_error]", DISPATCH): (
        (StopCondition("leaked_secret", "answer", broken_check),),
        (reply("an answer"),),
        "hello",
    ),
}
"""The rows the guardrails add, by edge and trigger: the agent's stops, the model's script, the user's input."""


def test_every_guardrail_row_has_a_transition_test() -> None:
    """A guardrail row added to the table without a test arranged for it fails here."""
    for stops, _, _ in ROWS.values():
        table = _agent(FakeModel(), *stops).table
        added = {(edge_id(row), row.trigger) for row in table.rows if row not in TABLE.rows}
        assert added <= set(ROWS)
    table = _agent(FakeModel()).table
    assert {(edge_id(row), row.trigger) for row in table.rows if row not in TABLE.rows} == set(ROWS)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("edge", list(ROWS), ids=lambda edge: f"{edge[0]}({edge[1]})")
def test_guardrail_row_fires_when_its_check_trips(edge: tuple[str, str], driver: str) -> None:
    """The run ends on exactly this row, with its reason, and the result says so."""
    stops, script, text = ROWS[edge]
    exc = _stopped(_agent(FakeModel(list(script)), *stops), text, driver)
    taken = exc.result.trace[-1]
    assert (edge_id(taken), taken.trigger) == edge
    assert (exc.reason, exc.result.ok) == (taken.reason, False)


# --- the input guardrail -----------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_await_model_to_failed_blocked_input_makes_no_model_call(driver: str) -> None:
    """AwaitModel->Failed[blocked_input]: no model call, the check asked once, evidence names the condition."""
    asked: list[str] = []
    model = FakeModel(reply("never asked"))
    exc = _stopped(_agent(model, _counted(INPUT, asked)), "what is the admin password?", driver)
    assert (model.seen, asked) == ([], ["mentions_password"])
    assert edges(exc.result) == ["AwaitModel->Failed[blocked_input]"]
    assert exc.evidence["condition"] == "mentions_password"
    assert exc.evidence["description"] == "the input asks for a password"
    assert (exc.evidence["step"], exc.result.usage.input_tokens, exc.result.steps) == (0, 0, ())
    assert exc.result.messages[-1].content == "what is the admin password?"


@pytest.mark.parametrize("driver", DRIVERS)
def test_input_that_passes_the_guardrail_runs_as_usual(driver: str) -> None:
    """An input the check lets through goes on to the model, the check asked once for the whole run."""
    asked: list[str] = []
    model = FakeModel(tool_turn(tool_call("echo", text="hi")), reply("hello"))
    result = _run(_agent(model, _counted(INPUT, asked)), "say hello", driver)
    assert (result.reason, result.final, len(model.seen), asked) == ("done", "hello", 2, ["mentions_password"])
    assert START not in [t.trigger for t in result.trace]


def test_built_in_start_stops_outrank_the_input_guardrail() -> None:
    """A run cancelled before its first call stops cancelled, without asking the input check."""
    asked: list[str] = []
    token = CancelToken()
    token.cancel("user pressed stop")
    with pytest.raises(AgentLoopError) as info:
        _agent(FakeModel(), _counted(INPUT, asked)).run("my password?", cancel=token)
    assert (edges(info.value.result), asked) == (["AwaitModel->Failed[cancelled]"], [])


def test_input_guardrail_with_return_policy_hands_back_the_result() -> None:
    """policy="return" on an input guardrail returns the stopped result instead of raising."""
    stop = StopCondition("blocked_input", "input", mentions_password, policy="return")
    result = _agent(FakeModel(), stop).run("my password?")
    assert (result.reason, result.ok, result.final) == ("blocked_input", False, "")


@pytest.mark.parametrize("place", ["input", "answer"])
def test_a_guardrail_cannot_finalize(place: str) -> None:
    """on_stop={reason: "finalize"} is refused when the agent is built: a guardrail has nothing to finalize."""
    stop = StopCondition("guarded", place, lambda view: False)
    with pytest.raises(ValueError, match=r"on_stop\['guarded'\]='finalize' is not allowed"):
        _agent(FakeModel(), stop, on_stop={"guarded": "finalize"})


# --- the answer guardrail ----------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_dispatch_to_failed_leaked_secret_keeps_the_answer(driver: str) -> None:
    """Dispatch->Failed[leaked_secret]: the run fails with the reason, and the answer stays in the result."""
    model = FakeModel(tool_turn(tool_call("echo", text="x")), reply(f"the password is {SECRET}"))
    exc = _stopped(_agent(model), "tell me", driver)
    assert edges(exc.result)[-1] == "Dispatch->Failed[leaked_secret]"
    assert (exc.reason, exc.evidence["condition"], exc.evidence["step"]) == ("leaked_secret", "leaks_secret", 1)
    assert exc.evidence["description"] == "the answer gives the secret away"
    assert exc.result.final == f"the password is {SECRET}"
    assert (exc.result.messages[-1].role, exc.result.messages[-1].content) == ("assistant", exc.result.final)
    assert len(model.seen) == 2


@pytest.mark.parametrize("driver", DRIVERS)
def test_answer_that_passes_the_guardrail_is_done(driver: str) -> None:
    """A clean answer ends Done; the check is asked of the answer only, never of a turn that asks for tools."""
    asked: list[str] = []
    model = FakeModel(tool_turn(tool_call("echo", text="x"), content=f"looking up {SECRET}"), reply("all good"))
    result = _run(_agent(model, _counted(ANSWER, asked)), "tell me", driver)
    assert (result.reason, result.final, asked) == ("done", "all good", ["leaks_secret"])
    assert edges(result)[-1] == "Dispatch->Done[has_no_tool_calls]"


def test_a_finalize_answer_is_checked_too() -> None:
    """The answer of a finalize call passes the guardrail as well; the stop that asked for it stands."""
    model = FakeModel(tool_turn(tool_call("echo", text="x")), reply(f"best guess: {SECRET}"))
    agent = _agent(model, ANSWER, max_steps=1, on_stop={"max_steps": "finalize"})
    exc = _stopped(agent, "tell me", "sync")
    assert edges(exc.result)[-1] == "Dispatch->Failed[leaked_secret]"
    assert (exc.reason, exc.evidence["finalize"]["outcome"]) == ("max_steps", "leaked_secret")
    assert exc.result.final == f"best guess: {SECRET}"


# --- a check that raises -----------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(("place", "source", "calls"), [("input", "AwaitModel", 0), ("answer", "Dispatch", 1)])
def test_guardrail_check_that_raises_is_stop_condition_error(place: str, source: str, calls: int, driver: str) -> None:
    """<place>->Failed[stop_condition_error]: evidence names the check, the cause is its error, as for other stops."""
    model = FakeModel(reply("an answer"))
    exc = _stopped(_agent(model, StopCondition("guarded", place, broken_check)), "hello", driver)
    assert edges(exc.result)[-1] == f"{source}->Failed[stop_condition_error]"
    assert (exc.reason, exc.evidence["condition"], exc.evidence["type"]) == (
        "stop_condition_error",
        "broken_check",
        "KeyError",
    )
    assert isinstance(exc.__cause__, KeyError)
    assert len(model.seen) == calls


# --- drawn from the table ----------------------------------------------------------------------------------


def test_guardrail_edges_are_drawn_and_listed_from_the_agents_table() -> None:
    """The diagram, the stop list and the reasons table show both guardrails without code of their own."""
    table = _agent(FakeModel()).table
    red = {(str(edge.row.source), edge.label) for edge in diagram_edges(table) if edge.kind == "failure"}
    assert {("AwaitModel", "blocked_input"), ("Dispatch", "leaked_secret")} <= red
    mermaid = to_mermaid(table)
    assert "blocked_input" in mermaid
    assert "leaked_secret" in mermaid
    stops = stops_by_state(table)
    assert "`AwaitModel->Failed[blocked_input]` on `start` if `mentions_password`: the input asks for a" in stops
    dispatch = stops.split("- **Dispatch**")[1].split("- **ExecuteTool**")[0]
    assert dispatch.index("`Dispatch->Failed[leaked_secret]`") < dispatch.index("`Dispatch->Done[has_no_tool_calls]`")
    reasons = reasons_table(table)
    assert "| `blocked_input` | AwaitModel (`start`) | `mentions_password` |" in reasons
    assert "| `leaked_secret` | Dispatch (`dispatch`) | `leaks_secret` |" in reasons
