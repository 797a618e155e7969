"""Exactly once around a batch: a tool that overruns ``tool_timeout``, a model error after it, finalize policies.

Every tool counts its tries and side effects, the model its calls
(``support.inflight_stops``): no call of the batch is made again by a retry,
a finalize or a new owner, and each finalize or retried model call is made
once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from support.exactly_once import WAIT, Effects, resumed_by_new_owner
from support.inflight_stops import DEADLINE, FailsOnce, Hold, answer, batch, make_agent

from fsm_agent import Agent, AgentLoopError, RunResult
from fsm_agent.persist import open_store
from fsm_agent.testing import ManualClock, edges

DRIVERS = ["sync", "async"]
ABC = ("a", "b", "c")
ABCD = ("a", "b", "c", "d")
TOOL_DEADLINE = 1.0
"""``tool_timeout`` (real seconds): the trivial calls of a batch finish far inside it, beside a CPU hog too (they are
done within 0.12 s of the run's start at worst under two hogs: ``support.inflight_stops.DEADLINE``)."""


def _ran(agent: Agent, driver: str, **options: object) -> RunResult:
    """``agent``'s run of "go" on ``driver``: its result, or the result its stop carries."""
    try:
        if driver == "sync":
            return agent.run("go", **options)  # type: ignore[arg-type]
        return asyncio.run(agent.arun("go", **options))  # type: ignore[arg-type]
    except AgentLoopError as stop:
        return stop.result


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# --- tool_timeout: an overrunning call of a batch is an error result, never made again ---------------------------


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("tool", ["work", "swork"])
def test_a_call_of_a_batch_overrunning_tool_timeout_is_an_error_result_a_new_owner_never_makes_again(
    store_target: str, driver: str, resumer: str, tool: str
) -> None:
    """c overruns: its result is the timeout error; an async c is cancelled before its effect, a sync one runs
    on in its thread to its effect, once; the run stops on max_steps, and the new owner makes no tool call."""
    effects = Effects()
    hold = Hold(effects, "c", after=("a", "b"))
    agent = make_agent(effects, ABC, hold, tool=tool, tool_timeout=TOOL_DEADLINE, max_steps=1)
    try:
        with open_store(store_target) as store:
            stopped = _ran(agent, driver, store=store, run_id="r")
    finally:
        hold.release(complete=True)  # a sync c, abandoned at its deadline, goes on to its side effect
    assert stopped.reason == "max_steps"
    timed_out = f'{{"error": "tool \'{tool}\' timed out after {TOOL_DEADLINE:g} s"}}'
    assert [m.content for m in stopped.messages if m.role == "tool"] == ['"a ok"', '"b ok"', timed_out]
    if tool == "swork":
        _wait_for(lambda: effects.done["c"] == 1, "the abandoned sync call never finished")
    owner = make_agent(effects, ABC, tool=tool, tool_timeout=TOOL_DEADLINE, max_steps=1)
    result = resumed_by_new_owner(store_target, "r", resumer, owner, max_steps=3)
    assert result.final == f'done: "a ok", "b ok", {timed_out}'
    assert effects.tries == {"a": 1, "b": 1, "c": 1}  # the overrun call is never made again
    assert dict(effects.done) == ({"a": 1, "b": 1, "c": 1} if tool == "swork" else {"a": 1, "b": 1})
    assert effects.parent_model == 2


# --- model_error after a batch: retry=True calls the model once more, no tool again ------------------------------


@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_model_error_after_a_batch_is_retried_by_a_new_owner_with_one_model_call_and_no_tool_call(
    store_target: str, driver: str, resumer: str
) -> None:
    """The model raises on the call after the batch; resume(retry=True) makes that model call once, no tool."""
    effects = Effects()
    tool = "work" if driver == "async" else "swork"
    agent = make_agent(effects, ABC, tool=tool, model=FailsOnce(batch(ABC, tool), effects))
    with open_store(store_target) as store:
        stopped = _ran(agent, driver, store=store, run_id="r")
        assert store.load("r")["reason"] == "model_error"
    assert stopped.reason == "model_error"
    assert (dict(effects.done), effects.parent_model) == ({"a": 1, "b": 1, "c": 1}, 2)
    owner = make_agent(effects, ABC, tool=tool)
    result = resumed_by_new_owner(store_target, "r", resumer, owner, retry=True)
    assert result.final == answer(ABC)
    assert "Failed->AwaitModel[retries_model_call]" in edges(result)
    assert effects.tries == {"a": 1, "b": 1, "c": 1}
    assert effects.parent_model == 3  # the batch's reply, the failed call, the one retry


# --- finalize policies whose stop lands in the middle of a batch ------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_max_tool_calls_finalize_in_a_batch_makes_one_finalize_call_and_never_the_calls_past_the_cap(
    driver: str,
) -> None:
    """Cap 2 in a batch of 4: a and b run once, c and d never, and the finalize is one model call."""
    effects = Effects()
    tool = "work" if driver == "async" else "swork"
    agent = make_agent(effects, ABCD, tool=tool, max_tool_calls=2, on_stop={"max_tool_calls": "finalize"})
    result = _ran(agent, driver)
    assert (result.reason, result.evidence["finalize"]) == ("max_tool_calls", {"outcome": "answered"})
    assert effects.tries == {"a": 1, "b": 1}
    assert effects.parent_model == 2


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_deadline_passed_during_a_batch_that_completed_is_finalized_once_on_both_drivers(driver: str) -> None:
    """c (the clock moved past the timeout while it ran) completes: on_stop timeout=finalize makes one finalize
    call, after the batch, without making any call of the batch again."""
    effects = Effects()
    clock = ManualClock()
    hold = Hold(effects, "c", after=("a", "b"), then=lambda: clock.advance(100), stay=False)
    tool = "work" if driver == "async" else "swork"
    agent = make_agent(effects, ABCD, hold, tool=tool, timeout=60, clock=clock, on_stop={"timeout": "finalize"})
    result = _ran(agent, driver)
    assert result.reason == "timeout"
    assert result.evidence["finalize"] == {"outcome": "answered"}
    assert effects.parent_model == 2
    assert max(effects.tries.values()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_deadline_cutting_a_batch_with_finalize_policy_makes_no_finalize_call_and_a_resume_makes_only_the_cut_call(
    store_target: str, resumer: str
) -> None:
    """The expired edge takes no finalize (decisions.md): the stop stands, no model call; a new owner makes c once."""
    effects = Effects()
    agent = make_agent(
        effects, ABC, Hold(effects, "c", after=("a", "b")), timeout=DEADLINE, on_stop={"timeout": "finalize"}
    )
    with open_store(store_target) as store, pytest.raises(AgentLoopError) as stop:
        asyncio.run(agent.arun("go", store=store, run_id="r"))
    assert (stop.value.reason, stop.value.evidence["unfinished"]) == ("timeout", "c")
    assert "finalize" not in stop.value.evidence
    assert (dict(effects.done), effects.parent_model) == ({"a": 1, "b": 1}, 1)
    owner = make_agent(effects, ABC, timeout=DEADLINE, on_stop={"timeout": "finalize"})
    result = resumed_by_new_owner(store_target, "r", resumer, owner, timeout=60)
    assert (result.reason, result.final) == ("done", answer(ABC))
    assert dict(effects.done) == {"a": 1, "b": 1, "c": 1}
    assert effects.tries == {"a": 1, "b": 1, "c": 2}
    assert effects.parent_model == 2
