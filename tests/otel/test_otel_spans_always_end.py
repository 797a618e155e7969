"""OpenTelemetry spans of runs that do not end quietly: cut, cancelled, timed out, parallel, nested, resumed.

Real SDK spans: an in-memory exporter keeps the finished ones and a span
processor of this file keeps every span started and not yet ended, so a
span left open is seen directly, without waiting on anything.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from support.deadline_cuts import DEADLINE
from support.sdk import skip_unless_installed
from support.spans import Spans, attributes

from fsm_agent import Agent, AgentLoopError, CancelToken, RunResult, ToolRegistry, Usage
from fsm_agent.testing import CounterModel, FakeModel, ManualClock, demo_registry, edges, reply, tool_call, tool_turn

skip_unless_installed("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")

if TYPE_CHECKING:
    pass


def traced(agent: Agent, spans: Spans, **options: Any) -> Any:
    from fsm_agent.otel import instrument

    return instrument(agent, spans.provider, **options)


def drive(agent: Agent, driver: str, question: str = "q", **keywords: Any) -> RunResult:
    try:
        if driver == "async":
            return asyncio.run(agent.arun(question, **keywords))
        return agent.run(question, **keywords)
    except AgentLoopError as stop:
        return stop.result


def slow_registry() -> ToolRegistry:
    """``quick(n)`` answers at once; ``slow()`` never answers; ``ctrl_c()`` is a Ctrl-C inside a tool."""
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

    @registry.register
    def ctrl_c() -> str:
        """Raise KeyboardInterrupt, as a Ctrl-C while the tool runs does."""
        raise KeyboardInterrupt

    return registry


BATCH = (tool_call("quick", id="q1", n=1), tool_call("slow", id="s1"), tool_call("quick", id="q2", n=2))


async def cancel_when(task: asyncio.Task[Any], ready: Any) -> None:
    """Cancel ``task`` once ``ready()`` holds (checked between event-loop turns), then wait for it to end."""
    for _ in range(1000):
        if ready():
            break
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --- one span per run, per model call, per tool call ----------------------------------------------------------


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_every_model_and_tool_call_has_one_span_under_its_run(spans: Spans, driver: str) -> None:
    """A span per after_model and per after_tool event, each a child of the run's span, with the call's attributes."""
    model = FakeModel(
        tool_turn(tool_call("add", id="a1", a=1, b=2), tool_call("fail", id="f1"), usage=Usage(7, 3)),
        tool_turn(tool_call("echo", id="e1", text="x"), usage=Usage(11, 5)),
        reply("done", usage=Usage(13, 1)),
    )
    agent = Agent(model, demo_registry())
    traced(agent, spans)
    model_events: list[Any] = []
    tool_events: list[Any] = []
    agent.on("after_model", model_events.append)
    agent.on("after_tool", tool_events.append)
    result = drive(agent, driver)
    assert result.ok
    (run,) = spans.named("invoke_agent")
    chats = sorted(spans.named("chat"), key=lambda span: attributes(span)["fsm_agent.turn"])
    tools = spans.named("execute_tool")
    assert len(chats) == len(model_events) == 3
    assert sorted(attributes(span)["gen_ai.tool.call.id"] for span in tools) == ["a1", "e1", "f1"]
    assert len(tool_events) == 3
    for child in (*chats, *tools):
        assert child.parent is not None
        assert child.parent.span_id == run.context.span_id
    assert [attributes(span)["gen_ai.usage.input_tokens"] for span in chats] == [7, 11, 13]
    assert [attributes(span)["gen_ai.response.finish_reasons"] for span in chats] == [
        ("tool_use",),
        ("tool_use",),
        ("end_turn",),
    ]
    failing = next(span for span in tools if attributes(span)["gen_ai.tool.call.id"] == "f1")
    assert attributes(failing)["error.type"] == "tool_error"
    assert failing.status.status_code.name == "ERROR"
    assert attributes(run)["gen_ai.usage.input_tokens"] == result.usage.input_tokens == 31
    assert attributes(run)["gen_ai.usage.output_tokens"] == result.usage.output_tokens == 9
    assert [dict(event.attributes or {})["dest"] for event in run.events] == [t.dest for t in result.trace]
    assert spans.open == {}


# --- spans end whatever ends the run ----------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_cancel_token_ends_every_span(spans: Spans, driver: str) -> None:
    """A run cancelled between two calls by its token ends its run span in error, nothing left open."""
    token = CancelToken()
    agent = Agent(CounterModel(), demo_registry())
    agent.on("after_tool", lambda event: token.cancel("enough"))
    traced(agent, spans)
    result = drive(agent, driver, cancel=token)
    assert result.reason == "cancelled"
    (run,) = spans.named("invoke_agent")
    assert attributes(run)["fsm_agent.stop_reason"] == "cancelled"
    assert run.status.status_code.name == "ERROR"
    assert len(spans.named("execute_tool")) == 1
    assert spans.open == {}


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_timeout_between_calls_ends_every_span(spans: Spans, driver: str) -> None:
    """The manual clock passes the deadline inside a tool: the run stops on timeout and every span is ended."""
    clock = ManualClock()
    registry = demo_registry()

    @registry.register
    def slow(n: int) -> int:
        """Take n seconds of the manual clock."""
        clock.advance(n)
        return n

    agent = Agent(FakeModel(tool_turn(tool_call("slow", id="w1", n=5)), reply("x")), registry, timeout=4, clock=clock)
    traced(agent, spans)
    result = drive(agent, driver)
    assert result.reason == "timeout"
    (run,) = spans.named("invoke_agent")
    assert attributes(run)["error.type"] == "timeout"
    (tool,) = spans.named("execute_tool")
    assert attributes(tool)["gen_ai.tool.call.id"] == "w1"
    assert spans.open == {}


def test_cancelling_the_task_during_a_model_call_ends_the_chat_span_as_unfinished(spans: Spans) -> None:
    """The model call cut off in flight gets no after_model; its span is ended, marked unfinished."""
    started = asyncio.Event()

    class Hanging:
        def complete(self, messages: object, tools: object) -> Any:
            raise AssertionError("acomplete is awaited")

        async def acomplete(self, messages: object, tools: object) -> Any:
            started.set()
            await asyncio.sleep(3600)

    agent = Agent(Hanging(), demo_registry())
    traced(agent, spans)

    async def main() -> None:
        task = asyncio.ensure_future(agent.arun("q"))
        await cancel_when(task, started.is_set)

    asyncio.run(main())
    (chat,) = spans.named("chat")
    assert attributes(chat)["fsm_agent.unfinished"] is True
    (run,) = spans.named("invoke_agent")
    assert attributes(run)["fsm_agent.stop_reason"] == "cancelled"
    assert spans.open == {}


@pytest.mark.slow  # the run waits for its real deadline (support.deadline_cuts)
def test_a_timeout_in_a_parallel_batch_ends_every_span(spans: Spans) -> None:
    """The deadline passes while one call of a batch hangs: the batch's spans and the run's span are all ended."""
    agent = Agent(FakeModel(tool_turn(*BATCH), reply("x")), slow_registry(), timeout=DEADLINE)
    traced(agent, spans)
    result = drive(agent, "async")
    assert result.reason == "timeout"
    assert sorted(attributes(span)["gen_ai.tool.call.id"] for span in spans.named("execute_tool")) == [
        "q1",
        "q2",
        "s1",
    ]
    assert spans.open == {}


def test_calls_of_a_cancelled_batch_that_finished_are_not_marked_unfinished(spans: Spans) -> None:
    """q1 finished (its result is even in the run's messages); only s1 was cut off in flight."""
    agent = Agent(FakeModel(tool_turn(*BATCH), reply("x")), slow_registry())
    traced(agent, spans)
    run = agent.start("q")

    async def main() -> None:
        task = asyncio.ensure_future(run.afinish())
        await cancel_when(task, lambda: "q2" in run.position.calls.ran)

    asyncio.run(main())
    assert edges(run.result)[-1] == "ExecuteTool->Failed[cancelled]"
    assert ("q1", "1") in [(m.tool_call_id, m.content) for m in run.result.messages if m.role == "tool"]
    assert spans.open == {}
    unfinished = {
        attributes(span)["gen_ai.tool.call.id"]
        for span in spans.named("execute_tool")
        if attributes(span).get("fsm_agent.unfinished")
    }
    assert unfinished == {"s1"}


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_keyboard_interrupt_in_a_tool_leaves_no_span_open(spans: Spans, driver: str) -> None:
    """The interrupt propagates and the run stays unfinished; its spans should still reach the exporter."""
    agent = Agent(FakeModel(tool_turn(tool_call("ctrl_c", id="k1")), reply("x")), slow_registry())
    instrumentation = traced(agent, spans)
    with pytest.raises(KeyboardInterrupt):
        drive(agent, driver)
    assert spans.open == {}
    assert instrumentation._runs == {}


# --- sub-agents and parallel batches -----------------------------------------------------------------------------


def _with_children() -> tuple[Agent, dict[str, Agent]]:
    """A parent whose one turn calls two sub-agents (``alpha``, ``beta``) and then answers."""
    children: dict[str, Agent] = {}
    registry = demo_registry()
    for name in ("alpha", "beta"):
        child = Agent(FakeModel(tool_turn(tool_call("echo", id=f"{name}-e", text=name)), reply(f"{name} ok")), registry)
        children[name] = child
    parent_registry = demo_registry()
    for name, child in children.items():
        parent_registry.register(child.as_tool(name, f"Ask {name}."))
    model = FakeModel(
        tool_turn(tool_call("alpha", id="ca", input="go a"), tool_call("beta", id="cb", input="go b")), reply("both")
    )
    return Agent(model, parent_registry), children


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_each_sub_agent_run_nests_under_the_tool_span_of_its_own_call(spans: Spans, driver: str) -> None:
    """Two sub-agent calls of one turn: each child run span's parent is the execute_tool span that ran it."""
    parent, _ = _with_children()
    traced(parent, spans, agent_name="boss")
    result = drive(parent, driver)
    assert result.final == "both"
    (boss,) = spans.named("invoke_agent boss")
    tool_spans = {attributes(span)["gen_ai.tool.call.id"]: span for span in spans.named("execute_tool")}
    for name, call_id in (("alpha", "ca"), ("beta", "cb")):
        (child_run,) = spans.named(f"invoke_agent {name}")
        calling = tool_spans[call_id]
        assert calling.parent is not None
        assert calling.parent.span_id == boss.context.span_id
        assert child_run.parent is not None
        assert child_run.parent.span_id == calling.context.span_id
        assert child_run.context.trace_id == boss.context.trace_id
        assert attributes(calling)["fsm_agent.child_run_id"] == attributes(child_run)["gen_ai.conversation.id"]
        assert attributes(child_run)["fsm_agent.parent_run_id"] == attributes(boss)["gen_ai.conversation.id"]
        (echo,) = [s for s in spans.named("execute_tool echo") if attributes(s)["gen_ai.tool.call.id"] == f"{name}-e"]
        assert echo.parent is not None
        assert echo.parent.span_id == child_run.context.span_id
    assert spans.open == {}


# --- resumed runs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_resumed_run_span_carries_only_the_transitions_after_its_resume(spans: Spans, driver: str) -> None:
    """The two run spans of a stopped and resumed run split the trace at the resume edge, none twice, none lost."""
    model = FakeModel(tool_turn(tool_call("echo", id="e1", text="a")), tool_turn(tool_call("echo", id="e2", text="b")))
    model.responses.append(reply("done"))
    agent = Agent(model, demo_registry(), max_steps=1)
    traced(agent, spans)
    stopped = drive(agent, driver)
    assert stopped.reason == "max_steps"
    run = agent.resume(stopped, max_steps=4)
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert result.ok
    first, second = sorted(spans.named("invoke_agent"), key=lambda span: span.start_time or 0)
    seen = [dict(event.attributes or {}) for span in (first, second) for event in span.events]
    assert [(e["source"], e["trigger"], e["dest"]) for e in seen] == [
        (t.source, t.trigger, t.dest) for t in result.trace
    ]
    assert attributes(second)["fsm_agent.resumed"] is True
    assert "fsm_agent.resumed" not in attributes(first)
    assert sorted(attributes(span)["gen_ai.tool.call.id"] for span in spans.named("execute_tool")) == ["e1", "e2"]
    assert spans.open == {}
