"""Real OpenTelemetry SDK spans kept for a test: the finished ones exported in memory, the open ones by id.

A span processor keeps every span started and not yet ended, so a span left
open is seen directly, without waiting on anything; ``tests/otel/conftest.py``
gives a fresh one as the ``spans`` fixture.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan


def attributes(span: ReadableSpan) -> dict[str, Any]:
    """A span's attributes as a plain dict."""
    return dict(span.attributes or {})


class Spans:
    """A tracer provider whose finished spans are exported in memory and whose open spans are kept by id."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.open: dict[int, str] = {}
        self.ended: Counter[int] = Counter()
        opened, ended = self.open, self.ended

        class KeepOpen(SpanProcessor):
            def on_start(self, span: Any, parent_context: Any = None) -> None:
                opened[span.context.span_id] = span.name

            def on_end(self, span: Any) -> None:
                ended[span.context.span_id] += 1
                opened.pop(span.context.span_id, None)

        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.provider.add_span_processor(KeepOpen())

    def finished(self) -> list[ReadableSpan]:
        return sorted(self.exporter.get_finished_spans(), key=lambda span: span.start_time or 0)

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.finished() if span.name.startswith(prefix)]

    def tools(self) -> dict[str, list[ReadableSpan]]:
        by_call: dict[str, list[ReadableSpan]] = {}
        for span in self.named("execute_tool"):
            by_call.setdefault(attributes(span)["gen_ai.tool.call.id"], []).append(span)
        return by_call

    def all_ended_once(self) -> None:
        """No span open, none ended twice, and no span left as the current one."""
        from opentelemetry import trace

        assert self.open == {}
        assert set(self.ended.values()) <= {1}
        assert not trace.get_current_span().get_span_context().is_valid
