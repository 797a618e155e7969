"""The hooks that open and close an agent's spans: its runs', their model calls' and tool calls'.

``instrument`` (the package's face, ``fsm_agent.otel``) makes one
``Instrumentation`` per agent; it registers the hooks and keeps the spans
of the runs in progress, nesting a sub-agent's runs in the ``execute_tool``
span of the call that ran them.  What a run span says when it ends is
``run_spans``'; what the conventions' attributes read, ``conventions``'.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from fsm_agent.drivers.agent import Agent
from fsm_agent.observe.events import CallEvent, TransitionEvent
from fsm_agent.otel import conventions
from fsm_agent.otel.run_spans import RunSpans, end_leftovers, end_run_span
from fsm_agent.records import RunResult

ADOPTING = threading.RLock()
"""Held while a sub-agent is found instrumented or instrumented (re-entered for its own sub-agents)."""


class Instrumentation:
    """The hooks ``instrument`` registered on an agent, and the spans of its runs in progress."""

    def __init__(self, agent: Agent, tracer: Tracer, *, capture_content: bool, agent_name: str | None) -> None:
        self.agent = agent
        self.capture_content = capture_content
        self._tracer = tracer
        self._name_model()
        self._agent_name = agent_name
        self._runs: dict[str, RunSpans] = {}
        # Hooks of parallel tool calls, and of runs on several threads, arrive concurrently.
        self._lock = threading.Lock()
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
        with ADOPTING:  # two parents adopting one sub-agent at once instrument it once
            found = instrumentations(agent)
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
        """Trace with the settings of an ``instrument`` call of the agent's own from now on, its model named again."""
        self.automatic = False
        self._tracer = tracer
        self.capture_content = capture_content
        self._agent_name = agent_name
        self._name_model()

    def _name_model(self) -> None:
        """Read the model's name and provider, which every model call's span carries, as the model says them now."""
        model, provider = conventions.model_name(self.agent), conventions.provider_name(self.agent)
        self._model, self._provider = model, provider
        self._operation = conventions.OPERATIONS.get(provider or "", "chat")
        common = {"gen_ai.request.model": model, "gen_ai.provider.name": provider}
        self._common: dict[str, str] = {key: value for key, value in common.items() if value is not None}

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

    def _run(self, run_id: str, *, resumed: bool = False) -> RunSpans:
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
                spans = self._runs[run_id] = RunSpans(span, trace.set_span_in_context(span))
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

    def _finish_run(self, event: TransitionEvent, result: RunResult, spans: RunSpans) -> None:
        with self._lock:
            self._runs.pop(event.run_id, None)
        end_run_span(spans, event, result, capture_content=self.capture_content)

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
        end_leftovers(spans)
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


def instrumentations(agent: Agent) -> list[Instrumentation]:
    """The instrumentations registered on ``agent``, found by their hooks."""
    found: list[Instrumentation] = []
    for hook in agent.hooks.get("transition"):
        owner = getattr(hook, "__self__", None)
        if isinstance(owner, Instrumentation) and owner not in found:
            found.append(owner)
    return found
