"""Parts of the sixth embedding audit: a traced agent, a model asking one counted tool per question, a gated tool.

``Traced`` is an OpenTelemetry SDK provider with the in-memory exporter;
``ChargesOnce`` asks for one ``charge`` per question (its call id named after
the question) and answers once the charge is back; ``charges`` is a registry
whose ``charge`` counts each execution per (run id, call id), checks that it
reached the deps of its own request, and holds until its question's gate is
set.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, RunContext, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Traced:
    """A tracer provider whose spans are kept in memory, and the instrumentations made with it."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.started = _started()
        self.provider.add_span_processor(self.started)

    def instrument(self, agent: Agent) -> Agent:
        """``agent``, instrumented with this provider."""
        from fsm_agent.otel import instrument

        instrument(agent, self.provider)
        return agent

    def finished(self, prefix: str = "") -> list[Any]:
        """The spans that ended, those whose name starts with ``prefix``."""
        return [span for span in self.exporter.get_finished_spans() if span.name.startswith(prefix)]

    def open_spans(self) -> list[str]:
        """The names of the spans started and not ended (an ``invoke_agent`` one names a run left open)."""
        return self.started.still_open()


def _started() -> Any:
    """A span processor that keeps the spans started and not ended yet (``still_open()``, their names)."""
    from opentelemetry.sdk.trace import SpanProcessor

    class Started(SpanProcessor):
        def __init__(self) -> None:
            self._open: dict[int, str] = {}
            self._lock = threading.Lock()

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            with self._lock:
                self._open[span.context.span_id] = span.name

        def on_end(self, span: Any) -> None:
            with self._lock:
                self._open.pop(span.context.span_id, None)

        def still_open(self) -> list[str]:
            with self._lock:
                return sorted(self._open.values())

    return Started()


def _last_user(messages: Sequence[Message]) -> int:
    return max(i for i, m in enumerate(messages) if m.role == "user")


class ChargesOnce:
    """Asks for ``charge`` (call ``c-<question>``) once per question; answers ``done <question>`` after its result."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _next(self, messages: Sequence[Message]) -> ModelResponse:
        last = _last_user(messages)
        question = messages[last].content
        with self._lock:
            self.calls[question] += 1
        if not any(m.role == "tool" for m in messages[last:]):
            return tool_turn(tool_call("charge", id=f"c-{question}", what=question))
        return reply(f"done {question}")

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """The next reply for the last question."""
        return self._next(messages)

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """The next reply for the last question, awaited."""
        return self._next(messages)


class Gates:
    """Per question: an event set when its charge starts, and one the charge waits for (async or threads)."""

    def __init__(self, *, threads: bool = False) -> None:
        self.threads = threads
        self.entered: dict[str, Any] = {}
        self.release: dict[str, Any] = {}

    def add(self, question: str, *, open_: bool = False) -> None:
        """Make the question's two events; ``open_``: its charge does not wait."""
        kind = threading.Event if self.threads else asyncio.Event
        self.entered[question] = kind()
        self.release[question] = kind()
        if open_:
            self.release[question].set()


def charges(ran: Counter[tuple[str, str]], gates: Gates, wrong_deps: list[tuple[str, Any]]) -> ToolRegistry:
    """A registry with ``charge(what)``: counted per (run id, call id), its deps checked, held on its gate."""
    registry = ToolRegistry()
    lock = threading.Lock()

    if gates.threads:

        @registry.register
        def charge(what: str, ctx: RunContext[str]) -> str:
            """Charge the signed-in user for ``what``."""
            with lock:
                ran[(ctx.run_id, ctx.call_id)] += 1
                if ctx.deps != what:
                    wrong_deps.append((what, ctx.deps))
            gates.entered[what].set()
            assert gates.release[what].wait(30)
            return f"charged {what}"

    else:

        @registry.register
        async def charge(what: str, ctx: RunContext[str]) -> str:
            """Charge the signed-in user for ``what``."""
            with lock:
                ran[(ctx.run_id, ctx.call_id)] += 1
                if ctx.deps != what:
                    wrong_deps.append((what, ctx.deps))
            gates.entered[what].set()
            await gates.release[what].wait()
            return f"charged {what}"

    return registry
