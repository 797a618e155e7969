"""Trace a run with OpenTelemetry, offline: a scripted model, the demo tools, and the spans printed as a tree.

In production, give ``instrument`` a provider that exports (``BatchSpanProcessor(OTLPSpanExporter())``
to Jaeger, Tempo, Honeycomb, Langfuse, ...); here the SDK's in-memory exporter keeps them for printing.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fsm_agent import Agent, Usage
from fsm_agent.otel import instrument
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))

model = FakeModel(tool_turn(tool_call("add", a=2, b=3), usage=Usage(40, 8)), reply("2+3 = 5", usage=Usage(60, 5)))
agent = Agent(model, demo_registry())
instrument(agent, provider, agent_name="calculator")
agent.run("What is 2+3?")

spans = sorted(exporter.get_finished_spans(), key=lambda span: span.start_time or 0)
for span in spans:
    attributes = dict(span.attributes or {})
    indent = "  " if span.parent is not None else ""
    usage = {k.rsplit(".", 1)[-1]: v for k, v in attributes.items() if k.startswith("gen_ai.usage.")}
    print(f"{indent}{span.name} [{span.status.status_code.name}] {usage or ''}".rstrip())
    for event in span.events:
        edge = dict(event.attributes or {})
        print(f"    * {edge['source']} --{edge['trigger']}--> {edge['dest']}")
