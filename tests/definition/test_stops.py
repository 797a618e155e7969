"""End-to-end tests of the stops beyond the first five, user-defined stops and the on_stop policies."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from support.scenarios import OVERFLOW, POINT, keep_last, with_failing_child

import fsm_agent
from fsm_agent import (
    TABLE,
    Agent,
    AgentLoopError,
    CancelToken,
    ModelResponse,
    Price,
    RunResult,
    StopCondition,
    ToolRegistry,
    Usage,
)
from fsm_agent.definition.triggers import EXPIRED, INTERRUPTED, RESUME, START
from fsm_agent.testing import (
    CounterModel,
    FakeModel,
    LoopingModel,
    ManualClock,
    demo_registry,
    edge_id,
    edges,
    reply,
    tool_call,
    tool_turn,
)


def _stop(go: Callable[[], object]) -> AgentLoopError:
    with pytest.raises(AgentLoopError) as info:
        go()
    return info.value


def _calls(*names_and_text: tuple[str, str]) -> list[Any]:
    return [tool_turn(tool_call(name, text=text)) for name, text in names_and_text]


# --- cycle -------------------------------------------------------------------------------------------------


def test_cycle_a_b_a_b_with_identical_results_stops_right_after_the_fourth_call() -> None:
    """Period 2 seen twice in a row stops after call 4; the evidence names the two calls."""
    script = FakeModel(_calls(("echo", "a"), ("echo", "b"), ("echo", "a"), ("echo", "b"), ("echo", "a")))
    exc = _stop(lambda: fsm_agent.run(script, demo_registry(), "q"))
    assert exc.reason == "cycle"
    assert len(exc.result.steps) == 4
    assert exc.evidence["period"] == 2
    assert exc.evidence["calls"] == [
        {"name": "echo", "arguments": {"text": "a"}},
        {"name": "echo", "arguments": {"text": "b"}},
    ]
    assert edges(exc.result)[-1] == "ExecuteTool->Failed[cycle]"


def test_cycle_of_period_three_stops_after_the_sixth_call() -> None:
    """A,B,C,A,B,C stops right after its sixth call with period 3."""
    script = FakeModel([tool_turn(*(tool_call("echo", text=t) for t in "abcabc")), reply("never")])
    exc = _stop(lambda: fsm_agent.run(script, demo_registry(), "q"))
    assert (exc.reason, exc.evidence["period"], len(exc.result.steps)) == ("cycle", 3, 6)


def test_a_b_a_c_is_not_a_cycle() -> None:
    """A sequence that repeats only partly goes on to its answer."""
    script = FakeModel([tool_turn(*(tool_call("echo", text=t) for t in "abac")), reply("fine")])
    assert fsm_agent.run(script, demo_registry(), "q").final == "fine"


def test_polling_a_job_whose_status_changes_is_progress_not_a_cycle() -> None:
    """status, wait, status, wait ... with changing status results is not stopped by the cycle guard."""
    registry = ToolRegistry()
    progress = iter(range(0, 101, 20))

    @registry.register
    def job_status(job: str) -> dict[str, Any]:
        """Report the job's progress."""
        return {"job": job, "percent": next(progress)}

    @registry.register
    def wait(seconds: int) -> str:
        """Wait a while (instant here)."""
        return "waited"

    turns = [tool_turn(tool_call("job_status", job="j1"), tool_call("wait", seconds=1)) for _ in range(5)]
    result = fsm_agent.run(FakeModel([*turns, reply("job finished")]), registry, "q", max_steps=10)
    assert result.final == "job finished"
    assert len(result.steps) == 11


def test_cycle_window_zero_turns_the_guard_off() -> None:
    """With cycle_window=0 an A,B,A,B loop runs on until another limit."""
    script = FakeModel([tool_turn(*(tool_call("echo", text=t) for t in "abab")), reply("ok")])
    assert fsm_agent.run(script, demo_registry(), "q", cycle_window=0).ok


# --- timeout -----------------------------------------------------------------------------------------------


def _slow_registry(clock: ManualClock, seconds: float) -> ToolRegistry:
    registry = demo_registry()

    @registry.register
    def slow(n: int) -> int:
        """Takes a while, on the manual clock."""
        clock.advance(seconds)
        return n

    return registry


def test_timeout_is_checked_before_the_next_model_call() -> None:
    """Two 5-second tools against an 8-second timeout: the third model call is never made."""
    clock = ManualClock()
    script = FakeModel([tool_turn(tool_call("slow", n=1)), tool_turn(tool_call("slow", n=2)), reply("late")])
    exc = _stop(lambda: fsm_agent.run(script, _slow_registry(clock, 5), "q", timeout=8, clock=clock))
    assert exc.reason == "timeout"
    assert (exc.evidence["elapsed"], exc.evidence["timeout"]) == (10, 8)
    assert len(script.seen) == 2
    assert edges(exc.result)[-1] == "ExecuteTool->Failed[timeout]"


def test_timeout_is_checked_before_each_tool_call_of_a_turn() -> None:
    """In a turn of three slow calls, the deadline stops the run before the third call."""
    clock = ManualClock()
    script = FakeModel([tool_turn(*(tool_call("slow", n=i) for i in range(3)))])
    exc = _stop(lambda: fsm_agent.run(script, _slow_registry(clock, 5), "q", timeout=10, clock=clock))
    assert exc.reason == "timeout"
    assert len(exc.result.steps) == 2
    assert [c.arguments for c in exc.result.pending] == [{"n": 2}]
    assert edges(exc.result)[-1] == "Dispatch->Failed[timeout]"


# --- token budget ------------------------------------------------------------------------------------------


def test_token_budget_stops_before_the_call_that_would_exceed_it() -> None:
    """Usage is summed over responses (missing usage counts 0); at total >= budget no model call is made."""
    script = FakeModel(
        [
            tool_turn(tool_call("echo", text="1"), usage=Usage(400, 100)),
            tool_turn(tool_call("echo", text="2")),
            tool_turn(tool_call("echo", text="3"), usage=Usage(450, 50)),
            reply("too expensive"),
        ]
    )
    exc = _stop(lambda: fsm_agent.run(script, demo_registry(), "q", token_budget=1000))
    assert exc.reason == "token_budget"
    assert len(script.seen) == 3
    assert (exc.evidence["tokens"], exc.evidence["budget"]) == (1000, 1000)
    assert exc.result.usage == Usage(850, 150)


# --- max_tool_calls ----------------------------------------------------------------------------------------


def test_cap_of_five_lets_five_calls_run_and_the_answer_succeed() -> None:
    """A cap is on calls made: five calls then an answer is a success."""
    script = FakeModel([tool_turn(*(tool_call("echo", text=str(i)) for i in range(5))), reply("five")])
    result = fsm_agent.run(script, demo_registry(), "q", max_tool_calls=5)
    assert (result.ok, result.steps[-2].counters["tool_calls"]) == (True, [5, 5])


def test_the_call_that_would_exceed_the_cap_is_not_made() -> None:
    """The sixth call is refused before it runs and stays in result.pending."""
    script = FakeModel([tool_turn(*(tool_call("echo", text=str(i)) for i in range(6)))])
    exc = _stop(lambda: fsm_agent.run(script, demo_registry(), "q", max_tool_calls=5))
    assert exc.reason == "max_tool_calls"
    assert len(exc.result.steps) == 5
    assert exc.result.pending[0].arguments == {"text": "5"}
    assert {k: exc.evidence[k] for k in ("tool", "scope", "used", "limit")} == {
        "tool": "echo",
        "scope": "*",
        "used": 5,
        "limit": 5,
    }


def test_per_tool_caps_and_total() -> None:
    """A dict caps each named tool, with "*" for the total."""
    script = FakeModel([tool_turn(tool_call("add", a=1, b=1), tool_call("add", a=2, b=2), tool_call("echo", text="x"))])
    exc = _stop(lambda: fsm_agent.run(script, demo_registry(), "q", max_tool_calls={"add": 1, "*": 10}))
    assert (exc.evidence["tool"], exc.evidence["scope"], exc.evidence["limit"]) == ("add", "add", 1)
    script = FakeModel([tool_turn(tool_call("add", a=1, b=1), tool_call("echo", text="x"))])
    exc = _stop(lambda: fsm_agent.run(script, demo_registry(), "q", max_tool_calls={"add": 5, "*": 1}))
    assert (exc.evidence["tool"], exc.evidence["scope"], exc.evidence["limit"]) == ("echo", "*", 1)


# --- cancellation ------------------------------------------------------------------------------------------


def test_cancel_from_another_thread_stops_at_the_next_check_keeping_everything() -> None:
    """A token cancelled by another thread while a tool runs stops the run before the next call."""
    token = CancelToken()
    registry = demo_registry()

    @registry.register
    def long_task() -> str:
        """Meanwhile, another thread cancels the run."""
        canceller = threading.Thread(target=token.cancel, args=("user pressed stop",))
        canceller.start()
        canceller.join()
        return "finished anyway"

    script = FakeModel([tool_turn(tool_call("long_task"), tool_call("echo", text="never"))])
    exc = _stop(lambda: fsm_agent.run(script, registry, "q", cancel=token))
    assert exc.reason == "cancelled"
    assert exc.evidence["why"] == "user pressed stop"
    assert exc.result.messages[-1].content == '"finished anyway"'
    assert exc.result.pending[0].name == "echo"


def test_cancelled_before_start_makes_no_model_call() -> None:
    """A token cancelled before the run starts stops it on AwaitModel->Failed[cancelled]: nothing is billed."""
    token = CancelToken()
    token.cancel("not needed any more")
    model = FakeModel([reply("quick")])
    exc = _stop(lambda: Agent(model, demo_registry()).run("q", cancel=token))
    assert (exc.reason, exc.evidence["why"], model.seen) == ("cancelled", "not needed any more", [])
    assert [(t.trigger, t.reason) for t in exc.result.trace] == [("start", "cancelled")]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_token_cancelled_with_no_reason_says_so_not_that_a_task_was_cancelled(driver: str) -> None:
    """``cancel()`` with no text: the evidence says the token was cancelled; nothing is called."""
    token = CancelToken()
    token.cancel()
    model = FakeModel([reply("quick")])
    agent = Agent(model, demo_registry())
    if driver == "sync":
        exc = _stop(lambda: agent.run("q", cancel=token))
    else:
        exc = _stop(lambda: asyncio.run(agent.arun("q", cancel=token)))
    assert (exc.reason, exc.evidence["why"], model.seen) == (
        "cancelled",
        "its cancel token was cancelled, with no reason given",
        [],
    )


def test_cancel_token_must_be_a_cancel_token() -> None:
    """Passing something else as cancel is a TypeError, not a silently ignored flag."""
    with pytest.raises(TypeError, match="cancel must be a CancelToken"):
        Agent(FakeModel([]), demo_registry()).start("q", cancel=threading.Event())  # type: ignore[arg-type]


# --- user-defined stops ------------------------------------------------------------------------------------


def no_deletes(view: fsm_agent.RunView) -> bool:
    """The next tool call would delete something."""
    return bool(view.pending) and view.pending[0].name == "delete"


def test_user_stop_at_dispatch_blocks_a_call_before_it_runs() -> None:
    """A StopCondition at Dispatch is an edge into Failed with its own reason, checked before every call."""
    registry = demo_registry()
    deleted: list[str] = []
    registry.register(lambda path: deleted.append(path), name="delete")
    stop = StopCondition("forbidden_tool", "Dispatch", no_deletes, "never delete")
    agent = Agent(
        FakeModel([tool_turn(tool_call("echo", text="a"), tool_call("delete", path="/"))]),
        registry,
        stop_conditions=[stop],
    )
    exc = _stop(lambda: agent.run("q"))
    assert exc.reason == "forbidden_tool"
    assert deleted == []
    assert exc.evidence["condition"] == "no_deletes"
    assert exc.evidence["description"] == "never delete"
    assert edges(exc.result)[-1] == "Dispatch->Failed[forbidden_tool]"
    rows = [edge_id(r) for r in agent.table.rows_from(fsm_agent.State.Dispatch, "dispatch")]
    assert rows.index("Dispatch->Failed[forbidden_tool]") == len(rows) - 2


def test_user_stop_at_await_model_sees_the_reply_and_counters() -> None:
    """At AwaitModel the check runs once the model has replied; it sees the response and counters read-only."""
    seen: list[Any] = []

    def gives_up(view: fsm_agent.RunView) -> bool:
        seen.append(view.counters["steps"])
        with pytest.raises(AttributeError):
            view.counters = {}  # type: ignore[misc]
        return view.last_response is not None and "give up" in view.last_response.message.content

    stop = StopCondition("gave_up", "AwaitModel", gives_up)
    script = FakeModel([tool_turn(tool_call("echo", text="x")), reply("I give up")])
    exc = _stop(lambda: fsm_agent.run(script, demo_registry(), "q", stop_conditions=[stop]))
    assert exc.reason == "gave_up"
    assert seen == [[1, 8], [2, 8]]
    assert edges(exc.result)[-1] == "AwaitModel->Failed[gave_up]"


@pytest.mark.parametrize(
    ("stops", "message"),
    [
        ([StopCondition("max_steps", "Dispatch", no_deletes)], "collides with a built-in reason"),
        ([StopCondition("done", "Dispatch", no_deletes)], "collides with a built-in reason"),
        ([StopCondition("paused", "Dispatch", no_deletes)], "collides with a built-in reason"),
        ([StopCondition("x", "Dispatch", no_deletes), StopCondition("x", "ExecuteTool", no_deletes)], "used by two"),
    ],
)
def test_colliding_user_stop_reasons_are_rejected(stops: list[StopCondition], message: str) -> None:
    """A user reason must be new and unique."""
    with pytest.raises(ValueError, match=message):
        Agent(FakeModel([]), demo_registry(), stop_conditions=stops)


@pytest.mark.parametrize("at", ["Done", "Failed", "Nowhere"])
def test_user_stop_must_guard_a_non_terminal_state(at: str) -> None:
    """at must name a state a run can leave."""
    with pytest.raises(ValueError, match="is not a non-terminal state"):
        StopCondition("x", at, no_deletes)


def test_user_stops_do_not_change_the_default_table() -> None:
    """Each agent gets its own table; the shared default stays as declared."""
    before = TABLE.rows
    Agent(FakeModel([]), demo_registry(), stop_conditions=[StopCondition("x", "Dispatch", no_deletes)])
    assert TABLE.rows == before
    assert "x" not in TABLE.reasons


# --- policies ----------------------------------------------------------------------------------------------


def test_return_policy_hands_back_the_result_without_raising() -> None:
    """on_stop={"max_steps": "return"} returns the partial result with the reason and ok false."""
    result = fsm_agent.run(CounterModel(), demo_registry(), "q", max_steps=2, on_stop={"max_steps": "return"})
    assert (result.reason, result.ok, len(result.steps)) == ("max_steps", False, 2)


def test_finalize_policy_makes_one_last_call_without_tools() -> None:
    """max_steps with finalize: one more call, no tools offered, an instruction; its text is final, ok is false."""
    script = FakeModel([*_calls(("echo", "1"), ("echo", "2")), reply("best guess: 42")])
    result = fsm_agent.run(script, demo_registry(), "q", max_steps=2, on_stop={"max_steps": "finalize"})
    assert (result.reason, result.ok, result.final) == ("max_steps", False, "best guess: 42")
    assert script.tools_seen[-1] == []
    assert script.tools_seen[0] != []
    assert script.seen[-1][-1].role == "user"
    assert "max_steps" in script.seen[-1][-1].content
    assert "ExecuteTool->AwaitModel[finalize_on_max_steps]" in edges(result)
    assert edges(result)[-1] == "Dispatch->Done[has_no_tool_calls]"
    assert result.evidence["finalize"] == {"outcome": "answered"}
    assert result.evidence["turns"] == 2


def test_finalize_answers_every_unexecuted_tool_call_first() -> None:
    """The repeated call that was never run gets a tool message saying why, before the last call."""
    a = tool_call("echo", id="x1", text="ping")
    script = FakeModel([tool_turn(a), tool_turn(tool_call("echo", id="x2", text="ping")), reply("pong")])
    result = fsm_agent.run(script, demo_registry(), "q", on_stop={"repeated_action": "finalize"})
    assert (result.reason, result.final) == ("repeated_action", "pong")
    answer = next(m for m in result.messages if m.tool_call_id == "x2")
    assert "not executed" in json.loads(answer.content)["error"]
    assert result.pending == ()


@pytest.mark.parametrize(
    ("last", "outcome"),
    [
        (ConnectionError("gone"), "model_error"),
        (reply("half", stop_reason="max_tokens"), "max_tokens"),
        (tool_turn(tool_call("echo", text="more")), "finalize_failed"),
    ],
)
def test_failed_finalize_keeps_the_original_stop(last: Any, outcome: str) -> None:
    """If the last call fails, is cut off or asks for tools, AgentLoopError carries the original reason."""
    script = FakeModel([*_calls(("echo", "1")), last])
    exc = _stop(lambda: fsm_agent.run(script, demo_registry(), "q", max_steps=1, on_stop={"max_steps": "finalize"}))
    assert exc.reason == "max_steps"
    assert exc.evidence["finalize"]["outcome"] == outcome
    if isinstance(last, Exception):
        assert exc.__cause__ is last
    else:
        assert exc.result.final == last.message.content


def test_finalize_on_cycle_timeout_budget_and_cap() -> None:
    """Each finalizable stop can be answered by a last call."""
    clock = ManualClock()
    cases: list[tuple[str, dict[str, Any], list[Any]]] = [
        ("cycle", {}, [tool_turn(*(tool_call("echo", text=t) for t in "abab"))]),
        ("timeout", {"timeout": 4, "clock": clock}, [tool_turn(tool_call("slow", n=1))]),
        ("token_budget", {"token_budget": 10}, [tool_turn(tool_call("echo", text="t"), usage=Usage(9, 1))]),
        (
            "max_tool_calls",
            {"max_tool_calls": 1},
            [tool_turn(tool_call("echo", text="1"), tool_call("echo", text="2"))],
        ),
    ]
    for reason, options, script in cases:
        result = fsm_agent.run(
            FakeModel([*script, reply(f"final for {reason}")]),
            _slow_registry(clock, 5),
            "q",
            on_stop={reason: "finalize"},
            **options,
        )
        assert (result.reason, result.final, result.ok) == (reason, f"final for {reason}", False)


@pytest.mark.parametrize(
    ("on_stop", "message"),
    [
        ({"nonsense": "raise"}, "unknown reason 'nonsense'"),
        ({"max_steps": "retry"}, "must be one of raise, return, finalize"),
        ({"tool_failures": "finalize"}, "'finalize' is not allowed"),
        ({"max_tokens": "finalize"}, "'finalize' is not allowed"),
    ],
)
def test_invalid_policies_are_rejected(on_stop: dict[str, str], message: str) -> None:
    """on_stop is validated at construction."""
    with pytest.raises(ValueError, match=message):
        Agent(FakeModel([]), demo_registry(), on_stop=on_stop)


# --- limits and counters -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"token_budget": 0}, "token_budget must be an integer >= 1"),
        ({"timeout": 0}, "timeout must be a finite number of seconds > 0"),
        ({"timeout": -1.5}, "timeout must be"),
        ({"timeout": float("inf")}, "timeout must be"),
        ({"cycle_window": 3}, "cycle_window must be 0 \\(off\\) or an integer >= 4"),
        ({"max_tool_calls": -1}, "max_tool_calls must be an integer >= 0"),
        ({"max_tool_calls": {"echo": -1}}, "max_tool_calls\\['echo'\\] must be an integer >= 0"),
        ({"max_tool_calls": {1: 2}}, "keys must be tool names"),
    ],
)
def test_invalid_new_limits_are_rejected_at_construction(options: dict[str, Any], message: str) -> None:
    """A limit that is already exceeded or meaningless is a ValueError when the agent is built."""
    with pytest.raises(ValueError, match=message):
        Agent(FakeModel([]), demo_registry(), **options)


def test_steps_record_counters_against_limits() -> None:
    """Every step carries [used, limit] for steps, failures, tool_calls, tokens, cost and seconds (None = no limit)."""
    clock = ManualClock()
    script = FakeModel([tool_turn(tool_call("slow", n=1), usage=Usage(90, 10)), reply("ok", usage=Usage(5, 5))])
    result = fsm_agent.run(script, _slow_registry(clock, 2.5), "q", token_budget=1000, clock=clock, timeout=60)
    assert result.steps[0].counters == {
        "steps": [1, 8],
        "failures": [0, 3],
        "tool_calls": [1, None],
        "tokens": [100, 1000],
        "cost": [0.0, None],
        "seconds": [2.5, 60],
    }
    assert result.steps[1].counters["tokens"] == [110, 1000]


class _CancelsWhileThinking(CounterModel):
    """Cancels the run's token while the model is working: the cancel is seen at the next Dispatch."""

    def __init__(self, token: CancelToken) -> None:
        super().__init__()
        self.token = token

    def complete(self, messages: Any, tools: Any) -> ModelResponse:
        self.token.cancel("the user left")
        return super().complete(messages, tools)


def test_every_stop_row_of_the_table_fires_in_some_scenario() -> None:
    """Across the first scenarios and the stops above, every non-embedding edge of the table is taken."""
    clock = ManualClock()
    finalize = dict.fromkeys(("cycle", "timeout", "token_budget", "max_tool_calls", "max_steps"), "finalize")
    dollars = {"cost_budget": 0.01, "prices": Price(input_per_mtok=1000, output_per_mtok=1000)}  # 10 tokens: a cent
    token = CancelToken()
    token.cancel()
    registry = _slow_registry(clock, 5)
    ping = tool_call("echo", text="ping")
    cancel_in_turn = CancelToken()
    runs: list[Callable[[], RunResult]] = [
        lambda: Agent(CounterModel(), registry, max_steps=2).run("q"),
        lambda: Agent(LoopingModel(ping), registry).run("q"),
        lambda: Agent(LoopingModel(ping), registry, on_stop={"repeated_action": "finalize"}).run("q"),
        lambda: Agent(FakeModel([reply("c", stop_reason="max_tokens")]), registry).run("q"),
        lambda: Agent(FakeModel([reply("r", stop_reason="refusal")]), registry).run("q"),
        lambda: Agent(FakeModel([reply("{}"), reply("[]")]), registry, output_type=POINT).run("q"),
        lambda: Agent(
            FakeModel([tool_turn(tool_call("research", input="?"))]), with_failing_child(demo_registry())
        ).run("q"),
        lambda: Agent(
            FakeModel([OVERFLOW, OVERFLOW]),
            registry,
            on_stop={"context_overflow": "compact"},
            compact=keep_last,
        ).run("q"),
        lambda: Agent(FakeModel([]), registry).run("q"),
        lambda: Agent(FakeModel(_calls(("fail", "1"), ("fail", "2"), ("fail", "3"))), registry).run("q"),
        lambda: Agent(FakeModel([tool_turn(*(tool_call("echo", text=t) for t in "abab"))]), registry).run("q"),
        lambda: Agent(
            FakeModel([tool_turn(tool_call("slow", n=1), tool_call("slow", n=2))]), registry, timeout=4, clock=clock
        ).run("q"),
        lambda: Agent(
            FakeModel([tool_turn(tool_call("slow", n=5)), reply("x")]),
            registry,
            timeout=4,
            clock=clock,
            on_stop=finalize,
        ).run("q"),
        lambda: Agent(FakeModel([tool_turn(tool_call("slow", n=3))]), registry, timeout=4, clock=clock).run("q"),
        lambda: Agent(
            FakeModel([tool_turn(tool_call("slow", n=3), tool_call("slow", n=4)), reply("x")]),
            registry,
            timeout=4,
            clock=clock,
            on_stop=finalize,
        ).run("q"),
        lambda: Agent(
            FakeModel([tool_turn(tool_call("echo", text="1"), usage=Usage(5, 5))]), registry, token_budget=10
        ).run("q"),
        lambda: Agent(
            FakeModel([tool_turn(tool_call("echo", text="1"), usage=Usage(5, 5)), reply("x")]),
            registry,
            token_budget=10,
            on_stop=finalize,
        ).run("q"),
        lambda: Agent(FakeModel([tool_turn(tool_call("echo", text="1"), usage=Usage(5, 5))]), registry, **dollars).run(
            "q"
        ),
        lambda: Agent(
            FakeModel([tool_turn(tool_call("echo", text="1"), usage=Usage(5, 5)), reply("x")]),
            registry,
            on_stop={"cost_budget": "finalize"},
            **dollars,
        ).run("q"),
        lambda: Agent(
            FakeModel([tool_turn(tool_call("echo", text="1"), tool_call("echo", text="2"))]), registry, max_tool_calls=1
        ).run("q"),
        lambda: Agent(
            FakeModel([tool_turn(tool_call("echo", text="1"), tool_call("echo", text="2")), reply("x")]),
            registry,
            max_tool_calls=1,
            on_stop=finalize,
        ).run("q"),
        lambda: Agent(
            FakeModel([tool_turn(*(tool_call("echo", text=t) for t in "abab")), reply("x")]), registry, on_stop=finalize
        ).run("q"),
        lambda: Agent(CounterModel(), registry, max_steps=1, on_stop=finalize).run("q"),
        lambda: Agent(CounterModel(), registry).run("q", cancel=token),
        lambda: Agent(_CancelsWhileThinking(cancel_in_turn), registry).run("q", cancel=cancel_in_turn),
    ]
    seen: set[str] = set()
    for go in runs:
        try:
            result = go()
        except AgentLoopError as exc:
            result = exc.result
        seen.update(edges(result))
    # ExecuteTool->Failed[cancelled] needs a cancel between the last call of a turn and the next model call.
    cancel_mid = CancelToken()
    registry.register(lambda: cancel_mid.cancel(), name="cancel_now")
    seen.update(
        edges(
            _stop(
                lambda: Agent(FakeModel([tool_turn(tool_call("cancel_now"))]), registry).run("q", cancel=cancel_mid)
            ).result
        )
    )
    # Hook errors and task cancellation are embedding matters (test_embedding.py), resuming is test_durable.py's.
    # Calls cut off in flight and the start rows are test_transitions.py's.
    elsewhere = (INTERRUPTED, RESUME, EXPIRED, START)
    embedding = {edge_id(r) for r in TABLE.rows if r.reason == "hook_error" or r.trigger in elsewhere}
    assert {edge_id(row) for row in TABLE.rows} - embedding - seen == set()
