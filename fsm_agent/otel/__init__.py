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

from fsm_agent.drivers.agent import Agent

try:
    from opentelemetry import trace
    from opentelemetry.trace import TracerProvider
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    msg = "fsm_agent.otel needs opentelemetry-api (and an SDK to export): pip install 'fsm-agent[otel]'"
    raise ImportError(msg) from exc

from fsm_agent.otel.instrumentation import ADOPTING, Instrumentation, instrumentations

__all__ = ["Instrumentation", "instrument"]


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
    with ADOPTING:
        earlier = next(iter(instrumentations(agent)), None)
        if earlier is not None:
            earlier._take_over(tracer, capture_content=capture_content, agent_name=agent_name)  # noqa: SLF001
            return earlier
        return Instrumentation(agent, tracer, capture_content=capture_content, agent_name=agent_name)
