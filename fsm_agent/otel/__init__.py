"""OpenTelemetry spans in the GenAI semantic conventions (optional extra: ``pip install 'fsm-agent[otel]'``).

``instrument(agent)`` registers hooks on the agent; from then on every run
of it is traced:

- one ``invoke_agent`` span per run (``invoke_agent <name>``), and below it
- one ``chat <model>`` span per model call (``generate_content <model>`` for
  Gemini, as the conventions name its calls), and
- one ``execute_tool <tool>`` span per tool call; the parallel calls of one
  async turn are concurrent siblings.

The conventions' attributes are set where the engine knows them:
``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.provider.name``
(for the bundled adapters), ``gen_ai.response.finish_reasons`` (the
provider's own value, which the bundled adapters keep, e.g. ``tool_calls``
or ``STOP``; the model's ``stop_reason`` for other models),
``gen_ai.usage.input_tokens``/``output_tokens`` (per call, and the run's
totals on the run span), ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
``gen_ai.tool.type``, ``gen_ai.conversation.id`` (the run id) and
``error.type``.  What only this engine has goes under ``fsm_agent.*``: a
priced call's US dollars (``fsm_agent.usage.cost``), every transition as an
event on the run span (``source``, ``trigger``, ``dest``, and
``guard``/``reason`` when the edge has them), and the run span ends with
``fsm_agent.stop_reason``, ``fsm_agent.final_state`` and each counter against
its limit (``fsm_agent.counters.<name>``, ``fsm_agent.limits.<name>``; the
cost only when every call was priced).  A stop sets the run span's status to
error, with the reason as description and ``error.type``; a failed model or
tool call does the same to its own span.

Sub-agents (``Agent.as_tool``) are traced as part of their parent's run:
``instrument(parent)`` also instruments every sub-agent in its registry
(and theirs, at any depth; one registered later is found at its first
call), naming its run spans by its tool name (``invoke_agent research``)
and using the parent's tracer provider and ``capture_content``.  A child
run's ``invoke_agent`` span is a child of the parent's ``execute_tool``
span of the call that ran it, on either driver, whatever thread the call
ran on and however many calls of one async turn ran at once; that
``execute_tool`` span carries ``fsm_agent.child_run_id`` and the child's
run span ``fsm_agent.parent_run_id``.  Instrumenting is idempotent: an
agent instrumented twice (a factory run at import and in ``main``), or a
sub-agent instrumented by its user before or after its parent, is traced
once; each later ``instrument`` call takes the instrumentation over with
its own settings.  The sub-agent's runs outside any parent's call (a child run
resumed on its own included) are traced too, as any run is; a finished
child a resumed parent reads back instead of running makes no span.

Message contents (the model's replies, tool arguments and results, the
question and the answer) are recorded only with ``capture_content=True``, as
the conventions advise: they may hold personal data.  A run that a resume
continues gets a new run span, marked ``fsm_agent.resumed``: every run span
that starts after its run's first transition is (a resume from a stop, a
pause or an ``unfinished`` exit, and a fork), and so is one of a run resumed
before its first transition (cut in its first model call: its call events
say so, ``CallEvent.resumed``).  A run paused for approval
ends its span at the pause (the ``paused`` hook), marked ``fsm_agent.paused``:
the process that paused it may never see it again; its resume, by this agent
or another, here or in another process, is a new span.

Hooks are observers, so tracing never changes a run; an agent that is not
instrumented runs no tracing code at all.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import attrs

from fsm_agent.drivers.agent import Agent
from fsm_agent.observe.events import CallEvent, TransitionEvent
from fsm_agent.otel import conventions
from fsm_agent.records import RunResult

try:
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    msg = "fsm_agent.otel needs opentelemetry-api (and an SDK to export): pip install 'fsm-agent[otel]'"
    raise ImportError(msg) from exc

__all__ = ["Instrumentation", "instrument"]

_ADOPTING = threading.RLock()
"""Held while a sub-agent is found instrumented or instrumented (re-entered for its own sub-agents)."""


@attrs.define
class _RunSpans:
    """The open spans of one run: the run's own, its model call in flight, its tool calls in flight by id."""

    span: Span
    context: Any
    chat: Span | None = None
    tools: dict[str, Span] = attrs.Factory(dict)
    last_finish: tuple[str, str] | None = None
    """The last reply's ``stop_reason`` and the finish reason reported for it."""
    transitions: int = 0
    """How many transitions this span has carried (the first one's ``seq`` tells a resumed run)."""


class Instrumentation:
    """The hooks ``instrument`` registered on an agent, and the spans of its runs in progress."""

    def __init__(self, agent: Agent, tracer: Tracer, *, capture_content: bool, agent_name: str | None) -> None:
        self.agent = agent
        self.capture_content = capture_content
        self._tracer = tracer
        self._model = conventions.model_name(agent)
        self._provider = conventions.provider_name(agent)
        self._operation = conventions.OPERATIONS.get(self._provider or "", "chat")
        self._agent_name = agent_name
        self._runs: dict[str, _RunSpans] = {}
        # Hooks of parallel tool calls, and of runs on several threads, arrive concurrently.
        self._lock = threading.Lock()
        self._common: dict[str, str] = {}
        if self._model is not None:
            self._common["gen_ai.request.model"] = self._model
        if self._provider is not None:
            self._common["gen_ai.provider.name"] = self._provider
        agent.on("before_model", self._before_model)
        agent.on("after_model", self._after_model)
        agent.on("before_tool", self._before_tool)
        agent.on("after_tool", self._after_tool)
        agent.on("transition", self._transition)
        agent.on("unfinished", self._unfinished)
        agent.on("paused", self._paused)
        self.automatic = False
        """Made by a parent's ``instrument`` for a sub-agent, until an ``instrument`` call of its own takes it over."""
        self._parents: list[Instrumentation] = []
        """The instrumentations of the agents that call this one as a sub-agent (whose tool spans its runs nest in)."""
        self._adopted: list[Agent] = []
        """The sub-agents already instrumented, found by identity (hooks registered above first: a cycle ends here)."""
        for child in list(agent.children().values()):
            self._adopt(child.agent, child.name)

    # --- sub-agents ---------------------------------------------------------------------------------------------

    def _adopt(self, agent: Agent, name: str) -> None:
        """Instrument sub-agent ``agent`` (unless it already is) and nest its runs in this agent's tool spans."""
        with self._lock:
            if any(adopted is agent for adopted in self._adopted):
                return
            self._adopted.append(agent)
        with _ADOPTING:  # two parents adopting one sub-agent at once instrument it once
            found = _instrumentations(agent)
            if not found:
                made = Instrumentation(agent, self._tracer, capture_content=self.capture_content, agent_name=name)
                made.automatic = True
                found = [made]
        for instrumentation in found:
            instrumentation._nest_in(self)  # noqa: SLF001 - the same class, the sub-agent's instrumentation

    def _nest_in(self, parent: Instrumentation) -> None:
        """Nest this agent's runs in ``parent``'s tool spans of the calls that run them."""
        with self._lock:
            if parent not in self._parents:
                self._parents.append(parent)

    def _take_over(self, tracer: Tracer, *, capture_content: bool, agent_name: str | None) -> None:
        """Trace with the settings of an ``instrument`` call of the agent's own from now on."""
        self.automatic = False
        self._tracer = tracer
        self.capture_content = capture_content
        self._agent_name = agent_name

    def _open_tool(self, run_id: str, call_id: str) -> Span | None:
        """The ``execute_tool`` span of call ``call_id`` of run ``run_id``, if that call is in flight."""
        with self._lock:
            spans = self._runs.get(run_id)
            return None if spans is None else spans.tools.get(call_id)

    def _calling_span(self, run_id: str) -> tuple[str, Span] | None:
        """The parent run and the tool span a sub-agent's run ``<parent run id>/<call id>`` is a call of, if open."""
        parent_id, _, call_id = run_id.rpartition("/")
        if not parent_id:
            return None
        with self._lock:
            parents = list(self._parents)
        for parent in parents:
            span = parent._open_tool(parent_id, call_id)  # noqa: SLF001 - the same class, another agent's spans
            if span is not None:
                return parent_id, span
        return None

    # --- the run span ----------------------------------------------------------------------------------------

    def _run(self, run_id: str, *, resumed: bool = False) -> _RunSpans:
        """The spans of run ``run_id``, its run span started by the first event of the run seen.

        ``resumed``: that event is not the start of the run (see ``_resumes``), so a new span is marked so.
        """
        with self._lock:
            spans = self._runs.get(run_id)
        if spans is not None:
            return spans
        # A sub-agent's run: found by its id in the calling agent's open tool spans, not by the current
        # context, so it nests whichever thread or task the call runs on (looked up outside this run's lock:
        # an agent may call itself).
        calling = self._calling_span(run_id) if self._parents else None
        with self._lock:
            spans = self._runs.get(run_id)
            if spans is None:
                name = "invoke_agent" if self._agent_name is None else f"invoke_agent {self._agent_name}"
                attributes: dict[str, Any] = {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.conversation.id": run_id,
                    **self._common,
                }
                if self._agent_name is not None:
                    attributes["gen_ai.agent.name"] = self._agent_name
                if resumed:
                    attributes["fsm_agent.resumed"] = True
                context = None
                if calling is not None:
                    parent_id, tool_span = calling
                    attributes["fsm_agent.parent_run_id"] = parent_id
                    tool_span.set_attribute("fsm_agent.child_run_id", run_id)
                    context = trace.set_span_in_context(tool_span)
                span = self._tracer.start_span(name, context, SpanKind.INTERNAL, attributes)
                spans = self._runs[run_id] = _RunSpans(span, trace.set_span_in_context(span))
            return spans

    def _transition(self, event: TransitionEvent) -> None:
        spans = self._run(event.run_id, resumed=event.seq > 0)
        if spans.transitions == 0 and event.seq > 0:
            spans.span.set_attribute("fsm_agent.resumed", True)  # opened by a call event of a resumed run
        spans.transitions += 1
        attributes = {"source": event.source, "trigger": event.trigger, "dest": event.dest}
        if event.guard is not None:
            attributes["guard"] = event.guard
        if event.reason is not None:
            attributes["reason"] = event.reason
        spans.span.add_event("transition", attributes)
        if event.result is not None:
            self._finish_run(event, event.result, spans)

    def _finish_run(self, event: TransitionEvent, result: RunResult, spans: _RunSpans) -> None:
        with self._lock:
            self._runs.pop(event.run_id, None)
        span = spans.span
        _end_leftovers(spans)
        span.set_attribute("fsm_agent.stop_reason", result.reason)
        span.set_attribute("fsm_agent.final_state", event.dest)
        span.set_attribute("gen_ai.usage.input_tokens", result.usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", result.usage.output_tokens)
        for name, (used, limit) in event.counters.items():
            if used is not None and (name != "cost" or result.usage.cost is not None):  # cost: all priced, or none
                span.set_attribute(f"fsm_agent.counters.{name}", used)
            if limit is not None:
                span.set_attribute(f"fsm_agent.limits.{name}", limit)
        if self.capture_content:
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

    def _unfinished(self, event: CallEvent) -> None:
        """The run was left where it was (a ``KeyboardInterrupt`` in a tool, say): its spans end, marked unfinished.

        A resume, here or in another process, opens a run span of its own.
        """
        span = self._let_go(event.run_id)
        if span is None:
            return
        span.set_attribute("fsm_agent.unfinished", True)
        error = event.error or "unfinished"
        span.set_attribute("error.type", error.partition(":")[0])
        span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def _paused(self, event: CallEvent) -> None:
        """The run waits for a person's decision: its run span ends here, marked paused.

        The decision may come from another agent or process, or never: a
        resume, here or there, opens a run span of its own, marked resumed.
        """
        span = self._let_go(event.run_id)
        if span is None:
            return
        span.set_attribute("fsm_agent.paused", True)
        span.end()

    def _let_go(self, run_id: str) -> Span | None:
        """Forget the run left unended: its model and tool spans end; its run span, returned, is the caller's to end."""
        with self._lock:
            spans = self._runs.pop(run_id, None)
        if spans is None:
            return None
        _end_leftovers(spans)
        return spans.span

    # --- model calls --------------------------------------------------------------------------------------

    def _before_model(self, event: CallEvent) -> None:
        spans = self._run(event.run_id, resumed=event.resumed or event.turn > 1)
        operation = self._operation
        name = operation if self._model is None else f"{operation} {self._model}"
        attributes: dict[str, str | int] = {"gen_ai.operation.name": operation, "fsm_agent.turn": event.turn}
        attributes.update(self._common)
        spans.chat = self._tracer.start_span(name, spans.context, SpanKind.CLIENT, attributes)

    def _after_model(self, event: CallEvent) -> None:
        spans = self._run(event.run_id)
        span, spans.chat = spans.chat, None
        if span is None:
            return
        response = event.response
        if event.error is not None:
            span.set_attribute("error.type", event.error.split(":", 1)[0])
            span.set_status(Status(StatusCode.ERROR, event.error))
        elif response is not None:
            finish_reason = conventions.finish_reason(response)
            spans.last_finish = (response.stop_reason, finish_reason)
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
            if response.usage is not None:
                span.set_attribute("gen_ai.usage.input_tokens", response.usage.input_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", response.usage.output_tokens)
                if response.usage.cost is not None:
                    span.set_attribute("fsm_agent.usage.cost", response.usage.cost)
            if self.capture_content:
                span.set_attribute("gen_ai.output.messages", conventions.reply_message(response))
        span.end()

    # --- tool calls -----------------------------------------------------------------------------------------

    def _before_tool(self, event: CallEvent) -> None:
        call = event.tool_call
        if call is None:
            return
        child = self.agent.children().get(call.name)
        if child is not None:
            self._adopt(child.agent, child.name)  # registered after instrument(): its runs are traced too
        spans = self._run(event.run_id, resumed=True)  # a run starts with a model call: this one was under way
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
        }
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = conventions.tool_arguments(call)
        span = self._tracer.start_span(f"execute_tool {call.name}", spans.context, SpanKind.INTERNAL, attributes)
        with self._lock:
            spans.tools[call.id] = span

    def _after_tool(self, event: CallEvent) -> None:
        call = event.tool_call
        if call is None:
            return
        spans = self._run(event.run_id)
        with self._lock:
            span = spans.tools.pop(call.id, None)
        if span is None:
            return
        if self.capture_content and event.tool_result is not None:
            span.set_attribute("gen_ai.tool.call.result", event.tool_result)
        if event.tool_error is not None:
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, event.tool_error))
        span.end()


def _end_leftovers(spans: _RunSpans) -> None:
    """End the calls whose closing hook never came (cut off in flight, or the run left), marked unfinished."""
    for leftover in (spans.chat, *spans.tools.values()):
        if leftover is not None:
            leftover.set_attribute("fsm_agent.unfinished", True)
            leftover.end()


def _instrumentations(agent: Agent) -> list[Instrumentation]:
    """The instrumentations registered on ``agent``, found by their hooks."""
    found: list[Instrumentation] = []
    for hook in agent.hooks.get("transition"):
        owner = getattr(hook, "__self__", None)
        if isinstance(owner, Instrumentation) and owner not in found:
            found.append(owner)
    return found


def instrument(
    agent: Agent,
    tracer_provider: TracerProvider | None = None,
    *,
    capture_content: bool = False,
    agent_name: str | None = None,
) -> Instrumentation:
    """Trace every run of ``agent`` with OpenTelemetry spans, through ``tracer_provider`` (default: the global one).

    ``capture_content=True`` also records message contents (off by default,
    as the GenAI conventions advise); ``agent_name`` names the run spans
    (``invoke_agent <name>``, ``gen_ai.agent.name``).  The sub-agents in the
    agent's registry are instrumented with it (see the module's docstring);
    for an agent instrumented already (by an earlier call, or a parent's),
    this call takes that instrumentation over with these settings and
    returns it: a second set of hooks would trace every run twice.
    """
    if not isinstance(agent, Agent):
        msg = f"instrument() takes an Agent, got {type(agent).__name__}"
        raise TypeError(msg)
    tracer = trace.get_tracer("fsm_agent", tracer_provider=tracer_provider)
    with _ADOPTING:
        earlier = next(iter(_instrumentations(agent)), None)
        if earlier is not None:
            earlier._take_over(tracer, capture_content=capture_content, agent_name=agent_name)  # noqa: SLF001
            return earlier
        return Instrumentation(agent, tracer, capture_content=capture_content, agent_name=agent_name)
