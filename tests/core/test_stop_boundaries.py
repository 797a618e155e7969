"""Every limit at its boundary, on both drivers: the edge taken, its evidence, and the tool calls actually made.

Each tool counts its executions, so a test asserts that no call ran that the
stop should have prevented, and that none ran twice.  The async driver runs
a turn's calls as a parallel batch; the sync driver one at a time.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, CancelToken, Message, ModelResponse, RunResult, ToolRegistry, Usage
from fsm_agent.testing import FakeModel, ManualClock, edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


def counted_registry(ran: Counter[str]) -> ToolRegistry:
    """``echo``, ``add`` and ``fail`` like ``demo_registry``, each execution counted in ``ran`` by call text."""
    registry = ToolRegistry()

    @registry.register
    def echo(text: str) -> str:
        """Return the text unchanged."""
        ran[f"echo:{text}"] += 1
        return text

    @registry.register
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        ran[f"add:{a}+{b}"] += 1
        return a + b

    @registry.register
    def fail(reason: str = "always fails") -> dict[str, str]:
        """Report an error, every time."""
        ran[f"fail:{reason}"] += 1
        return {"error": reason}

    return registry


def finish(agent: Agent, driver: str, **options: Any) -> RunResult | AgentLoopError:
    """Run ``agent`` on ``driver``; the result, or the ``AgentLoopError`` the run raised."""
    try:
        if driver == "sync":
            return agent.run("go", **options)
        return asyncio.run(agent.arun("go", **options))
    except AgentLoopError as stop:
        return stop


def stopped(agent: Agent, driver: str, **options: Any) -> AgentLoopError:
    outcome = finish(agent, driver, **options)
    assert isinstance(outcome, AgentLoopError), f"expected a stop, the run ended {outcome.reason!r}"
    assert outcome.evidence == outcome.result.evidence
    assert outcome.result.reason == outcome.reason
    assert outcome.result.ok is False
    return outcome


def finished(agent: Agent, driver: str, **options: Any) -> RunResult:
    outcome = finish(agent, driver, **options)
    assert isinstance(outcome, RunResult), f"expected a result, the run stopped: {outcome}"
    return outcome


def facts(stop: AgentLoopError) -> dict[str, Any]:
    """The evidence without ``counters``, which every test checks separately."""
    return {key: value for key, value in stop.evidence.items() if key != "counters"}


# --- max_steps ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_ExecuteTool_to_Failed_max_steps_after_exactly_max_steps_turns_and_the_next_call_never_made(
    driver: str,
) -> None:
    ran: Counter[str] = Counter()
    model = FakeModel([tool_turn(tool_call("echo", text=f"t{n}")) for n in range(3)] + [reply("never")])
    stop = stopped(Agent(model, counted_registry(ran), max_steps=3), driver)
    assert stop.reason == "max_steps"
    assert edges(stop.result)[-1] == "ExecuteTool->Failed[max_steps]"
    assert facts(stop) == {"step": 2, "turns": 3, "limit": 3}
    assert stop.evidence["counters"]["steps"] == [3, 3]
    assert len(model.seen) == 3
    assert ran == Counter({"echo:t0": 1, "echo:t1": 1, "echo:t2": 1})
    assert [step.kind for step in stop.result.steps] == ["tool_call"] * 3


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_answer_in_the_last_allowed_turn_is_Done_not_max_steps(driver: str) -> None:
    model = FakeModel(tool_turn(tool_call("echo", text="a")), reply("the answer"))
    result = finished(Agent(model, counted_registry(Counter()), max_steps=2), driver)
    assert (result.reason, result.final, result.ok) == ("done", "the answer", True)


@pytest.mark.parametrize("driver", DRIVERS)
def test_max_steps_runs_every_call_of_the_last_allowed_turn_before_stopping(driver: str) -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(tool_turn(tool_call("echo", text="a"), tool_call("echo", text="b"), tool_call("add", a=1, b=2)))
    stop = stopped(Agent(model, counted_registry(ran), max_steps=1), driver)
    assert stop.reason == "max_steps"
    assert ran == Counter({"echo:a": 1, "echo:b": 1, "add:1+2": 1})
    assert [m.role for m in stop.result.messages] == ["user", "assistant", "tool", "tool", "tool"]
    assert stop.result.pending == ()


# --- token_budget ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(("spent", "stops"), [(999, False), (1000, True), (1001, True)])
def test_token_budget_stops_before_the_next_model_call_once_reached_not_before(
    driver: str, spent: int, stops: bool
) -> None:
    model = FakeModel(
        tool_turn(tool_call("echo", text="a"), usage=Usage(spent - 100, 100)), reply("fin", usage=Usage(5, 5))
    )
    outcome = finish(Agent(model, counted_registry(Counter()), token_budget=1000), driver)
    if not stops:
        assert isinstance(outcome, RunResult)
        assert outcome.reason == "done"
        assert outcome.usage.input_tokens + outcome.usage.output_tokens == spent + 10
        return
    assert isinstance(outcome, AgentLoopError)
    assert edges(outcome.result)[-1] == "ExecuteTool->Failed[token_budget]"
    assert facts(outcome) == {
        "step": 0,
        "tokens": spent,
        "budget": 1000,
        "input_tokens": spent - 100,
        "output_tokens": 100,
    }
    assert outcome.evidence["counters"]["tokens"] == [spent, 1000]
    assert (outcome.result.usage.input_tokens, outcome.result.usage.output_tokens) == (spent - 100, 100)
    assert len(model.seen) == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_token_budget_lets_the_whole_batch_run_and_an_answer_over_budget_is_still_an_answer(driver: str) -> None:
    """The budget is checked before a model call only: every call of the turn runs, and a final reply is kept."""
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(tool_call("echo", text="a"), tool_call("echo", text="b"), usage=Usage(10, 10)),
        reply("over budget but final", usage=Usage(5000, 5000)),
    )
    result = finished(Agent(model, counted_registry(ran), token_budget=21), driver)
    assert result.final == "over budget but final"
    assert ran == Counter({"echo:a": 1, "echo:b": 1})


# --- max_consecutive_failures -------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_success_between_failures_resets_the_count(driver: str) -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(tool_call("fail", reason="r1"), tool_call("fail", reason="r2")),
        tool_turn(tool_call("echo", text="ok")),
        tool_turn(tool_call("fail", reason="r3"), tool_call("fail", reason="r4")),
        reply("survived"),
    )
    result = finished(Agent(model, counted_registry(ran), max_consecutive_failures=3), driver)
    assert result.final == "survived"
    assert sum(ran.values()) == 5


@pytest.mark.parametrize("driver", DRIVERS)
def test_ExecuteTool_to_Failed_tool_failures_across_turns_with_the_last_error(driver: str) -> None:
    model = FakeModel([tool_turn(tool_call("fail", reason=f"quota {n}")) for n in range(3)] + [reply("never")])
    stop = stopped(Agent(model, counted_registry(Counter()), max_consecutive_failures=3), driver)
    assert edges(stop.result)[-1] == "ExecuteTool->Failed[tool_failures]"
    assert facts(stop) == {"step": 2, "failures": 3, "limit": 3, "last_error": "quota 2"}
    assert stop.evidence["counters"]["failures"] == [3, 3]
    assert len(model.seen) == 3


def test_tool_failures_inside_one_batch_sync_leaves_the_rest_of_the_turn_pending_and_unrun() -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(
            tool_call("fail", id="f1", reason="r1"),
            tool_call("fail", id="f2", reason="r2"),
            tool_call("fail", id="f3", reason="r3"),
            tool_call("echo", id="e4", text="later"),
        )
    )
    stop = stopped(Agent(model, counted_registry(ran)), "sync")
    assert stop.reason == "tool_failures"
    assert facts(stop) == {"step": 0, "failures": 3, "limit": 3, "last_error": "r3"}
    assert [call.id for call in stop.result.pending] == ["e4"]
    assert ran["echo:later"] == 0


def test_tool_failures_inside_one_parallel_batch_keeps_the_later_call_that_already_ran() -> None:
    """Async: the call after the third failure ran in the same batch; it is recorded and named, not dropped."""
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(
            tool_call("fail", id="f1", reason="r1"),
            tool_call("fail", id="f2", reason="r2"),
            tool_call("fail", id="f3", reason="r3"),
            tool_call("echo", id="e4", text="later"),
        )
    )
    stop = stopped(Agent(model, counted_registry(ran)), "async")
    assert stop.reason == "tool_failures"
    assert stop.evidence["failures"] == 3
    assert stop.evidence["last_error"] == "r3"
    assert stop.evidence["also_ran"] == ["e4"]
    assert stop.result.pending == ()
    assert ran["echo:later"] == 1
    tool_messages = {m.tool_call_id: m.content for m in stop.result.messages if m.role == "tool"}
    assert tool_messages["e4"] == '"later"'
    assert len(stop.result.steps) == 4


# --- max_tool_calls -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("caps", "made", "evidence"),
    [
        (0, [], {"tool": "echo", "scope": "*", "used": 0, "limit": 0}),
        (2, ["echo:a", "add:1+1"], {"tool": "echo", "scope": "*", "used": 2, "limit": 2}),
        ({"echo": 1}, ["echo:a", "add:1+1"], {"tool": "echo", "scope": "echo", "used": 1, "limit": 1}),
        ({"echo": 5, "*": 2}, ["echo:a", "add:1+1"], {"tool": "echo", "scope": "*", "used": 2, "limit": 2}),
        ({"add": 0}, ["echo:a"], {"tool": "add", "scope": "add", "used": 0, "limit": 0}),
    ],
)
def test_Dispatch_to_Failed_max_tool_calls_never_makes_the_call_past_the_cap(
    driver: str, caps: Any, made: list[str], evidence: dict[str, Any]
) -> None:
    ran: Counter[str] = Counter()
    calls = (
        tool_call("echo", id="c1", text="a"),
        tool_call("add", id="c2", a=1, b=1),
        tool_call("echo", id="c3", text="b"),
    )
    model = FakeModel(tool_turn(*calls), reply("never"))
    stop = stopped(Agent(model, counted_registry(ran), max_tool_calls=caps), driver)
    assert edges(stop.result)[-1] == "Dispatch->Failed[max_tool_calls]"
    assert facts(stop) == {"step": 0, **evidence}
    assert ran == Counter(dict.fromkeys(made, 1))
    assert [call.id for call in stop.result.pending] == [c.id for c in calls][len(made) :]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_per_tool_cap_counts_calls_of_earlier_turns(driver: str) -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(tool_call("echo", text="a"), tool_call("add", a=1, b=2)),
        tool_turn(tool_call("add", a=2, b=2), tool_call("echo", text="b")),
        reply("never"),
    )
    stop = stopped(Agent(model, counted_registry(ran), max_tool_calls={"echo": 1}), driver)
    assert facts(stop) == {"step": 1, "tool": "echo", "scope": "echo", "used": 1, "limit": 1}
    assert ran == Counter({"echo:a": 1, "add:1+2": 1, "add:2+2": 1})


# --- repeated_action ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_Dispatch_to_Failed_repeated_action_on_the_same_call_in_the_next_turn_keys_in_any_order(driver: str) -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(tool_call("add", id="k1", a=1, b=2)), tool_turn(tool_call("add", id="k2", b=2, a=1)), reply("never")
    )
    stop = stopped(Agent(model, counted_registry(ran)), driver)
    assert edges(stop.result)[-1] == "Dispatch->Failed[repeated_action]"
    assert facts(stop) == {
        "step": 1,
        "signature": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
        "tool_call_id": "k2",
    }
    assert [call.id for call in stop.result.pending] == ["k2"]
    assert ran == Counter({"add:1+2": 1})


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_same_call_twice_inside_one_batch_runs_once_and_leaves_the_rest_pending(driver: str) -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(
            tool_call("echo", id="s1", text="q"),
            tool_call("echo", id="s2", text="q"),
            tool_call("echo", id="s3", text="r"),
        )
    )
    stop = stopped(Agent(model, counted_registry(ran)), driver)
    assert stop.reason == "repeated_action"
    assert stop.evidence["tool_call_id"] == "s2"
    assert [call.id for call in stop.result.pending] == ["s2", "s3"]
    assert ran == Counter({"echo:q": 1})


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_call_repeated_but_not_adjacent_is_no_repeated_action(driver: str) -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(tool_call("echo", text="q"), tool_call("echo", text="r"), tool_call("echo", text="q")), reply("fine")
    )
    assert finished(Agent(model, counted_registry(ran)), driver).final == "fine"
    assert ran == Counter({"echo:q": 2, "echo:r": 1})


@pytest.mark.parametrize("driver", DRIVERS)
def test_arguments_spelled_as_the_same_float_are_the_same_call(driver: str) -> None:
    """1.5 and 1.50 (and 1e0 and 1.0) are the same float once parsed: a repeat."""
    model = FakeModel(tool_turn(tool_call("add", a=1.50, b=1e0)), tool_turn(tool_call("add", a=1.5, b=1.0)))
    assert stopped(Agent(model, counted_registry(Counter())), driver).reason == "repeated_action"


@pytest.mark.parametrize("driver", DRIVERS)
def test_arguments_that_differ_as_1_and_1_point_0_are_two_calls(driver: str) -> None:
    """The tool receives an int, then a float, and may answer them differently: no repeat (limits-and-policies.md)."""
    ran: Counter[str] = Counter()
    model = FakeModel(tool_turn(tool_call("add", a=1, b=2)), tool_turn(tool_call("add", a=1.0, b=2.0)), reply("x"))
    assert finished(Agent(model, counted_registry(ran)), driver).final == "x"
    assert sum(ran.values()) == 2


# --- cycle --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_ExecuteTool_to_Failed_cycle_right_after_the_fourth_call_of_A_B_A_B(driver: str) -> None:
    ran: Counter[str] = Counter()
    a, b = tool_turn(tool_call("echo", text="A")), tool_turn(tool_call("echo", text="B"))
    model = FakeModel(a, b, a, b, reply("never"))
    stop = stopped(Agent(model, counted_registry(ran)), driver)
    assert edges(stop.result)[-1] == "ExecuteTool->Failed[cycle]"
    assert facts(stop) == {
        "step": 3,
        "period": 2,
        "calls": [{"name": "echo", "arguments": {"text": "A"}}, {"name": "echo", "arguments": {"text": "B"}}],
        "window": 6,
    }
    assert ran == Counter({"echo:A": 2, "echo:B": 2})
    assert len(model.seen) == 4


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(("window", "caught"), [(6, True), (5, False), (4, False), (0, False)])
def test_a_period_3_cycle_needs_a_window_of_6(driver: str, window: int, caught: bool) -> None:
    turns = [tool_turn(tool_call("echo", text=t)) for t in "ABCABC"]
    outcome = finish(Agent(FakeModel([*turns, reply("end")]), counted_registry(Counter()), cycle_window=window), driver)
    if caught:
        assert isinstance(outcome, AgentLoopError)
        assert (outcome.reason, outcome.evidence["period"], outcome.evidence["window"]) == ("cycle", 3, 6)
    else:
        assert isinstance(outcome, RunResult)
        assert outcome.final == "end"


@pytest.mark.parametrize("driver", DRIVERS)
def test_cycle_window_0_switches_the_cycle_stop_off(driver: str) -> None:
    a, b = tool_turn(tool_call("echo", text="A")), tool_turn(tool_call("echo", text="B"))
    result = finished(
        Agent(FakeModel(a, b, a, b, a, reply("end")), counted_registry(Counter()), cycle_window=0), driver
    )
    assert result.final == "end"


def test_a_cycle_completed_inside_a_sync_batch_leaves_the_rest_of_the_turn_unrun() -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(tool_call("echo", id="a1", text="a"), tool_call("echo", id="b1", text="b")),
        tool_turn(
            tool_call("echo", id="a2", text="a"),
            tool_call("echo", id="b2", text="b"),
            tool_call("echo", id="c2", text="c"),
        ),
    )
    stop = stopped(Agent(model, counted_registry(ran)), "sync")
    assert stop.reason == "cycle"
    assert [call.id for call in stop.result.pending] == ["c2"]
    assert ran["echo:c"] == 0


def test_a_cycle_completed_inside_a_parallel_batch_keeps_the_call_that_already_ran() -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(tool_call("echo", id="a1", text="a"), tool_call("echo", id="b1", text="b")),
        tool_turn(
            tool_call("echo", id="a2", text="a"),
            tool_call("echo", id="b2", text="b"),
            tool_call("echo", id="c2", text="c"),
        ),
    )
    stop = stopped(Agent(model, counted_registry(ran)), "async")
    assert stop.reason == "cycle"
    assert stop.evidence["also_ran"] == ["c2"]
    assert stop.result.pending == ()
    assert ran["echo:c"] == 1
    assert [m.tool_call_id for m in stop.result.messages if m.role == "tool"] == ["a1", "b1", "a2", "b2", "c2"]


# --- what the reply says: truncation and refusal -------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_CheckTruncation_to_Failed_max_tokens_keeps_the_cut_text_its_tokens_and_never_runs_its_calls(
    driver: str,
) -> None:
    ran: Counter[str] = Counter()
    calls = (tool_call("echo", id="t1", text="x"), tool_call("echo", id="t2", text="y"))
    cut = ModelResponse(Message("assistant", "The flights are AF", calls), "max_tokens", Usage(30, 12))
    stop = stopped(
        Agent(FakeModel(tool_turn(tool_call("echo", text="first"), usage=Usage(1, 2)), cut), counted_registry(ran)),
        driver,
    )
    assert edges(stop.result)[-1] == "CheckTruncation->Failed[max_tokens]"
    assert stop.evidence["partial_chars"] == len("The flights are AF")
    assert stop.evidence["cut_tool_calls"] == 2
    assert stop.evidence["step"] == 1
    assert stop.result.final == "The flights are AF"
    assert stop.result.messages[-1].content == "The flights are AF"
    assert [call.id for call in stop.result.pending] == ["t1", "t2"]
    assert (stop.result.usage.input_tokens, stop.result.usage.output_tokens) == (31, 14)
    assert ran == Counter({"echo:first": 1})


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_truncated_reply_without_calls_is_not_an_answer(driver: str) -> None:
    stop = stopped(
        Agent(FakeModel(reply("half an answ", stop_reason="max_tokens")), counted_registry(Counter())), driver
    )
    assert (stop.reason, stop.result.final, stop.evidence["cut_tool_calls"]) == ("max_tokens", "half an answ", 0)
    assert len(stop.result.steps) == 0


@pytest.mark.parametrize("driver", DRIVERS)
def test_CheckTruncation_to_Failed_refusal_keeps_the_text_and_its_usage(driver: str) -> None:
    refused = ModelResponse(Message("assistant", "I can't help with that."), "refusal", Usage(9, 4))
    stop = stopped(Agent(FakeModel(refused), counted_registry(Counter())), driver)
    assert edges(stop.result)[-1] == "CheckTruncation->Failed[refusal]"
    assert stop.evidence["content"] == "I can't help with that."
    assert stop.result.final == "I can't help with that."
    assert (stop.result.usage.input_tokens, stop.result.usage.output_tokens) == (9, 4)


# --- cancel and timeout at each state -----------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_AwaitModel_to_Failed_cancelled_before_the_first_call_makes_no_call(driver: str) -> None:
    token = CancelToken()
    token.cancel("early")
    model = FakeModel(reply("never"))
    stop = stopped(Agent(model, counted_registry(Counter())), driver, cancel=token)
    assert edges(stop.result) == ["AwaitModel->Failed[cancelled]"]
    assert (stop.evidence["why"], stop.evidence["state"]) == ("early", "AwaitModel")
    assert model.seen == []


@pytest.mark.parametrize("driver", DRIVERS)
def test_Dispatch_to_Failed_cancelled_when_the_token_is_cancelled_during_the_model_call(driver: str) -> None:
    ran: Counter[str] = Counter()
    token = CancelToken()

    class Cancelling(FakeModel):
        def complete(self, messages: Any, tools: Any, output: Any = None) -> ModelResponse:
            token.cancel("user left")
            return super().complete(messages, tools)

    model = Cancelling(tool_turn(tool_call("echo", id="c1", text="a"), content="on it"))
    stop = stopped(Agent(model, counted_registry(ran)), driver, cancel=token)
    assert edges(stop.result)[-1] == "Dispatch->Failed[cancelled]"
    assert (stop.evidence["why"], stop.evidence["state"]) == ("user left", "Dispatch")
    assert [call.id for call in stop.result.pending] == ["c1"]
    assert stop.result.messages[-1].content == "on it"
    assert not ran


@pytest.mark.parametrize("driver", DRIVERS)
def test_Dispatch_to_Failed_timeout_when_the_model_call_used_up_the_time(driver: str) -> None:
    ran: Counter[str] = Counter()
    clock = ManualClock()

    class Slow(FakeModel):
        def complete(self, messages: Any, tools: Any, output: Any = None) -> ModelResponse:
            clock.advance(61)
            return super().complete(messages, tools)

    model = Slow(tool_turn(tool_call("echo", id="c1", text="a")))
    stop = stopped(Agent(model, counted_registry(ran), timeout=60, clock=clock), driver)
    assert edges(stop.result)[-1] == "Dispatch->Failed[timeout]"
    assert (stop.evidence["elapsed"], stop.evidence["timeout"]) == (61.0, 60)
    assert "unfinished" not in stop.evidence
    assert not ran


# --- two stops at once: the first row of the table wins ------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_tool_failures_wins_over_cycle_when_both_hold_after_the_same_call(driver: str) -> None:
    x, y = tool_turn(tool_call("fail", reason="x")), tool_turn(tool_call("fail", reason="y"))
    stop = stopped(
        Agent(FakeModel(x, y, x, y, reply("z")), counted_registry(Counter()), max_consecutive_failures=4), driver
    )
    assert stop.reason == "tool_failures"


@pytest.mark.parametrize("driver", DRIVERS)
def test_token_budget_wins_over_max_steps_before_the_same_model_call(driver: str) -> None:
    model = FakeModel(tool_turn(tool_call("echo", text="a"), usage=Usage(50, 50)), reply("z"))
    stop = stopped(Agent(model, counted_registry(Counter()), max_steps=1, token_budget=100), driver)
    assert stop.reason == "token_budget"
    assert stop.evidence["counters"]["steps"] == [1, 1]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(("cancel", "expected"), [(True, "cancelled"), (False, "timeout")])
def test_cancelled_then_timeout_then_max_steps_before_the_same_model_call(
    driver: str, cancel: bool, expected: str
) -> None:
    clock = ManualClock()
    token = CancelToken()
    registry = counted_registry(Counter())

    @registry.register
    def slow() -> str:
        """Take 100 seconds, maybe as the user leaves."""
        clock.advance(100)
        if cancel:
            token.cancel("bye")
        return "ok"

    model = FakeModel(tool_turn(tool_call("slow")), reply("z"))
    stop = stopped(Agent(model, registry, max_steps=1, timeout=10, clock=clock), driver, cancel=token)
    assert stop.reason == expected
    assert edges(stop.result)[-1] == f"ExecuteTool->Failed[{expected}]"


@pytest.mark.parametrize("driver", DRIVERS)
def test_repeated_action_wins_over_max_tool_calls_at_the_same_dispatch(driver: str) -> None:
    model = FakeModel(tool_turn(tool_call("echo", text="a"), tool_call("echo", text="a")))
    stop = stopped(Agent(model, counted_registry(Counter()), max_tool_calls=1), driver)
    assert stop.reason == "repeated_action"


# --- every evidence holds step and counters -----------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_counters_in_the_evidence_are_every_meter_against_its_limit(driver: str) -> None:
    model = FakeModel([tool_turn(tool_call("echo", text=f"t{n}"), usage=Usage(1, 1)) for n in range(2)])
    stop = stopped(Agent(model, counted_registry(Counter()), max_steps=2, max_tool_calls={"*": 9}), driver)
    counters = stop.evidence["counters"]
    assert set(counters) == {"seconds", "tool_calls", "failures", "tokens", "cost", "steps"}
    assert counters["steps"] == [2, 2]
    assert counters["tool_calls"] == [2, 9]
    assert counters["failures"] == [0, 3]
    assert counters["tokens"] == [4, None]
