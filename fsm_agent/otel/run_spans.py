"""The open spans of one run, and how they end: the run span's closing attributes, the calls left in flight.

``Instrumentation`` decides when a run's spans open and close; this module
what a run span says when its run ends (stop reason, final state, each
counter against its limit, the answer with ``capture_content``) and how
the model and tool spans a run left open end, so each reads in one place.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
from opentelemetry.trace import Span, Status, StatusCode

from fsm_agent.observe.events import TransitionEvent
from fsm_agent.otel import conventions
from fsm_agent.records import RunResult


@attrs.define
class RunSpans:
    """The open spans of one run: the run's own, its model call in flight, its tool calls in flight by id."""

    span: Span
    context: Any
    chat: Span | None = None
    tools: dict[str, Span] = attrs.Factory(dict)
    last_finish: tuple[str, str] | None = None
    """The last reply's ``stop_reason`` and the finish reason reported for it."""
    transitions: int = 0
    """How many transitions this span has carried (the first one's ``seq`` tells a resumed run)."""


def end_run_span(spans: RunSpans, event: TransitionEvent, result: RunResult, *, capture_content: bool) -> None:
    """End the run span of a run that ended with ``result``: its stop, its counters and limits, its answer."""
    span = spans.span
    end_leftovers(spans)
    span.set_attribute("fsm_agent.stop_reason", result.reason)
    span.set_attribute("fsm_agent.final_state", event.dest)
    span.set_attribute("gen_ai.usage.input_tokens", result.usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", result.usage.output_tokens)
    for name, (used, limit) in event.counters.items():
        if used is not None and (name != "cost" or result.usage.cost is not None):  # cost: all priced, or none
            span.set_attribute(f"fsm_agent.counters.{name}", used)
        if limit is not None:
            span.set_attribute(f"fsm_agent.limits.{name}", limit)
    if capture_content:
        # This run's own question: a continued conversation's earlier ones come before result.prior.
        question = next((m.content for m in result.messages[result.prior :] if m.role == "user"), None)
        if question is not None:
            span.set_attribute("gen_ai.input.messages", conventions.text_message("user", question))
        finish = conventions.answer_finish(result, spans.last_finish)
        answer = conventions.text_message("assistant", result.final, finish)
        span.set_attribute("gen_ai.output.messages", answer)
        span.set_attribute("fsm_agent.evidence", json.dumps(result.evidence, ensure_ascii=False, default=str))
    if event.dest == "Failed":
        span.set_attribute("error.type", result.reason)
        span.set_status(Status(StatusCode.ERROR, result.reason))
    span.end()


def end_leftovers(spans: RunSpans) -> None:
    """End the calls whose closing hook never came (cut off in flight, or the run left), marked unfinished."""
    for leftover in (spans.chat, *spans.tools.values()):
        if leftover is not None:
            leftover.set_attribute("fsm_agent.unfinished", True)
            leftover.end()
