"""What ``str(AgentLoopError)`` says: the reason, the model turn it stopped in, the evidence in one line.

"Step" means one model turn wherever a person reads it, as ``max_steps``
counts them; the message numbers the turn from 1, as the counters do.  A
stop before the run made any model call says so instead of naming a turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import fsm_agent
from fsm_agent import Agent, AgentLoopError, CancelToken, RunResult, StopCondition, ToolCall
from fsm_agent.testing import CounterModel, FakeModel, LoopingModel, demo_registry, reply


def test_a_max_steps_stop_names_the_turn_it_counted_last() -> None:
    """Stopped after three turns by max_steps=3: "in model turn 3", beside turns=3, never "step 2"."""
    with pytest.raises(AgentLoopError) as info:
        fsm_agent.run(CounterModel(), demo_registry(), "count", max_steps=3)
    assert str(info.value) == "max_steps in model turn 3: turns=3, limit=3"
    assert info.value.evidence["step"] == 2  # the evidence keeps the turn's index, as Step.index does


def test_a_repeated_call_names_the_turn_that_repeated_it() -> None:
    """The second turn asks for the first turn's call again: the stop is in model turn 2."""
    same = ToolCall(id="c1", name="echo", arguments={"text": "ping"})
    with pytest.raises(AgentLoopError) as info:
        fsm_agent.run(LoopingModel(same), demo_registry(), "loop", max_steps=8)
    assert str(info.value).startswith("repeated_action in model turn 2: signature=")


# --- a stop before any model call ------------------------------------------------------------------------------


def _before_any_call(go: Callable[[Agent], object], model: FakeModel, **options: Any) -> AgentLoopError:
    """Run ``go(agent)`` to its stop and check that the model was never called; the stop."""
    with pytest.raises(AgentLoopError) as info:
        go(Agent(model, demo_registry(), **options))
    assert model.seen == [], "the model was called"
    return info.value


def _cancelled_token() -> CancelToken:
    token = CancelToken()
    token.cancel("not needed any more")
    return token


def _ticking(*readings: float) -> Callable[[], float]:
    """A clock that reads ``readings`` in turn, then stays at the last."""
    left = list(readings)
    return lambda: left.pop(0) if len(left) > 1 else left[0]


BEFORE_ANY_CALL: dict[str, tuple[Callable[[Agent], object], Callable[[], dict[str, Any]], str, str]] = {
    "cancelled before the start": (
        lambda agent: agent.run("q", cancel=_cancelled_token()),
        dict,
        "cancelled before the first model call: why='not needed any more', state='AwaitModel'",
        "start",
    ),
    "a deadline passed at the start": (
        lambda agent: agent.run("q"),
        lambda: {"timeout": 1, "clock": _ticking(0.0, 100.0)},
        "timeout before the first model call: elapsed=100.0, timeout=1",
        "start",
    ),
    "a deadline passed as the first call was to start": (
        lambda agent: agent.run("q"),
        lambda: {"timeout": 1, "clock": _ticking(0.0, 0.0, 0.0, 100.0)},
        "timeout before the first model call: elapsed=100.0, timeout=1",
        "expired",  # the start checks passed; the time was up before the call could be made
    ),
    "an input guardrail": (
        lambda agent: agent.run("q"),
        lambda: {"stop_conditions": [StopCondition("bad_input", "input", lambda view: True, "the input is refused")]},
        "bad_input before the first model call: condition='check_bad_input', description='the input is refused'",
        "start",
    ),
    "an input guardrail that raises": (
        lambda agent: agent.run("q"),
        lambda: {"stop_conditions": [StopCondition("bad_input", "input", lambda view: 1 / 0, "the input is refused")]},
        "stop_condition_error before the first model call: "
        "condition='check_bad_input', error='division by zero', type='ZeroDivisionError'",
        "start",
    ),
    "an async run cancelled before the start": (
        lambda agent: asyncio.run(agent.arun("q", cancel=_cancelled_token())),
        dict,
        "cancelled before the first model call: why='not needed any more', state='AwaitModel'",
        "start",
    ),
}


@pytest.mark.parametrize(("go", "options", "message", "trigger"), BEFORE_ANY_CALL.values(), ids=BEFORE_ANY_CALL)
def test_a_stop_before_any_model_call_says_so_not_model_turn_1(
    go: Callable[[Agent], object], options: Callable[[], dict[str, Any]], message: str, trigger: str
) -> None:
    """No model call was made: the message says "before the first model call"; the evidence's fields are as before
    (``step`` 0, the ``steps`` counter at 0)."""
    stop = _before_any_call(go, FakeModel([reply("never")]), **options())
    assert str(stop) == message
    assert [(t.source, t.trigger) for t in stop.result.trace] == [("AwaitModel", trigger)]
    assert (stop.evidence["step"], stop.evidence["counters"]["steps"][0]) == (0, 0)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (FakeModel([ConnectionError("down")]), "model_error in model turn 1: error='down', type='ConnectionError'"),
        (FakeModel([reply("cut", stop_reason="max_tokens")]), "max_tokens in model turn 1: stop_reason='max_tokens'"),
    ],
    ids=["a failed first call", "a cut first reply"],
)
def test_a_stop_at_the_first_model_call_is_in_model_turn_1(model: FakeModel, message: str) -> None:
    """The first call was made (it failed, or its reply was cut): it is model turn 1, as the ``steps`` counter says."""
    with pytest.raises(AgentLoopError) as info:
        Agent(model, demo_registry()).run("q")
    assert str(info.value).startswith(message)
    assert info.value.evidence["counters"]["steps"][0] == 1


def test_a_stop_message_of_hand_made_evidence_keeps_its_turn() -> None:
    """An ``AgentLoopError`` built by hand from evidence without counters (and a result without a snapshot) still names
    the turn by ``step``, as before."""
    error = AgentLoopError("mine", RunResult((), (), ""), {"step": 0, "why": "said so"})
    assert str(error) == "mine in model turn 1: why='said so'"
