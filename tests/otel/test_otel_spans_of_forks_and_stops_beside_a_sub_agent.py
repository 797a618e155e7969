"""OpenTelemetry spans of a fork, and of a parallel batch stopped beside a sub-agent's call: exact, all ended.

The real SDK, its in-memory exporter, and a span processor keeping the
spans started and not yet ended, so one left open is seen directly.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from support.counted_calls import Counted
from support.sdk import skip_unless_installed
from support.spans import Spans, attributes
from support.watch_audit import batch_stopped_beside_a_sub_agent

from fsm_agent import Agent, Usage
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

skip_unless_installed("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")

if TYPE_CHECKING:
    pass


def test_a_fork_is_one_run_span_marked_resumed_with_only_its_own_transitions_and_calls(spans: Spans) -> None:
    from fsm_agent.otel import instrument

    script = (
        tool_turn(tool_call("add", id="a1", a=2, b=3), usage=Usage(10, 2)),
        tool_turn(tool_call("add", id="a2", a=5, b=5), usage=Usage(15, 2)),
        reply("10", usage=Usage(20, 3)),
    )
    source = Agent(FakeModel(*script), demo_registry()).run("q", run_id="source")
    again = Agent(FakeModel(reply("other", usage=Usage(7, 1))), demo_registry())
    instrument(again, spans.provider)
    fork = again.fork(source, 3, run_id="fork").finish()
    assert spans.open == {}
    [run_span] = spans.named("invoke_agent")
    [chat] = spans.named("chat")
    assert spans.named("execute_tool") == []  # the fork made no tool call: the source's are not told again
    run = attributes(run_span)
    assert run["gen_ai.conversation.id"] == "fork"
    assert run["fsm_agent.resumed"] is True
    assert chat.parent is not None
    assert chat.parent.span_id == run_span.context.span_id
    edges = [(e.attributes or {}).get("source") for e in run_span.events]
    assert edges == [t.source for t in fork.trace[4:]]
    assert (run["gen_ai.usage.input_tokens"], run["gen_ai.usage.output_tokens"]) == (7, 1)
    assert (run["gen_ai.usage.input_tokens"], run["gen_ai.usage.output_tokens"]) == (
        fork.usage.input_tokens,
        fork.usage.output_tokens,
    )


def test_a_batch_stopped_beside_a_sub_agent_ends_every_span_nested_and_finished(spans: Spans) -> None:
    """Async: the sub-agent and ``quick`` ran beside the stop: their spans end finished, the child's under its call."""
    from fsm_agent.otel import instrument

    tools = Counted()
    agent = batch_stopped_beside_a_sub_agent(tools.registry)
    instrument(agent, spans.provider)
    result = asyncio.run(agent.arun("q", run_id="boss"))
    assert result.reason == "tool_failures"
    assert spans.open == {}
    tools_by_call = {attributes(s)["gen_ai.tool.call.id"]: s for s in spans.named("execute_tool")}
    assert sorted(tools_by_call) == ["f1", "f2", "h3", "q4"]
    for call_id in ("h3", "q4"):
        assert "fsm_agent.unfinished" not in attributes(tools_by_call[call_id])
    for call_id in ("f1", "f2"):
        assert tools_by_call[call_id].status.status_code.name == "ERROR"
    [child] = [s for s in spans.named("invoke_agent") if attributes(s)["gen_ai.conversation.id"] == "boss/h3"]
    assert child.parent is not None
    assert child.parent.span_id == tools_by_call["h3"].context.span_id
    assert attributes(child)["fsm_agent.parent_run_id"] == "boss"
    assert attributes(child)["fsm_agent.stop_reason"] == "done"
    [boss] = [s for s in spans.named("invoke_agent") if attributes(s)["gen_ai.conversation.id"] == "boss"]
    assert attributes(boss)["fsm_agent.stop_reason"] == "tool_failures"
    assert attributes(boss)["gen_ai.usage.input_tokens"] == result.usage.input_tokens
