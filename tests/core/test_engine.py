"""End-to-end behaviour of the engine: the seed chapter's scenarios, bad input, and driving a run by hand."""

from __future__ import annotations

import json
import threading

import pytest

import fsm_agent
from fsm_agent import STATES, Agent, AgentLoopError, Message, ModelResponse, RunStateError, State, ToolCall, Usage
from fsm_agent.testing import (
    TOOL_THEN_ANSWER,
    CounterModel,
    FakeModel,
    LoopingModel,
    ScriptExhaustedError,
    assert_path,
    demo_registry,
    edges,
    reply,
    tool_call,
    tool_turn,
)


def _stop(go: object) -> AgentLoopError:
    with pytest.raises(AgentLoopError) as info:
        go()  # type: ignore[operator]
    return info.value


def test_states_are_the_six_bare_names_in_order() -> None:
    """STATES is the pinned tuple and str(state) is the bare name."""
    assert [str(s) for s in STATES] == ["AwaitModel", "CheckTruncation", "Dispatch", "ExecuteTool", "Done", "Failed"]


def test_seed_a_counter_model_stops_on_max_steps_after_three_steps() -> None:
    """CounterModel dodges the repeat check and is stopped by max_steps=3 with exactly 3 steps done."""
    exc = _stop(lambda: fsm_agent.run(CounterModel(), demo_registry(), "开始", max_steps=3))
    expected = ("max_steps", "max_steps in model turn 3: turns=3, limit=3", 3)
    assert (exc.reason, str(exc), len(exc.result.steps)) == expected
    assert exc.evidence["turns"] == exc.evidence["limit"] == 3
    assert exc.evidence["step"] == 2
    assert [s.index for s in exc.result.steps] == [0, 1, 2]
    assert exc.result.final == ""
    assert edges(exc.result)[-1] == "ExecuteTool->Failed[max_steps]"


def test_seed_b_looping_model_stops_on_repeated_action_after_one_step() -> None:
    """The second identical call is never executed: repeated_action after 1 step, the call kept as pending."""
    same = ToolCall("c1", "echo", {"text": "ping"})
    exc = _stop(lambda: fsm_agent.run(LoopingModel(same), demo_registry(), "开始", max_steps=8))
    assert (exc.reason, len(exc.result.steps)) == ("repeated_action", 1)
    assert exc.evidence["signature"] == {"name": "echo", "arguments": '{"text": "ping"}'}
    assert exc.result.pending == (ToolCall("c1-2", "echo", {"text": "ping"}),)  # the reused id made unique
    tool_messages = [m for m in exc.result.messages if m.role == "tool"]
    assert len(tool_messages) == 1


def test_seed_c_truncated_reply_keeps_partial_text() -> None:
    """stop_reason max_tokens stops the run and keeps the half-written text in result.final."""
    script = FakeModel([reply("我先算加法得", stop_reason="max_tokens")])
    exc = _stop(lambda: fsm_agent.run(script, demo_registry(), "请计算 (2+3)*4"))
    assert (exc.reason, exc.result.final, exc.result.steps) == ("max_tokens", "我先算加法得", ())
    assert exc.result.messages[-1].content == "我先算加法得"
    assert_path(exc.result, ["AwaitModel", "CheckTruncation", "Failed"])


def test_consecutive_failures_stop_with_last_error_and_count() -> None:
    """Three failing calls in a row (bad arguments, unknown tool, error dict) stop with tool_failures."""
    script = FakeModel(
        [
            tool_turn(tool_call("add", a="2", b=3)),
            tool_turn(tool_call("multiply", a=2, b=3)),
            tool_turn(tool_call("fail", reason="quota exceeded")),
        ]
    )
    exc = _stop(lambda: fsm_agent.run(script, demo_registry(), "q"))
    assert exc.reason == "tool_failures"
    assert {k: exc.evidence[k] for k in ("step", "failures", "limit", "last_error")} == {
        "step": 2,
        "failures": 3,
        "limit": 3,
        "last_error": "quota exceeded",
    }
    assert exc.evidence["counters"]["failures"] == [3, 3]
    assert len(exc.result.steps) == 3


def test_a_success_resets_the_failure_count() -> None:
    """fail, fail, ok, fail, fail does not reach 3 consecutive failures."""
    calls = [tool_call("fail", reason=str(i)) for i in range(4)]
    script = FakeModel(
        [tool_turn(calls[0], calls[1], tool_call("echo", text="ok"), calls[2], calls[3]), reply("answer")]
    )
    result = fsm_agent.run(script, demo_registry(), "q")
    assert result.ok
    assert result.final == "answer"


def test_natural_finish_returns_final_and_shares_step_index_within_a_turn() -> None:
    """Content alongside tool calls continues the loop; calls of one turn share its index; the answer ends it."""
    script = FakeModel(
        [
            tool_turn(tool_call("add", a=2, b=3), content="thinking aloud"),
            tool_turn(tool_call("add", a=5, b=5), tool_call("add", a=10, b=10)),
            reply("20", usage=Usage(7, 3)),
        ]
    )
    result = fsm_agent.run(script, demo_registry(), "(2+3)*4", system="be brief")
    assert (result.ok, result.reason, result.final) == (True, "done", "20")
    assert [(s.index, s.kind) for s in result.steps] == [
        (0, "tool_call"),
        (1, "tool_call"),
        (1, "tool_call"),
        (2, "final"),
    ]
    assert [m.role for m in result.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert result.usage == Usage(7, 3)
    assert result.trace[-1].dest == "Done"


def test_tool_message_order_follows_the_calls_asked() -> None:
    """Every executed call gets one tool message with its id, right after its assistant message, in order."""
    a, b = tool_call("echo", id="a", text="1"), tool_call("echo", id="b", text="2")
    result = fsm_agent.run(FakeModel([tool_turn(a, b), reply("ok")]), demo_registry(), "q")
    assert [(m.role, m.tool_call_id, m.content) for m in result.messages[1:4]] == [
        ("assistant", None, ""),
        ("tool", "a", '"1"'),
        ("tool", "b", '"2"'),
    ]


def test_repeat_is_only_adjacent_a_b_a_is_fine() -> None:
    """A, B, A is a legitimate workflow; only A, A is a repeat. Key order does not change the signature."""
    a1 = tool_call("add", a=1, b=2)
    b = tool_call("echo", text="x")
    a2 = ToolCall("z", "add", {"b": 2, "a": 1})
    assert fsm_agent.run(FakeModel([tool_turn(a1, b, a2), reply("ok")]), demo_registry(), "q").ok
    exc = _stop(lambda: fsm_agent.run(FakeModel([tool_turn(a1), tool_turn(a2)]), demo_registry(), "q"))
    assert exc.reason == "repeated_action"


def test_model_exception_is_model_error_with_cause() -> None:
    """A model that raises ends the run in Failed/model_error, with the exception as __cause__."""
    boom = ConnectionError("socket closed")
    exc = _stop(lambda: fsm_agent.run(FakeModel([boom]), demo_registry(), "q"))
    assert exc.reason == "model_error"
    assert exc.__cause__ is boom
    assert (exc.evidence["error"], exc.evidence["type"], exc.evidence["step"]) == (
        "socket closed",
        "ConnectionError",
        0,
    )


def test_exhausted_script_says_so() -> None:
    """Running past a FakeModel's script is a model_error whose message says the script ran out."""
    exc = _stop(lambda: fsm_agent.run(FakeModel([tool_turn(tool_call("echo", text="a"))]), demo_registry(), "q"))
    assert exc.reason == "model_error"
    assert isinstance(exc.__cause__, ScriptExhaustedError)
    assert "script exhausted" in exc.evidence["error"]


def test_model_returning_wrong_type_is_model_error() -> None:
    """A model that returns something other than a ModelResponse is reported, not crashed on."""

    class Sloppy:
        def complete(self, messages: object, tools: object) -> object:
            return {"role": "assistant", "content": "hi"}

    exc = _stop(lambda: fsm_agent.run(Sloppy(), demo_registry(), "q"))  # type: ignore[arg-type]
    assert exc.reason == "model_error"
    assert "expected ModelResponse" in exc.evidence["error"]


def test_unknown_stop_reason_is_model_error_not_a_guess() -> None:
    """A stop_reason the engine does not know ends the run with model_error naming the value."""
    exc = _stop(lambda: fsm_agent.run(FakeModel([reply("hm", stop_reason="paused_weirdly")]), demo_registry(), "q"))
    assert exc.reason == "model_error"
    assert "unknown stop_reason 'paused_weirdly'" in exc.evidence["error"]
    assert exc.result.messages[-1].content == "hm"


def test_unknown_tool_bad_arguments_and_raising_tool_become_error_results() -> None:
    """The model sees a JSON error for each mistake and the run continues to its answer."""
    registry = demo_registry()

    @registry.register
    def explode() -> None:
        """Always raises."""
        raise ValueError("kaput")

    script = FakeModel([tool_turn(tool_call("nope"), tool_call("add", a=1), tool_call("explode")), reply("sorry")])
    result = fsm_agent.run(script, registry, "q", max_consecutive_failures=4)
    errors = [json.loads(m.content)["error"] for m in result.messages if m.role == "tool"]
    assert errors[0].startswith("unknown tool 'nope'")
    assert "missing required argument(s): b" in errors[1]
    assert errors[2] == "tool 'explode' raised ValueError: kaput"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_steps": 0}, "max_steps must be an integer >= 1, got 0"),
        ({"max_steps": -3}, "max_steps must be an integer >= 1, got -3"),
        ({"max_steps": 2.5}, "max_steps must be an integer >= 1, got 2.5"),
        ({"max_steps": True}, "max_steps must be an integer >= 1, got True"),
        ({"max_consecutive_failures": 0}, "max_consecutive_failures must be an integer >= 1, got 0"),
    ],
)
def test_invalid_limits_are_rejected_at_construction(kwargs: dict[str, object], message: str) -> None:
    """Limits that could never allow a run are a ValueError when the agent is built, naming the limit."""
    with pytest.raises(ValueError, match=message):
        Agent(FakeModel([]), demo_registry(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        fsm_agent.run(FakeModel([]), demo_registry(), "q", **kwargs)  # type: ignore[arg-type]


def test_agent_rejects_a_model_without_complete() -> None:
    """Passing something that is not a model fails at construction with the type named."""
    with pytest.raises(TypeError, match="model must have a complete"):
        Agent(object(), demo_registry())  # type: ignore[arg-type]


def test_advance_walks_one_transition_at_a_time() -> None:
    """start() calls nothing; each advance() fires exactly one edge; result appears only at the end."""
    agent = Agent(FakeModel([tool_turn(tool_call("echo", text="x")), reply("fin")]), demo_registry())
    run = agent.start("q")
    assert run.state is State.AwaitModel
    assert run.trace == []
    with pytest.raises(RunStateError, match="not finished"):
        _ = run.result
    states = [str(run.state)]
    while not run.done:
        edge = run.advance()
        assert edge.dest == run.state
        states.append(str(run.state))
    assert states == list(TOOL_THEN_ANSWER)
    assert run.result.final == "fin"


def test_advancing_a_finished_run_is_a_clear_error() -> None:
    """advance() after Done or Failed raises RunStateError naming the state and reason."""
    run = Agent(FakeModel([reply("x", stop_reason="max_tokens")]), demo_registry()).start("q")
    with pytest.raises(AgentLoopError):
        run.finish()
    with pytest.raises(RunStateError, match="already finished in Failed"):
        run.advance()


def test_keyboard_interrupt_in_a_tool_propagates_and_leaves_the_run_consistent() -> None:
    """A BaseException from a tool is not swallowed; the run stays in ExecuteTool with the call still pending."""
    registry = demo_registry()

    @registry.register
    def interrupt() -> None:
        """Simulates Ctrl-C inside a tool."""
        raise KeyboardInterrupt

    call = tool_call("interrupt")
    run = Agent(FakeModel([tool_turn(call)]), registry).start("q")
    for _ in range(3):
        run.advance()
    assert run.state is State.ExecuteTool
    with pytest.raises(KeyboardInterrupt):
        run.advance()
    assert run.state is State.ExecuteTool
    assert list(run.pending) == [call]
    assert run.steps == []


def test_one_agent_serves_many_threads_without_sharing_state() -> None:
    """Runs of one agent in parallel threads each get their own counters, messages and trace."""

    class EchoN:
        def complete(self, messages: object, tools: object) -> ModelResponse:
            user = next(m for m in messages if m.role == "user")  # type: ignore[attr-defined]
            n = int(user.content)
            turns = sum(1 for m in messages if m.role == "assistant")  # type: ignore[attr-defined]
            if turns < n:
                return tool_turn(ToolCall(f"t{turns}", "echo", {"text": f"{n}-{turns}"}))
            return reply(f"answer {n}")

    agent = Agent(EchoN(), demo_registry(), max_steps=20)
    results: dict[int, object] = {}

    def work(n: int) -> None:
        results[n] = agent.run(str(n))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(1, 17)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in range(1, 17):
        result = results[n]
        assert result.final == f"answer {n}"  # type: ignore[attr-defined]
        assert len(result.steps) == n + 1  # type: ignore[attr-defined]


def test_results_are_immutable_records() -> None:
    """A RunResult cannot be modified by the caller."""
    result = fsm_agent.run(FakeModel([reply("x")]), demo_registry(), "q")
    with pytest.raises(AttributeError):
        result.final = "y"  # type: ignore[misc]
    assert isinstance(result.messages, tuple)
    assert result.messages[0] == Message("user", "q")
