"""``fsm_agent.proof.check``: termination with a bound, reachable stops, dead rows, counterexamples."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

import pytest

from fsm_agent import TABLE, Agent, AgentLoopError, SqliteStore, StopCondition, ToolRegistry
from fsm_agent.definition.guards import HOLDS
from fsm_agent.definition.states import State
from fsm_agent.definition.table import Row
from fsm_agent.proof import check
from fsm_agent.records import Message, ModelResponse
from fsm_agent.testing import FakeModel, demo_registry, edge_id, reply, tool_call, tool_turn


def another_look(run: object) -> bool:
    """A user's plain guard: nothing bounds how often it holds."""
    return True


class TwoCallsEachTurn:
    """Asks for two new echo calls every turn and never answers: the longest run under max_steps."""

    def __init__(self) -> None:
        self.n = 0

    def complete(self, messages: object, tools: object) -> ModelResponse:
        """Two calls with arguments never seen before."""
        self.n += 1
        return tool_turn(tool_call("echo", text=f"{self.n} a"), tool_call("echo", text=f"{self.n} b"))


def test_the_built_in_table_stops_within_its_max_steps_model_calls() -> None:
    """Every run of the built-in table stops; at most max_steps model calls and a finalize call (a table is checked
    with every policy an agent on it may set), whatever a reply asks for."""
    proof = check(TABLE)
    assert proof.ok
    assert proof.model_calls == 8 + 1
    assert proof.bound is None  # a reply may ask for any number of calls
    assert check(TABLE, max_steps=3).model_calls == 3 + 1


@pytest.mark.parametrize("max_steps", [1, 3, 8])
def test_the_bound_is_the_longest_run_the_engine_really_takes(max_steps: int) -> None:
    """A run asking for two new calls every turn, its finalize reply too, takes exactly the proven bound."""
    proof = check(TABLE, calls_per_reply=2, max_steps=max_steps, cycle_window=0)
    finalizing = {"max_steps": "finalize"}  # the longest runs of the table: the finalize reply asks for tools anyway
    agent = Agent(TwoCallsEachTurn(), demo_registry(), max_steps=max_steps, cycle_window=0, on_stop=finalizing)
    with pytest.raises(AgentLoopError) as stopped:
        agent.run("go on forever")
    assert stopped.value.reason == "max_steps"
    assert stopped.value.result.trace[-1].reason == "finalize_failed"
    assert len(stopped.value.result.trace) == proof.bound == 6 * max_steps + 3
    plain = Agent(TwoCallsEachTurn(), demo_registry(), max_steps=max_steps, cycle_window=0)
    assert check(plain, calls_per_reply=2).bound == 6 * max_steps  # without the policy: no finalize call


def test_a_users_unbounded_row_is_refuted_with_its_loop_as_the_counterexample() -> None:
    """Dispatch->AwaitModel on a plain function skips the max_steps check: the loop through it never ends."""
    table = TABLE.with_rows([Row(State.Dispatch, "dispatch", State.AwaitModel, guard=another_look)], [])
    proof = check(table)
    assert not proof.ok
    assert proof.bound is None
    assert proof.loop_start is not None
    loop = [edge_id(edge) for edge in proof.counterexample[proof.loop_start :]]
    assert "Dispatch->AwaitModel[another_look]" in loop
    assert not any("max_steps" in edge for edge in loop)
    assert proof.counterexample[proof.loop_start].source == proof.counterexample[-1].dest  # it closes
    assert "another_look" in proof.report()
    assert "every run stops: NO" in proof.report()


def test_a_users_row_that_stops_keeps_the_proof() -> None:
    """An opaque guard into Failed may hold or not: every run still stops."""
    table = TABLE.with_rows([Row(State.Dispatch, "dispatch", State.Failed, another_look, "looked")], ["looked"])
    proof = check(table)
    assert proof.ok
    assert "looked" in proof.reachable


def test_reasons_of_parts_an_agent_lacks_are_unreachable() -> None:
    """A plain agent cannot stop on output_invalid, hook_error, timeout or child_stopped; set up, it can."""
    plain = check(Agent(FakeModel(), demo_registry()))
    for reason in ("output_invalid", "hook_error", "timeout", "token_budget", "max_tool_calls", "child_stopped"):
        assert reason in plain.unreachable
    assert {"done", "max_steps", "repeated_action", "cycle", "tool_failures"} <= set(plain.reachable)
    child = Agent(FakeModel(), demo_registry())
    registry = demo_registry()
    registry.register(child.as_tool("helper", "asks a helper", on_child_stop="raise"))
    full = check(
        Agent(FakeModel(), registry, output_type=str, strict_hooks=True, timeout=5, token_budget=100, max_tool_calls=3)
    )
    for reason in ("output_invalid", "hook_error", "timeout", "token_budget", "max_tool_calls", "child_stopped"):
        assert reason in full.reachable


def test_dead_rows_are_the_rows_no_run_of_this_agent_can_take() -> None:
    """Without a cap the max_tool_calls row is dead; with one, it is taken."""
    dead = {edge_id(row) for row in check(Agent(FakeModel(), demo_registry())).dead_rows}
    assert "Dispatch->Failed[max_tool_calls]" in dead
    capped = {edge_id(row) for row in check(Agent(FakeModel(), demo_registry(), max_tool_calls=2)).dead_rows}
    assert "Dispatch->Failed[max_tool_calls]" not in capped


def test_a_finalize_policy_turns_the_stop_into_one_more_model_call() -> None:
    """With max_steps finalized, no run fails on max_steps and the bound counts the finalize call."""
    proof = check(Agent(FakeModel(), demo_registry(), max_steps=2, on_stop={"max_steps": "finalize"}))
    assert proof.ok
    assert "max_steps" in proof.unreachable
    assert proof.model_calls == 3
    assert "finalize_failed" in proof.reachable


def test_a_tool_call_cap_bounds_the_transitions() -> None:
    """With max_tool_calls, a reply's calls are bounded too, so the transitions are."""
    proof = check(Agent(FakeModel(), demo_registry(), max_tool_calls=3))
    assert proof.ok
    assert proof.bound is not None


def test_a_stop_conditions_reason_is_reachable() -> None:
    """A user's stop condition may hold at any check: its reason and the check's error are reachable."""
    stop = StopCondition("bored", "ExecuteTool", lambda view: False)
    proof = check(Agent(FakeModel(), demo_registry(), stop_conditions=[stop]))
    assert {"bored", "stop_condition_error"} <= set(proof.reachable)


def test_check_refuses_what_it_cannot_read() -> None:
    """Anything but an Agent or a Table, or a bad calls_per_reply, is a clear error."""
    with pytest.raises(TypeError, match="Agent or a Table"):
        check("not an agent")
    with pytest.raises(ValueError, match="calls_per_reply"):
        check(TABLE, calls_per_reply=0)


@pytest.mark.parametrize(("every", "again"), [("call", 1), ("transition", 1), ("turn", 2)])
def test_the_crash_check_matches_what_a_store_really_keeps(tmp_path: Path, every: str, again: int) -> None:
    """every='turn' is refuted (a finished call runs again after a crash); the store shows it; 'call' is safe."""
    proof = check(TABLE, every=every, calls_per_reply=2)
    assert proof.crash_safe is (again == 1)
    runs: Counter[str] = Counter()

    def act(what: str, call_id: str) -> str:
        """Counts each run of a call."""
        runs[call_id] += 1
        return what

    registry = ToolRegistry()
    registry.register(act)

    class Model:
        """Asks for both calls, and answers once it has their results (so a resumed run goes on where it was)."""

        def complete(self, messages: Sequence[Message], tools: object) -> ModelResponse:
            """The calls, or the answer."""
            if messages[-1].role == "tool":
                return reply("both done")
            return tool_turn(tool_call("act", id="a", what="one"), tool_call("act", id="b", what="two"))

    def agent() -> Agent:
        return Agent(Model(), registry)

    with SqliteStore(tmp_path / "runs.db", every=every) as store:
        run = agent().start("q", store=store, run_id="r")
        while not runs:  # up to the first call's outcome: replied, check, dispatch, then the call
            run.advance()
        stored = store.load("r")  # the process dies here, as the second call begins
    result = agent().resume(stored).finish()
    assert result.final == "both done"
    assert runs == {"a": again, "b": 1}
    if again > 1:  # the counterexample, shortest: the model's reply, unwritten, and the turn's first call
        shown = [edge_id(edge) for edge in proof.crash_counterexample]
        assert shown[:3] == ["AwaitModel->CheckTruncation", "CheckTruncation->Dispatch", "Dispatch->ExecuteTool"]
        assert proof.crash_counterexample[-1].source == "ExecuteTool"


def test_approval_safety_is_proven_from_the_hold_the_stepper_reads() -> None:
    """With the declared hold a held call never runs undecided; without it, the checker and the engine both show it."""
    runs: Counter[str] = Counter()

    def act(what: str) -> str:
        """Counts its runs."""
        runs[what] += 1
        return what

    registry = ToolRegistry()
    registry.register(act)

    def agent() -> Agent:
        return Agent(FakeModel(tool_turn(tool_call("act", what="send")), reply("sent")), registry, approve={"act"})

    proof = check(agent(), calls_per_reply=2)
    assert proof.approval_safe
    assert agent().run("q").reason == "paused"
    assert runs == {}
    with mock.patch.dict(HOLDS, {}, clear=True):
        refuted = check(agent(), calls_per_reply=2)
        assert not refuted.approval_safe
        assert refuted.approval_counterexample[-1].source == "ExecuteTool"  # the call made undecided
        assert "approval safe: NO" in refuted.report()
        assert agent().run("q").final == "sent"  # the engine reads the same hold: without it the call runs
    assert runs == {"send": 1}
    assert check(Agent(FakeModel(), demo_registry())).approval_safe  # nothing is held back without approve=
