"""The bad-input catalogue: each way a caller, a model or a tool can misbehave, its decision, and its message.

| bad input                                    | decision                                                        |
|----------------------------------------------|-----------------------------------------------------------------|
| tool arguments that are not a JSON object    | error result naming the JSON kind (or the non-string key)       |
| tool value JSON cannot encode                | error result naming the tool and the encoder's complaint        |
| huge tool output                             | cut at ``max_output_chars`` (default 100,000) with a marker     |
| a tool name registered twice                 | ``ValueError`` at registration; the first tool stays            |
| functions without hints or docstrings        | permissive schema (``{}`` per parameter), empty description     |
| model returns something not a ModelResponse  | ``model_error`` naming the type (or the malformed part)         |
| unknown ``stop_reason``                      | ``model_error`` naming the value; reply, calls, tokens are kept |
| invalid limits (``max_steps <= 0`` ...)      | ``ValueError`` at construction naming the limit and the value   |
| ``KeyboardInterrupt``/``SystemExit``         | propagates; the run stays put and can be advanced again         |
| recursion in a tool                          | ``RecursionError`` is an error result; re-entry works too       |

The last tests pin engine bugs the property tests found (fixed since): resuming and retrying.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

import fsm_agent
from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, State, ToolCall, ToolRegistry, Usage
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn
from fsm_agent.tools import DEFAULT_MAX_OUTPUT_CHARS


def _stop(agent: Agent) -> AgentLoopError:
    with pytest.raises(AgentLoopError) as info:
        agent.run("q")
    return info.value


def _one_tool(function: Any, name: str = "t", **registry_options: Any) -> ToolRegistry:
    registry = ToolRegistry(**registry_options)
    registry.register(function, name=name)
    return registry


# --- tool arguments that are not an object -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["a"], "arguments must be a JSON object, got array"),
        ("a", "arguments must be a JSON object, got string"),
        (None, "arguments must be a JSON object, got null"),
        (3, "arguments must be a JSON object, got integer"),
        ({1: "a"}, "arguments must be a JSON object with string keys, got key 1"),
    ],
)
def test_arguments_that_are_not_a_json_object_are_an_error_result(arguments: Any, message: str) -> None:
    """Non-object arguments (or non-string keys) fail the call with the JSON kind named, and the tool never runs."""
    ran: list[object] = []
    registry = _one_tool(lambda **kw: ran.append(kw))
    outcome = registry.execute(ToolCall("1", "t", arguments))
    assert outcome.error == f"bad arguments for tool 't': {message}"
    assert json.loads(outcome.content) == {"error": outcome.error}
    assert ran == []


def test_the_model_sees_the_argument_error_and_the_run_goes_on() -> None:
    """A model's list arguments (kept as text, as the adapters keep them) get an error tool message; the run goes on.

    A ``ToolCall`` whose ``arguments`` is itself a list is the adapter's
    mistake instead, a model_error (tests/core/test_reply_arguments.py).
    """
    script = FakeModel([tool_turn(ToolCall("c1", "echo", {}, raw_arguments='["hi"]')), reply("sorry")])
    result = Agent(script, demo_registry()).run("q")
    assert (result.ok, result.final) == (True, "sorry")
    assert "not a JSON object: '[\"hi\"]'" in json.loads(result.messages[-2].content)["error"]


# --- values JSON cannot encode -----------------------------------------------------------------------------


def _self_containing() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ({1, 2}, "Object of type set is not JSON serializable"),
        (b"raw", "Object of type bytes is not JSON serializable"),
        (object(), "Object of type object is not JSON serializable"),
        (math.nan, "Out of range float values are not JSON compliant"),
        (math.inf, "Out of range float values are not JSON compliant"),
        (_self_containing(), "Circular reference detected"),
    ],
    ids=["set", "bytes", "object", "nan", "inf", "self-containing"],
)
def test_a_value_json_cannot_encode_is_an_error_result_not_a_conversion(value: Any, complaint: str) -> None:
    """No str() guess: the model is told the tool returned something JSON cannot hold, and why."""
    outcome = _one_tool(lambda: value).execute(ToolCall("1", "t", {}))
    assert outcome.error is not None
    assert outcome.error.startswith("tool 't' returned a value that cannot be encoded as JSON: ")
    assert complaint in outcome.error


def test_values_json_encodes_its_own_way_are_successes() -> None:
    """Tuples become arrays, as json.dumps does; None is null: no failures (an int dict key is one, see tests/tools)."""
    for value, text in [((1, 2), "[1, 2]"), ({"1": (None,)}, '{"1": [null]}'), (None, "null")]:
        assert _one_tool(lambda v=value: v).execute(ToolCall("1", "t", {})) == fsm_agent.ToolResult(text)


# --- huge output -------------------------------------------------------------------------------------------


def test_default_cap_is_one_hundred_thousand_characters() -> None:
    """A registry cuts a result at 100,000 characters unless told otherwise."""
    assert ToolRegistry().max_output_chars == DEFAULT_MAX_OUTPUT_CHARS == 100_000
    text = "x" * 150_000
    outcome = _one_tool(lambda: text).execute(ToolCall("1", "t", {}))
    encoded = json.dumps(text)
    cut = len(encoded) - 100_000
    marker = f"[truncated: {cut} of {len(encoded)} characters cut, max_output_chars=100000]"
    assert outcome.content == f"{encoded[:100_000]}\n{marker}"
    assert (outcome.ok, outcome.truncated) == (True, cut)


def test_output_within_the_cap_is_untouched_and_none_means_no_cap() -> None:
    """Exactly at the cap nothing is cut; max_output_chars=None never cuts."""
    assert _one_tool(lambda: "x" * 8, max_output_chars=10).execute(ToolCall("1", "t", {})).truncated == 0
    outcome = _one_tool(lambda: "x" * 500_000, max_output_chars=None).execute(ToolCall("1", "t", {}))
    assert (len(outcome.content), outcome.truncated) == (500_002, 0)


def test_a_cut_failure_is_still_a_failure() -> None:
    """An error dict over the cap keeps its failure; the error text is cut with the same marker."""
    outcome = _one_tool(lambda: {"error": "e" * 100}, max_output_chars=20).execute(ToolCall("1", "t", {}))
    assert not outcome.ok
    assert outcome.error == "e" * 20 + "\n[truncated: 80 of 100 characters cut, max_output_chars=20]"
    assert outcome.truncated == len(json.dumps({"error": "e" * 100})) - 20


def test_the_cut_output_reaches_the_model_with_its_marker() -> None:
    """Through a run, the tool message and the step both show the marker, so the model and the trace see the cut."""
    registry = _one_tool(lambda: "y" * 50, name="big", max_output_chars=10)
    result = Agent(FakeModel([tool_turn(tool_call("big")), reply("ok")]), registry).run("q")
    marker = "[truncated: 42 of 52 characters cut, max_output_chars=10]"
    assert result.messages[-2].content.endswith(marker)
    assert result.steps[0].detail.endswith(marker)
    assert result.steps[0].truncated == 42
    assert result.steps[1].truncated == 0


@pytest.mark.parametrize("cap", [0, -1, True, 1.5, "100"])
def test_an_invalid_output_cap_is_rejected_at_construction(cap: Any) -> None:
    """max_output_chars must be a positive integer or None, said with the value."""
    with pytest.raises(ValueError, match=r"max_output_chars must be an integer >= 1, or None for no cap, got "):
        ToolRegistry(max_output_chars=cap)


# --- registration ------------------------------------------------------------------------------------------


def test_a_tool_name_registered_twice_is_refused_and_the_first_tool_stays() -> None:
    """Registering a second tool under a taken name (directly or by decorator) raises and replaces nothing."""
    registry = _one_tool(lambda: "first", name="t")
    with pytest.raises(ValueError, match="a tool named 't' is already registered"):
        registry.register(lambda: "second", name="t")

    with pytest.raises(ValueError, match="a tool named 't' is already registered"):

        @registry.register(name="t")
        def other() -> str:
            return "third"

    assert registry.call(ToolCall("1", "t", {})) == '"first"'


def test_functions_without_hints_or_docstrings_get_the_documented_fallback_schema() -> None:
    """No annotation accepts any JSON value, no docstring is an empty description, **kwargs allows extra keys."""

    def bare(a, b=1, **rest):  # type: ignore[no-untyped-def]
        return [a, b, rest]

    (schema,) = _one_tool(bare, name="bare").schemas()
    assert schema == {
        "name": "bare",
        "description": "",
        "parameters": {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "required": ["a"],
            "additionalProperties": True,
        },
    }
    outcome = _one_tool(bare, name="bare").execute(ToolCall("1", "bare", {"a": {"x": [1]}, "c": None}))
    assert json.loads(outcome.content) == [{"x": [1]}, 1, {"c": None}]


# --- the model misbehaves ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [None, "plain text", {"role": "assistant", "content": "hi"}, Message("assistant", "hi")], ids=repr
)
def test_a_model_returning_something_else_than_a_model_response_is_a_model_error(value: Any) -> None:
    """The run stops with model_error whose message names the type it got; the cause is a TypeError."""
    exc = _stop(Agent(FakeModel([value]), demo_registry()))
    assert exc.reason == "model_error"
    assert exc.evidence["error"] == f"model returned {type(value).__name__}, expected ModelResponse"
    assert isinstance(exc.__cause__, TypeError)
    assert exc.result.messages == (Message("user", "q"),)


def test_an_unknown_stop_reason_is_a_model_error_that_keeps_the_reply() -> None:
    """The reply stays in the messages; the evidence names the value and the reasons the engine knows."""
    exc = _stop(Agent(FakeModel([reply("hm", stop_reason="pause_turn")]), demo_registry()))
    assert exc.reason == "model_error"
    assert exc.evidence["error"].startswith("model returned unknown stop_reason 'pause_turn'; expected one of (")
    assert exc.result.messages[-1] == Message("assistant", "hm")


def test_unknown_stop_reason_keeps_the_asked_calls_pending() -> None:
    """Calls in a reply with an unknown stop_reason were asked and never run, so they are pending; its tokens count."""
    asked = tool_call("echo", text="a")
    odd = ModelResponse(Message("assistant", "", (asked,)), "pause_turn", Usage(7, 3))
    exc = _stop(Agent(FakeModel([odd]), demo_registry()))
    assert exc.reason == "model_error"
    assert (exc.result.pending, exc.result.usage) == ((asked,), Usage(7, 3))


MALFORMED = {
    "message is a str": (ModelResponse("hi"), "ModelResponse.message is a str, expected Message"),  # type: ignore[arg-type]
    "tool call is a str": (
        ModelResponse(Message("assistant", "", ("echo",)), "tool_use"),  # type: ignore[arg-type]
        "a tool call is a str, expected ToolCall",
    ),
    "content is None": (ModelResponse(Message("assistant", None)), "Message.content is a NoneType, expected str"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize(("response", "message"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_model_response_is_a_model_error_before_anything_is_recorded(
    response: ModelResponse, message: str
) -> None:
    """A response of the right class with wrong insides stops with model_error naming the part; nothing is kept."""
    exc = _stop(Agent(FakeModel([response]), demo_registry()))
    assert (exc.reason, exc.evidence["error"]) == ("model_error", message)
    assert exc.result.messages == (Message("user", "q"),)
    assert exc.result.pending == ()


WHOLE = "must be a whole number from 0 to 2**53 - 1, got"
BAD_USAGE = {
    "a tuple": ((1, 2), "ModelResponse.usage is a tuple, expected Usage or None"),
    "null count": (Usage(5, None), f"ModelResponse.usage.output_tokens {WHOLE} None"),  # type: ignore[arg-type]
    "string count": (Usage("5", 1), f"ModelResponse.usage.input_tokens {WHOLE} '5'"),  # type: ignore[arg-type]
    "negative": (Usage(-1, 0), f"ModelResponse.usage.input_tokens {WHOLE} -1"),
    "NaN": (Usage(float("nan"), 0), f"ModelResponse.usage.input_tokens {WHOLE} NaN"),  # type: ignore[arg-type]
    "inf": (Usage(0, float("inf")), f"ModelResponse.usage.output_tokens {WHOLE} inf"),  # type: ignore[arg-type]
    "bool": (Usage(True, 0), f"ModelResponse.usage.input_tokens {WHOLE} True"),
    "past 2**53": (Usage(2**63, 0), f"ModelResponse.usage.input_tokens {WHOLE} {2**63}"),
}


@pytest.mark.parametrize(("usage", "message"), BAD_USAGE.values(), ids=BAD_USAGE)
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_malformed_usage_is_a_model_error_that_keeps_the_reply(usage: Any, message: str, driver: str) -> None:
    """Usage a budget cannot count stops the run (never switches token_budget off); the reply and its calls stay."""
    reply_ = ModelResponse(Message("assistant", "hi", (ToolCall("c1", "echo", {"text": "x"}),)), "tool_use", usage)
    agent = Agent(FakeModel([reply_, reply("never")]), demo_registry(), token_budget=100)
    with pytest.raises(AgentLoopError) as info:
        agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    exc = info.value
    assert (exc.reason, exc.evidence["error"]) == ("model_error", message)
    assert exc.result.messages[-1] == reply_.message
    assert exc.result.pending == reply_.message.tool_calls
    assert exc.result.usage == Usage(0, 0)


# --- invalid limits ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_steps": 0}, r"max_steps must be an integer >= 1, got 0"),
        ({"max_steps": -1}, r"max_steps must be an integer >= 1, got -1"),
        ({"max_steps": None}, r"max_steps must be an integer >= 1, got None"),
        ({"max_steps": 1.0}, r"max_steps must be an integer >= 1, got 1.0"),
        ({"max_consecutive_failures": 0}, r"max_consecutive_failures must be an integer >= 1, got 0"),
        ({"timeout": math.nan}, r"timeout must be a finite number of seconds > 0, got nan"),
        ({"timeout": "10"}, r"timeout must be a finite number of seconds > 0, got '10'"),
        ({"token_budget": -5}, r"token_budget must be an integer >= 1, got -5"),
        ({"max_tool_calls": 2.5}, r"max_tool_calls must be an integer >= 0, got 2.5"),
        ({"cycle_window": 2}, r"cycle_window must be 0 \(off\) or an integer >= 4, got 2"),
        ({"cycle_window": -1}, r"cycle_window must be 0 \(off\) or an integer >= 4, got -1"),
    ],
)
def test_an_invalid_limit_is_a_value_error_at_construction_naming_it(options: dict[str, Any], message: str) -> None:
    """An agent with a limit that could never allow a run, or means nothing, is never built; the model is not called."""
    model = FakeModel([])
    with pytest.raises(ValueError, match=f"^{message}$"):
        Agent(model, demo_registry(), **options)
    assert model.seen == []


# --- interrupts and exits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("signal", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_a_tool_propagates_and_the_run_can_go_on(signal: type[BaseException]) -> None:
    """The interrupt escapes advance(); nothing of the call is recorded; advancing again retries it and finishes."""
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise signal
        return "second time lucky"

    registry = _one_tool(flaky, name="flaky")
    call = tool_call("flaky")
    run = Agent(FakeModel([tool_turn(call), reply("done")]), registry).start("q")
    while run.state is not State.ExecuteTool:
        run.advance()
    trace, messages = list(run.trace), list(run.messages)
    with pytest.raises(signal):
        run.advance()
    assert (run.state, list(run.pending), run.trace, run.messages) == (State.ExecuteTool, [call], trace, messages)
    assert (run.tool_calls, run.steps) == (0, [])
    assert run.finish().final == "done"
    assert [m.content for m in run.messages if m.role == "tool"] == ['"second time lucky"']


def test_an_interrupt_in_the_model_propagates_without_counting_the_turn() -> None:
    """A Ctrl-C during the model call leaves the run in AwaitModel with no turn counted; it can be retried."""

    class Interrupted(FakeModel):
        def complete(self, messages: Any, tools: Any) -> ModelResponse:
            if not self.seen:
                self.seen.append(tuple(messages))
                raise KeyboardInterrupt
            return super().complete(messages, tools)

    model = Interrupted([reply("ignored"), reply("answer")])
    run = Agent(model, demo_registry()).start("q")
    with pytest.raises(KeyboardInterrupt):
        run.advance()
    assert (run.state, run.turns, run.trace, len(run.messages)) == (State.AwaitModel, 0, [], 1)
    assert run.finish().final == "answer"


# --- recursion ---------------------------------------------------------------------------------------------


def test_a_tool_that_recurses_without_end_is_an_error_result() -> None:
    """RecursionError is an Exception like any other: the model is told, and the run goes on."""

    def deep(n: int = 0) -> int:
        return deep(n + 1)

    script = FakeModel([tool_turn(tool_call("deep")), reply("gave up")])
    result = Agent(script, _one_tool(deep, name="deep")).run("q")
    assert result.final == "gave up"
    error = json.loads(result.messages[-2].content)["error"]
    assert error == "tool 'deep' raised RecursionError: maximum recursion depth exceeded"


def test_a_tool_that_runs_its_own_agent_again_and_again_still_ends() -> None:
    """Unbounded re-entry (a tool running the agent it belongs to) ends in RecursionError deep down, handled there."""
    registry = demo_registry()

    class Delegating:
        """Delegates to itself until a tool result comes back, then answers with it."""

        def complete(self, messages: Any, tools: Any) -> ModelResponse:
            if messages[-1].role == "tool":
                return reply("got " + messages[-1].content[:20])
            return tool_turn(ToolCall("d", "delegate", {}))

    agent = Agent(Delegating(), registry)
    depth = [0]

    @registry.register
    def delegate() -> str:
        """Ask the same agent, one level deeper."""
        depth[0] += 1
        return agent.run("one level deeper").final

    result = agent.run("q")
    assert (result.ok, result.trace[-1].dest) == (True, "Done")
    assert depth[0] > 10


# --- resuming (found by test_stateful.py) ------------------------------------------------------------------


def _stopped(agent: Agent) -> fsm_agent.RunResult:
    return _stop(agent).result


def test_a_retried_model_call_stays_within_max_steps() -> None:
    """A model_error at the last allowed step is not retried unless the resume grants another step."""
    script = FakeModel([ConnectionError("provider down"), tool_turn(tool_call("echo", text="a")), reply("x")])
    agent = Agent(script, demo_registry(), max_steps=1)
    stopped = _stopped(agent)
    with pytest.raises(ValueError, match="which these limits do not lift"):
        agent.resume(stopped, retry=True)


def test_retrying_an_unknown_stop_reason_leaves_no_call_unanswered() -> None:
    """After resume(retry=True), every tool call in the conversation has its tool message."""
    odd = ModelResponse(Message("assistant", "", (tool_call("echo", id="x1", text="a"),)), "pause_turn")
    agent = Agent(FakeModel([odd, reply("fine")]), demo_registry())
    result = agent.resume(_stopped(agent), retry=True).finish()
    answered = {m.tool_call_id for m in result.messages if m.role == "tool"}
    assert answered == {"x1"}


def test_resuming_a_cancelled_run_does_not_skip_a_spent_max_steps() -> None:
    """A run stopped by cancel when max_steps was also spent is not resumed by a fresh token alone."""
    token = fsm_agent.CancelToken()
    registry = demo_registry()
    registry.register(lambda: token.cancel("stop") or "ok", name="cancel_now")
    agent = Agent(FakeModel([tool_turn(tool_call("cancel_now")), reply("more")]), registry, max_steps=1)
    with pytest.raises(AgentLoopError) as info:
        agent.run("q", cancel=token)
    assert info.value.reason == "cancelled"
    with pytest.raises(ValueError, match="which these limits do not lift"):
        agent.resume(info.value.result, cancel=fsm_agent.CancelToken())


def test_resuming_a_failed_finalize_of_max_tool_calls_does_not_crash() -> None:
    """A max_tool_calls stop whose finalize call failed resumes with a larger cap instead of crashing."""
    script = FakeModel([tool_turn(tool_call("echo", text="1"), tool_call("echo", text="2")), ConnectionError("down")])
    agent = Agent(script, demo_registry(), max_tool_calls=1, on_stop={"max_tool_calls": "finalize"})
    resumed = agent.resume(_stopped(agent), max_tool_calls=5)
    assert resumed.state is State.AwaitModel


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_resumed_finalize_reply_runs_its_tool_then_stops_on_max_steps_without_another_model_call(driver: str) -> None:
    """``Failed->Dispatch[resumes_before_tool]`` after a finalize call past ``max_steps``: one tool call, no model call.

    The finalize call is the one model call allowed past the limit; its reply
    asked for a tool the cap allows, so the resume runs that call and stops
    before the next model call, with ``turns`` one past ``limit`` as evidence.
    """
    ran: list[float] = []
    registry = demo_registry()
    registry.register(lambda a, b: ran.append(a + b) or a + b, name="sum")
    script = FakeModel([tool_turn(tool_call("echo", text="a")), tool_turn(tool_call("sum", a=0, b=1)), reply("x")])
    agent = Agent(script, registry, max_steps=1, max_tool_calls={"echo": 0}, on_stop={"max_tool_calls": "finalize"})
    stopped = _stopped(agent)
    assert (stopped.reason, stopped.evidence["finalize"]["outcome"]) == ("max_tool_calls", "finalize_failed")
    assert len(script.seen) == 2
    again = agent.resume(stopped)
    with pytest.raises(AgentLoopError) as info:
        again.finish() if driver == "sync" else asyncio.run(again.afinish())
    result = info.value.result
    assert (result.reason, result.evidence["turns"], result.evidence["limit"]) == ("max_steps", 2, 1)
    assert (len(script.seen), ran) == (2, [1])
    assert [t.guard for t in result.trace[-3:]] == ["resumes_before_tool", None, "steps_exhausted"]
