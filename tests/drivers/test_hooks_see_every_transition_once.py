"""Hooks see a run whole: every transition once and in order, every call's before and after, on both drivers.

Each scenario is run with a recorder on every hook name; the recording is
then checked against the run's own result (trace, messages, steps, usage),
so a transition, call or tool result that hooks miss, or see twice, fails.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from typing_extensions import TypedDict

from fsm_agent import Agent, AgentLoopError, CallEvent, RunResult, ToolRegistry, TransitionEvent, Usage
from fsm_agent.observe.events import HOOK_NAMES
from fsm_agent.testing import FakeModel, LoopingModel, demo_registry, edges, reply, tool_call, tool_turn


class Point(TypedDict):
    x: int


def _batch_then_answer() -> Agent:
    model = FakeModel(
        tool_turn(
            tool_call("add", id="a1", a=1, b=2),
            tool_call("fail", id="f1", reason="no"),
            tool_call("echo", id="e1", text="😀 \ud83d"),
            usage=Usage(10, 3),
        ),
        tool_turn(tool_call("echo", id="e2", text="again"), usage=Usage(20, 4)),
        reply("done", usage=Usage(30, 5)),
    )
    return Agent(model, demo_registry())


SCENARIOS: dict[str, Callable[[], Agent]] = {
    "batch_then_answer": _batch_then_answer,
    "max_tool_calls_in_a_batch": lambda: Agent(
        FakeModel(tool_turn(*(tool_call("echo", id=f"c{i}", text=str(i)) for i in range(4))), reply("x")),
        demo_registry(),
        max_tool_calls=2,
    ),
    "max_tokens": lambda: Agent(FakeModel(reply("cut", stop_reason="max_tokens")), demo_registry()),
    "model_error": lambda: Agent(
        FakeModel(tool_turn(tool_call("echo", id="e1", text="a")), RuntimeError("down")), demo_registry()
    ),
    "finalize": lambda: Agent(
        FakeModel(tool_turn(tool_call("echo", id="e1", text="a"), tool_call("echo", id="e2", text="b")), reply("fin")),
        demo_registry(),
        max_tool_calls=1,
        on_stop={"max_tool_calls": "finalize"},
    ),
    "typed_retry": lambda: Agent(
        FakeModel(reply("not json", usage=Usage(1, 1)), reply('{"x": 1}', usage=Usage(2, 2))),
        demo_registry(),
        output_type=Point,
    ),
    "repeated_action": lambda: Agent(LoopingModel(tool_call("echo", id="same", text="x")), demo_registry()),
}


def recorded(agent: Agent) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []
    for name in HOOK_NAMES:
        agent.on(name, lambda event, name=name: seen.append((name, event)))
    return seen


def drive(agent: Agent, driver: str) -> RunResult:
    try:
        return agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    except AgentLoopError as stop:
        return stop.result


def check_against_result(seen: list[tuple[str, Any]], result: RunResult) -> None:
    """What hooks saw is the run: trace, hook order per edge, calls paired, results and usage as recorded."""
    transitions = [event for name, event in seen if name == "transition"]
    assert [event.transition for event in transitions] == list(result.trace)
    assert [event.seq for event in transitions] == list(range(len(result.trace)))
    # For each edge: leave, enter, transition, then failed on an edge into Failed; nothing else in between.
    edge_hooks = [(name, event) for name, event in seen if isinstance(event, TransitionEvent)]
    position = 0
    for event in transitions:
        expected = [f"leave:{event.source}", f"enter:{event.dest}", "transition"]
        if event.dest == "Failed":
            expected.append("failed")
        group = edge_hooks[position : position + len(expected)]
        assert [name for name, _ in group] == expected
        assert all(other is event for _, other in group)
        position += len(expected)
    assert position == len(edge_hooks)
    assert [event.result for event in transitions[:-1]] == [None] * (len(transitions) - 1)
    assert transitions[-1].result == result
    if transitions[-1].dest == "Failed":
        assert transitions[-1].evidence == result.evidence
    # Model calls: before/after alternate, one pair per call, turns counted 1, 2, ...
    model_hooks = [(name, event) for name, event in seen if name in ("before_model", "after_model")]
    assert [name for name, _ in model_hooks] == ["before_model", "after_model"] * (len(model_hooks) // 2)
    afters = [event for name, event in model_hooks if name == "after_model"]
    assert [event.turn for event in afters] == list(range(1, len(afters) + 1))
    replies = [event.response for event in afters if event.response is not None]
    assert [r.message.content for r in replies] == [m.content for m in result.messages if m.role == "assistant"]
    used = [r.usage for r in replies if r.usage is not None]
    assert sum(u.input_tokens for u in used) == result.usage.input_tokens
    assert sum(u.output_tokens for u in used) == result.usage.output_tokens
    # Tool calls: one before and one after per call that was dealt with, its result the tool message's content.
    befores = Counter(event.tool_call.id for name, event in seen if name == "before_tool")
    after_tool = [event for name, event in seen if name == "after_tool"]
    assert befores == Counter(event.tool_call.id for event in after_tool)
    assert set(befores.values()) <= {1} or result.reason == "repeated_action"
    answered = [(m.tool_call_id, m.content) for m in result.messages if m.role == "tool"]
    assert [(event.tool_call.id, event.tool_result) for event in after_tool] == answered[: len(after_tool)]
    assert len(after_tool) == sum(1 for step in result.steps if step.kind == "tool_call")
    # The edge out of ExecuteTool carries the same call and result as its after_tool event.
    outs = [event for event in transitions if event.source == "ExecuteTool" and event.tool_result is not None]
    assert [(e.tool_call.id, e.tool_result, e.tool_error) for e in outs] == [
        (e.tool_call.id, e.tool_result, e.tool_error) for e in after_tool
    ]


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_hooks_see_each_transition_and_call_once_in_order(driver: str, name: str) -> None:
    agent = SCENARIOS[name]()
    seen = recorded(agent)
    result = drive(agent, driver)
    check_against_result(seen, result)


def test_the_calls_of_a_parallel_batch_each_get_one_before_and_one_after() -> None:
    """Three calls that only finish once all three started: every before_tool precedes any after_tool, once each."""
    registry = ToolRegistry()
    barrier = threading.Barrier(3, timeout=5)

    @registry.register
    def meet(n: int) -> int:
        """Wait for the other calls of the turn."""
        barrier.wait()
        return n

    calls = [tool_call("meet", id=f"m{i}", n=i) for i in range(3)]
    agent = Agent(FakeModel(tool_turn(*calls), reply("met")), registry)
    seen = recorded(agent)
    result = asyncio.run(agent.arun("q"))
    assert result.final == "met"
    check_against_result(seen, result)
    tool_hooks = [(name, event.tool_call.id) for name, event in seen if name in ("before_tool", "after_tool")]
    assert sorted(tool_hooks[:3]) == [("before_tool", "m0"), ("before_tool", "m1"), ("before_tool", "m2")]
    assert tool_hooks[3:] == [("after_tool", "m0"), ("after_tool", "m1"), ("after_tool", "m2")]


def _hanging_batch() -> tuple[Agent, ToolRegistry]:
    registry = ToolRegistry()

    @registry.register
    async def quick(n: int) -> int:
        """Return n at once."""
        return n

    @registry.register
    async def slow() -> str:
        """Hang."""
        await asyncio.sleep(3600)
        return "late"

    calls = [tool_call("quick", id="q1", n=1), tool_call("slow", id="s1"), tool_call("quick", id="q2", n=2)]
    return Agent(FakeModel(tool_turn(*calls), reply("x")), registry), registry


def test_a_cancelled_batch_reports_the_calls_that_finished() -> None:
    """q1 and q2 ran to the end before the cancel; hooks heard them start, and must hear them end."""
    agent, _ = _hanging_batch()
    seen = recorded(agent)
    run = agent.start("q")

    async def main() -> None:
        task = asyncio.ensure_future(run.afinish())
        for _ in range(1000):
            if "q2" in run.position.calls.ran:
                break
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert edges(run.result)[-1] == "ExecuteTool->Failed[cancelled]"
    assert ("q1", "1") in [(m.tool_call_id, m.content) for m in run.result.messages if m.role == "tool"]
    started = {event.tool_call.id for name, event in seen if name == "before_tool"}
    ended = {event.tool_call.id for name, event in seen if isinstance(event, CallEvent) and name == "after_tool"}
    assert started == {"q1", "s1", "q2"}
    assert ended == {"q1", "q2"}


def test_a_batch_cut_by_its_deadline_reports_the_calls_that_finished() -> None:
    agent, registry = _hanging_batch()
    agent = Agent(agent.model, registry, timeout=0.05)
    seen = recorded(agent)
    result = drive(agent, "async")
    assert result.reason == "timeout"
    assert ("q1", "1") in [(m.tool_call_id, m.content) for m in result.messages if m.role == "tool"]
    ended = {event.tool_call.id for name, event in seen if name == "after_tool"}
    assert ended == {"q1", "q2"}


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_run_left_by_a_keyboard_interrupt_is_heard_as_unfinished_once(driver: str) -> None:
    """Ctrl-C in a tool leaves the run where it was: ``unfinished`` once, naming it; no transition into Failed."""
    registry = demo_registry()

    def ctrl_c() -> str:
        """Stands for a person pressing Ctrl-C."""
        raise KeyboardInterrupt

    registry.register(ctrl_c)
    agent = Agent(FakeModel(tool_turn(tool_call("ctrl_c", id="k1")), reply("never")), registry)
    seen = recorded(agent)
    run = agent.start("q")
    with pytest.raises(KeyboardInterrupt):
        run.finish() if driver == "sync" else asyncio.run(run.afinish())
    left = [event for name, event in seen if name == "unfinished"]
    assert [(event.kind, event.error, event.run_id) for event in left] == [
        ("unfinished", "KeyboardInterrupt: ", run.run_id)
    ]
    assert not run.done
    assert "failed" not in [name for name, _ in seen]
    assert [name for name, _ in seen][-1] == "unfinished"


def test_a_run_that_ends_is_never_heard_as_unfinished() -> None:
    """A stop raised as ``AgentLoopError`` comes after the run ended: no ``unfinished``."""
    agent = Agent(FakeModel(reply("cut", stop_reason="max_tokens")), demo_registry())
    seen = recorded(agent)
    with pytest.raises(AgentLoopError):
        agent.run("q")
    assert "unfinished" not in [name for name, _ in seen]
