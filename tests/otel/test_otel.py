"""OpenTelemetry tracing: real SDK spans caught by its in-memory exporter, for the sync and the async driver."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support.scenarios import OVERFLOW, POINT, with_failing_child
from support.sdk import skip_unless_installed

from fsm_agent import Agent, AgentLoopError, CancelToken, Price, RunContext, RunResult, ToolRegistry, Usage
from fsm_agent.definition.stops import CATALOGUE
from fsm_agent.testing import (
    CounterModel,
    FakeModel,
    LoopingModel,
    ManualClock,
    demo_registry,
    reply,
    tool_call,
    tool_turn,
)

skip_unless_installed("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    Traced = tuple[InMemorySpanExporter, TracerProvider]


class NamedModel(FakeModel):
    """A scripted model with a model name, as the provider adapters have."""

    model = "scripted-1"


@pytest.fixture
def traced() -> Traced:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


def finish(agent: Agent, question: str, *, driver: str, cancel: CancelToken | None = None) -> RunResult:
    """Run to the end with the sync or the async driver; a stop's result instead of its exception."""
    try:
        if driver == "async":
            return asyncio.run(agent.arun(question, cancel=cancel))
        return agent.run(question, cancel=cancel)
    except AgentLoopError as exc:
        return exc.result


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def span_tree(spans: Sequence[ReadableSpan]) -> str:
    """The spans as an indented tree, children in start order, with each span's status and key attributes."""
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        parent = span.parent.span_id if span.parent is not None else None
        children.setdefault(parent, []).append(span)
    keys = ("gen_ai.tool.call.id", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "fsm_agent.stop_reason")
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in children.get(parent, []):
            attributes = span.attributes or {}
            shown = " ".join(f"{k.rsplit('.', 1)[-1]}={attributes[k]}" for k in keys if k in attributes)
            status = span.status.status_code.name
            lines.append(f"{'  ' * depth}{span.name} [{status}] {shown}".rstrip())
            for event in span.events if depth == 0 else ():
                a = event.attributes or {}
                reason = f" ({a['reason']})" if "reason" in a else ""
                lines.append(f"{'  ' * (depth + 1)}* {a['source']} --{a['trigger']}--> {a['dest']}{reason}")
            walk(span.context.span_id if span.context else None, depth + 1)

    walk(None, 0)
    return "\n".join(lines)


def test_a_run_is_one_invoke_agent_span_with_chat_and_tool_children(traced: Traced) -> None:
    """The run span parents every chat and execute_tool span; the conventions' attributes are set."""
    from opentelemetry.trace import StatusCode

    from fsm_agent.otel import instrument

    exporter, provider = traced
    model = NamedModel(
        tool_turn(tool_call("add", id="c1", a=2, b=3), usage=Usage(10, 4)),
        reply("5", usage=Usage(20, 2)),
    )
    agent = Agent(model, demo_registry())
    instrument(agent, provider, agent_name="calculator")
    result = agent.run("2+3?")
    spans = by_name(exporter.get_finished_spans())
    assert sorted(spans) == ["chat scripted-1", "execute_tool add", "invoke_agent calculator"]
    (run,) = spans["invoke_agent calculator"]
    chats, (tool,) = spans["chat scripted-1"], spans["execute_tool add"]
    assert len(chats) == 2
    for child in (*chats, tool):
        assert child.parent is not None
        assert child.parent.span_id == run.context.span_id
        assert child.context.trace_id == run.context.trace_id
    assert run.attributes is not None
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.agent.name"] == "calculator"
    assert run.attributes["gen_ai.request.model"] == "scripted-1"
    assert run.attributes["gen_ai.usage.input_tokens"] == 30
    assert run.attributes["gen_ai.usage.output_tokens"] == 6
    assert run.attributes["fsm_agent.stop_reason"] == "done"
    assert run.attributes["fsm_agent.final_state"] == "Done"
    assert run.attributes["fsm_agent.counters.steps"] == 2
    assert run.attributes["fsm_agent.limits.steps"] == 8
    assert run.status.status_code is StatusCode.UNSET
    assert chats[0].attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "scripted-1",
        "fsm_agent.turn": 1,
        "gen_ai.response.finish_reasons": ("tool_use",),
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 4,
    }
    assert tool.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "add",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.type": "function",
    }
    events = [(e.name, dict(e.attributes or {})) for e in run.events]
    assert [a["source"] + "->" + a["dest"] for _, a in events] == [f"{t.source}->{t.dest}" for t in result.trace]
    assert {name for name, _ in events} == {"transition"}


def test_the_span_tree_of_a_run_with_a_failing_tool_and_an_answer(traced: Traced) -> None:
    """One whole trace as text: the run, its calls in order, the machine's edges as events on the run span."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    model = NamedModel(
        tool_turn(tool_call("fail", id="c1"), usage=Usage(12, 5)),
        tool_turn(tool_call("add", id="c2", a=2, b=3), usage=Usage(30, 6)),
        reply("(2+3) = 5", usage=Usage(41, 7)),
    )
    agent = Agent(model, demo_registry())
    instrument(agent, provider, agent_name="calculator")
    agent.run("what is 2+3?")
    assert span_tree(exporter.get_finished_spans()) == "\n".join(
        [
            "invoke_agent calculator [UNSET] input_tokens=83 output_tokens=18 stop_reason=done",
            "  * AwaitModel --replied--> CheckTruncation",
            "  * CheckTruncation --check--> Dispatch",
            "  * Dispatch --dispatch--> ExecuteTool",
            "  * ExecuteTool --tool_done--> AwaitModel",
            "  * AwaitModel --replied--> CheckTruncation",
            "  * CheckTruncation --check--> Dispatch",
            "  * Dispatch --dispatch--> ExecuteTool",
            "  * ExecuteTool --tool_done--> AwaitModel",
            "  * AwaitModel --replied--> CheckTruncation",
            "  * CheckTruncation --check--> Dispatch",
            "  * Dispatch --dispatch--> Done",
            "  chat scripted-1 [UNSET] input_tokens=12 output_tokens=5",
            "  execute_tool fail [ERROR] id=c1",
            "  chat scripted-1 [UNSET] input_tokens=30 output_tokens=6",
            "  execute_tool add [UNSET] id=c2",
            "  chat scripted-1 [UNSET] input_tokens=41 output_tokens=7",
        ]
    )


def test_parallel_tool_calls_of_the_async_driver_are_concurrent_siblings(traced: Traced) -> None:
    """The calls of one async turn run at once, so their spans overlap; all are children of the run span."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    registry = ToolRegistry()

    @registry.register
    async def nap(n: int) -> int:
        """Sleep a little."""
        await asyncio.sleep(0.05)
        return n

    model = FakeModel(tool_turn(*(tool_call("nap", id=f"n{i}", n=i) for i in range(3))), reply("rested"))
    agent = Agent(model, registry)
    instrument(agent, provider)
    asyncio.run(agent.arun("rest"))
    spans = by_name(exporter.get_finished_spans())
    naps = spans["execute_tool nap"]
    (run,) = spans["invoke_agent"]
    assert sorted((s.attributes or {})["gen_ai.tool.call.id"] for s in naps) == ["n0", "n1", "n2"]
    assert {s.parent.span_id for s in naps if s.parent} == {run.context.span_id}
    latest_start = max(s.start_time or 0 for s in naps)
    earliest_end = min(s.end_time or 0 for s in naps)
    assert latest_start < earliest_end  # every call had started before any ended


def _slow_registry(clock: ManualClock) -> ToolRegistry:
    registry = demo_registry()

    @registry.register
    def slow(n: int) -> int:
        """Take n seconds of the manual clock."""
        clock.advance(n)
        return n

    return registry


def _raise(event: object) -> None:
    raise RuntimeError("observer broke")


def _hook_error(clock: ManualClock) -> tuple[Agent, CancelToken | None]:
    agent = Agent(FakeModel(reply("fine")), demo_registry(), strict_hooks=True)
    agent.on("after_model", _raise)
    return agent, None


def _cancelled(clock: ManualClock) -> tuple[Agent, CancelToken | None]:
    token = CancelToken()
    token.cancel("enough")
    return Agent(CounterModel(), demo_registry()), token


def _echo_turn(*texts: str, usage: Usage | None = None) -> Any:
    return tool_turn(*(tool_call("echo", text=t) for t in texts), usage=usage)


Scenario = Callable[[ManualClock], tuple[Agent, CancelToken | None]]


def _scripted(*script: Any, **options: Any) -> Scenario:
    """A scenario of a fresh ``FakeModel`` with ``script`` and the demo tools."""
    return lambda clock: (Agent(FakeModel(*script), demo_registry(), **options), None)


def _timeout(clock: ManualClock) -> tuple[Agent, CancelToken | None]:
    return Agent(FakeModel(tool_turn(tool_call("slow", n=5))), _slow_registry(clock), timeout=4, clock=clock), None


SCENARIOS: dict[str, tuple[Scenario, str]] = {
    # reason: (a run that stops with it, the run's resulting reason)
    "context_overflow": (_scripted(OVERFLOW), "context_overflow"),
    "child_stopped": (
        lambda c: (
            Agent(FakeModel(tool_turn(tool_call("research", input="?"))), with_failing_child(demo_registry())),
            None,
        ),
        "child_stopped",
    ),
    "model_error": (_scripted(RuntimeError("down")), "model_error"),
    "hook_error": (_hook_error, "hook_error"),
    "max_tokens": (_scripted(reply("cu", stop_reason="max_tokens")), "max_tokens"),
    "refusal": (_scripted(reply("no", stop_reason="refusal")), "refusal"),
    "output_invalid": (_scripted(reply("not json"), reply("still not"), output_type=POINT), "output_invalid"),
    # A failed finalize leaves the stop that asked for it standing.
    "finalize_failed": (
        _scripted(_echo_turn("a"), _echo_turn("b"), max_steps=1, on_stop={"max_steps": "finalize"}),
        "max_steps",
    ),
    "cancelled": (_cancelled, "cancelled"),
    "timeout": (_timeout, "timeout"),
    "repeated_action": (
        lambda c: (Agent(LoopingModel(tool_call("echo", text="x")), demo_registry()), None),
        "repeated_action",
    ),
    "max_tool_calls": (_scripted(_echo_turn("a", "b"), max_tool_calls=1), "max_tool_calls"),
    "tool_failures": (_scripted([tool_turn(tool_call("fail", reason=str(i))) for i in range(3)]), "tool_failures"),
    "cycle": (_scripted(_echo_turn("a", "b", "a", "b")), "cycle"),
    "token_budget": (_scripted(_echo_turn("a", usage=Usage(5, 5)), token_budget=10), "token_budget"),
    "cost_budget": (
        _scripted(_echo_turn("a", usage=Usage(5, 5)), cost_budget=0.01, prices=Price(1000, 1000)),
        "cost_budget",
    ),
    "max_steps": (lambda c: (Agent(CounterModel(), demo_registry(), max_steps=2), None), "max_steps"),
}


def test_every_stop_of_the_catalogue_has_a_tracing_scenario() -> None:
    """Adding a stop to the catalogue without a scenario here fails."""
    assert set(SCENARIOS) == {stop.reason for stop in CATALOGUE}


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("reason", [stop.reason for stop in CATALOGUE])
def test_a_stop_ends_the_run_span_in_error_with_its_reason(traced: Traced, reason: str, driver: str) -> None:
    """The run span's status is error with the reason; the stop's edge is an event; counters meet their limits."""
    from opentelemetry.trace import StatusCode

    from fsm_agent.otel import instrument

    exporter, provider = traced
    scenario, expected = SCENARIOS[reason]
    agent, token = scenario(ManualClock())
    instrument(agent, provider)
    result = finish(agent, "go", driver=driver, cancel=token)
    assert result.reason == expected
    (run,) = by_name(exporter.get_finished_spans())["invoke_agent"]
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == expected
    assert run.attributes is not None
    assert run.attributes["error.type"] == expected
    assert run.attributes["fsm_agent.stop_reason"] == expected
    assert run.attributes["fsm_agent.final_state"] == "Failed"
    assert run.attributes["fsm_agent.limits.steps"] == agent.limits.max_steps
    reasons = [(e.attributes or {}).get("reason") for e in run.events]
    assert reason in reasons
    assert len(run.events) == len(result.trace)


def test_a_priced_call_and_its_run_carry_their_cost_in_dollars(traced: Traced) -> None:
    """Each chat span has its call's cost; the run span the run's, beside its budget; unpriced, no cost at all."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    script = (_echo_turn("a", usage=Usage(5, 5)), reply("done", usage=Usage(20, 10)))
    agent = Agent(FakeModel(*script), demo_registry(), cost_budget=1, prices=Price(1000, 1000))
    instrument(agent, provider)
    agent.run("go")
    spans = by_name(exporter.get_finished_spans())
    assert [(span.attributes or {})["fsm_agent.usage.cost"] for span in spans["chat"]] == [0.01, 0.03]
    (run,) = spans["invoke_agent"]
    assert run.attributes is not None
    assert (run.attributes["fsm_agent.counters.cost"], run.attributes["fsm_agent.limits.cost"]) == (0.04, 1.0)
    exporter.clear()
    unpriced = Agent(FakeModel(*script), demo_registry())
    instrument(unpriced, provider)
    unpriced.run("go")
    spans = by_name(exporter.get_finished_spans())
    assert all("fsm_agent.usage.cost" not in (span.attributes or {}) for span in spans["chat"])
    assert "fsm_agent.counters.cost" not in (spans["invoke_agent"][0].attributes or {})


def test_failed_model_and_tool_calls_mark_their_own_spans(traced: Traced) -> None:
    """A tool's error result and a model call that raised each set error status on their span."""
    from opentelemetry.trace import StatusCode

    from fsm_agent.otel import instrument

    exporter, provider = traced
    agent = Agent(FakeModel(tool_turn(tool_call("fail", reason="quota")), RuntimeError("gone")), demo_registry())
    instrument(agent, provider)
    finish(agent, "go", driver="sync")
    spans = by_name(exporter.get_finished_spans())
    (tool,) = spans["execute_tool fail"]
    assert tool.status.status_code is StatusCode.ERROR
    assert tool.status.description == "quota"
    failed_chat = spans["chat"][1]
    assert failed_chat.status.status_code is StatusCode.ERROR
    assert (failed_chat.attributes or {})["error.type"] == "RuntimeError"


def test_content_is_recorded_only_when_asked(traced: Traced) -> None:
    """Without capture_content no span holds the question, arguments, results or answer; with it, they are there."""
    from fsm_agent.otel import instrument

    exporter, provider = traced

    def go(capture: bool) -> list[ReadableSpan]:
        exporter.clear()
        model = FakeModel(tool_turn(tool_call("echo", text="secret-arg")), reply("secret-answer"))
        agent = Agent(model, demo_registry())
        instrument(agent, provider, capture_content=capture)
        agent.run("secret-question")
        return list(exporter.get_finished_spans())

    def everything(spans: list[ReadableSpan]) -> str:
        return json.dumps([dict(s.attributes or {}) for s in spans], default=str)

    assert "secret" not in everything(go(capture=False))
    spans = by_name(go(capture=True))
    (run,) = spans["invoke_agent"]
    assert run.attributes is not None
    assert json.loads(str(run.attributes["gen_ai.input.messages"]))[0]["parts"][0]["content"] == "secret-question"
    assert json.loads(str(run.attributes["gen_ai.output.messages"]))[0]["parts"][0]["content"] == "secret-answer"
    (tool,) = spans["execute_tool echo"]
    assert tool.attributes is not None
    assert json.loads(str(tool.attributes["gen_ai.tool.call.arguments"])) == {"text": "secret-arg"}
    assert tool.attributes["gen_ai.tool.call.result"] == '"secret-arg"'
    reply_parts = json.loads(str((spans["chat"][1].attributes or {})["gen_ai.output.messages"]))
    assert reply_parts[0]["finish_reason"] == "end_turn"


@pytest.mark.parametrize(
    ("scenario", "finish_reason"),
    [
        (_scripted(reply("5")), "end_turn"),
        (_scripted(reply("cu", stop_reason="max_tokens")), "max_tokens"),
        (SCENARIOS["max_steps"][0], "error"),
        (SCENARIOS["model_error"][0], "error"),
    ],
    ids=["done", "cut-reply", "max_steps", "model_error"],
)
def test_the_run_spans_output_message_has_the_finish_reason_the_schema_requires(
    traced: Traced, scenario: Scenario, finish_reason: str
) -> None:
    """The answer's OutputMessage carries its reply's finish reason; a stop the reply did not ask for is "error"."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    agent, _ = scenario(ManualClock())
    instrument(agent, provider, capture_content=True)
    finish(agent, "go", driver="sync")
    (run,) = by_name(exporter.get_finished_spans())["invoke_agent"]
    (message,) = json.loads(str((run.attributes or {})["gen_ai.output.messages"]))
    assert set(message) == {"role", "parts", "finish_reason"}
    assert message["finish_reason"] == finish_reason


def test_a_resumed_run_gets_a_new_span_starting_at_its_resume_edge(traced: Traced) -> None:
    """The continuation is its own run span, marked resumed, in the same conversation."""
    from opentelemetry.trace import StatusCode

    from fsm_agent.otel import instrument

    exporter, provider = traced
    agent = Agent(FakeModel(_echo_turn("a"), reply("done")), demo_registry(), max_steps=1)
    instrument(agent, provider)
    stopped = finish(agent, "go", driver="sync")
    result = agent.resume(stopped, max_steps=3).finish()
    assert result.ok
    first, second = by_name(exporter.get_finished_spans())["invoke_agent"]
    assert first.attributes is not None
    assert second.attributes is not None
    assert first.attributes["gen_ai.conversation.id"] == second.attributes["gen_ai.conversation.id"]
    assert second.attributes["fsm_agent.resumed"] is True
    assert (second.events[0].attributes or {})["trigger"] == "resume"
    assert second.status.status_code is StatusCode.UNSET


@pytest.mark.subprocess
def test_importing_fsm_agent_loads_neither_opentelemetry_nor_mcp() -> None:
    """The integrations are opt-in: a plain run never imports them."""
    code = (
        "import sys, fsm_agent\n"
        "from fsm_agent.testing import FakeModel, reply, demo_registry\n"
        "fsm_agent.Agent(FakeModel(reply('x')), demo_registry()).run('q')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'mcp')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.subprocess
def test_the_readme_example_prints_a_run_span_with_its_children() -> None:
    """``python examples/otel_trace.py`` runs offline and prints the run span, its edges and its calls."""
    example = Path(__file__).resolve().parents[2] / "examples" / "otel_trace.py"
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=60, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "invoke_agent calculator [UNSET] {'input_tokens': 100, 'output_tokens': 13}"
    assert "    * Dispatch --dispatch--> Done" in lines
    assert "  execute_tool add [UNSET]" in lines


_MARKER = "deps-marker-otel-7a1"


class _Secret:
    """Deps whose rendering carries the marker: a copy of them in a span would show it."""

    def __repr__(self) -> str:
        return f"Secret({_MARKER})"

    __str__ = __repr__


def use_secret(n: int, ctx: RunContext[_Secret]) -> str:
    """Use the secret without returning it."""
    _USED.append(repr(ctx.deps))
    return "used"


_USED: list[str] = []


def test_a_runs_deps_appear_in_no_span(traced: Traced) -> None:
    """Deps handed to a run (and read by its tool) are in no span's name, attributes or events, on both drivers."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    registry = ToolRegistry()
    registry.register(use_secret)
    _USED.clear()
    for driver in ("sync", "async"):
        model = NamedModel(tool_turn(tool_call("use_secret", n=1)), reply("done"))
        agent = Agent(model, registry)
        instrument(agent, provider, agent_name="secretive")
        if driver == "sync":
            agent.run("go", deps=_Secret())
        else:
            asyncio.run(agent.arun("go", deps=_Secret()))
    assert [f"Secret({_MARKER})"] * 2 == _USED
    spans = exporter.get_finished_spans()
    assert len(spans) == 8  # per run: the run, two chats, one tool
    for span in spans:
        seen = [span.name, *map(str, (span.attributes or {}).values())]
        seen += [f"{e.name} {dict(e.attributes or {})}" for e in span.events]
        assert all(_MARKER not in text for text in seen), span.name
