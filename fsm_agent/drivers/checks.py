"""The checks of an ``Agent``'s arguments and the settings record built from them: each mistake an error at once."""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from types import MappingProxyType
from typing import Any, cast

from fsm_agent.core.approval import HeldBack, approval_checked, approval_rule
from fsm_agent.core.history import history_settings
from fsm_agent.core.output import OutputSpec, Validator, accepts_output, output_spec
from fsm_agent.core.pricing import Price, Pricing, UnpricedModelError, pricing_of
from fsm_agent.core.settings import AgentSettings
from fsm_agent.core.walker import walker_for
from fsm_agent.definition.guards import Guard, passes_child_stop
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.states import Policy, Reason
from fsm_agent.definition.stops import StopCondition, check_policies, user_stops
from fsm_agent.definition.table import BUILTIN_REASONS, COMPACTING_GUARDS, TABLE, TYPED_GUARDS
from fsm_agent.drivers.child import ChildTool, children_in
from fsm_agent.drivers.model import Clock, Model
from fsm_agent.records import Message, ToolCall
from fsm_agent.tools import JSONSchema, ToolRegistry

_DEFAULT_LIMITS = Limits()
"""What the limit keywords default to: any other value beside ``limits=Limits(...)`` is a mistake."""
PLAIN_UNUSED = (*TYPED_GUARDS, *COMPACTING_GUARDS)
"""The unused guards of an agent without a typed answer or compaction (most): one tuple for all of them."""


def agent_settings(
    *,
    model: Model,
    registry: ToolRegistry,
    system: str,
    clock: Clock,
    strict_hooks: bool,
    max_concurrency: int | None,
    tool_timeout: float | None,
    limits: Limits | None,
    max_steps: int,
    max_consecutive_failures: int,
    timeout: float | None,
    token_budget: int | None,
    max_tool_calls: int | Mapping[str, int] | None,
    cycle_window: int,
    cost_budget: float | None,
    prices: Price | Mapping[str, Price] | None,
    output_type: Any,
    output_validators: Iterable[Validator],
    output_retries: int,
    approve: Collection[str] | Callable[[ToolCall], bool] | None,
    stop_conditions: Iterable[StopCondition],
    on_stop: Mapping[Reason, Policy] | None,
    history_processors: Iterable[Callable[[list[Message]], Any]],
    compact: Callable[[list[Message]], Any] | None,
) -> AgentSettings:
    """An agent's settings from its arguments (``Agent``'s keywords), each checked, in this order.

    First its parts (the model, the tools, the system prompt, the clock, the concurrency and tool-timeout
    settings); then, derived, the typed answer and the keywords it asks the model for, the approval rule, the
    limits, the pricing of its model (and its sub-agents', under a ``cost_budget``), the stop conditions, the
    walker of the table they make, the stop policies, the history settings, and the guards of what the agent
    lacks.  The values are typed as ``Agent`` takes them; an application may still
    pass anything, so each is checked here, where a mistake is an error before any run starts.
    """
    check_parts(model, registry, system, clock, max_concurrency, tool_timeout)
    output = output_spec(output_type, output_validators, output_retries)
    keywords = model_keywords(model, output)
    rule = approval_rule(approve)
    given = {
        "max_steps": max_steps,
        "max_consecutive_failures": max_consecutive_failures,
        "timeout": timeout,
        "token_budget": token_budget,
        "max_tool_calls": max_tool_calls,
        "cycle_window": cycle_window,
        "cost_budget": cost_budget,
    }
    checked_limits = limits_of(limits, given)
    pricing = checked_pricing(model, registry, prices, checked_limits)
    stops = user_stops(stop_conditions, BUILTIN_REASONS)
    walker = walker_for(approval_checked(TABLE.with_stops(stops), rule))
    policies = check_policies(on_stop, walker.table.stop_for)
    processors, compact = history_settings(history_processors, compact, policies)
    unused = (*(() if output else TYPED_GUARDS), *(() if compact else COMPACTING_GUARDS))
    return AgentSettings(
        system=system,
        clock=clock,
        limits=checked_limits,
        walker=walker,
        on_stop=MappingProxyType(policies),
        stop_conditions=stops,
        output=output,
        model_keywords=keywords,
        approve=rule,
        history_processors=processors,
        compact=compact,
        # One tuple for all plain agents, so their parts are found in the registry (see ``plain_parts``).
        unused_guards=PLAIN_UNUSED if unused == PLAIN_UNUSED else unused,
        tool_timeout=tool_timeout,
        max_concurrency=max_concurrency,
        strict_hooks=bool(strict_hooks),
        pricing=pricing,
    )


def check_parts(model: Any, registry: Any, system: Any, clock: Any, max_concurrency: Any, tool_timeout: Any) -> None:
    """Check an agent's parts and plain settings: the types a caller may still get wrong, whatever the hints say."""
    check_model(model)
    if not isinstance(registry, ToolRegistry):
        msg = f"registry must be a ToolRegistry, got {type(registry).__name__}"
        raise TypeError(msg)
    if not isinstance(system, str):
        msg = f"system must be a str, got {type(system).__name__}"
        raise TypeError(msg)
    if not callable(clock):
        msg = f"clock must be a callable returning monotonic seconds, got {type(clock).__name__}"
        raise TypeError(msg)
    if max_concurrency is not None and (
        isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1
    ):
        msg = f"max_concurrency must be None (all calls of a turn) or an integer >= 1, got {max_concurrency!r}"
        raise ValueError(msg)
    if tool_timeout is not None and (
        isinstance(tool_timeout, bool) or not isinstance(tool_timeout, int | float) or not 0 < tool_timeout < math.inf
    ):
        msg = f"tool_timeout must be None or a finite number of seconds > 0, got {tool_timeout!r}"
        raise ValueError(msg)


_CALLED = ("complete", "acomplete")
"""The model methods a driver calls with the conversation and the tools' schemas."""


def check_model(model: Any) -> None:
    """A ``TypeError`` for a model the drivers cannot call: its class, not an instance; an ``async def complete``.

    Each would otherwise be found only by the first model call, as a
    ``model_error`` stop, once per run.  The signature is not read: that
    costs more than building the agent, and a ``complete`` that cannot take
    ``(messages, tools)`` is told by Python's own error at the first call.
    """
    if isinstance(model, type) and _instance_methods(model):
        msg = f"model is the class {model.__name__}, not an instance of it: pass {model.__name__}() instead"
        raise TypeError(msg)
    complete = getattr(model, "complete", None)
    if not callable(complete) and not callable(getattr(model, "acomplete", None)):
        kind = type(model).__name__
        msg = f"model must have a complete(messages, tools) method or be a 'provider:name' string, got {kind}"
        raise TypeError(msg)
    if inspect.iscoroutinefunction(complete):
        kind = type(model).__name__
        msg = f"{kind}.complete is an async def, which run() would not await: name it acomplete (arun awaits it)"
        raise TypeError(msg)


def _instance_methods(model: type) -> bool:
    """Whether ``complete`` or ``acomplete`` of the class ``model`` is a plain function, to be called on an instance.

    A staticmethod or classmethod is callable on the class itself: such a class is a model as it is.
    """
    for name in _CALLED:
        owner = next((vars(klass) for klass in model.__mro__ if name in vars(klass)), None)
        if owner is not None and inspect.isfunction(owner[name]):
            return True
    return False


def check_sync_model(model: Any, method: str, instead: str, stream_method: str | None = None) -> None:
    """A ``TypeError`` for a sync ``method`` (``run``, ``stream``) of a model with ``acomplete`` alone: use ``instead``.

    Raised before the run is begun, so nothing is stored of a run that could
    never call its model; ``stream_method`` is a method that serves it too.
    """
    if callable(getattr(model, "complete", None)):
        return
    if stream_method is not None and callable(getattr(model, stream_method, None)):
        return
    kind = type(model).__name__
    msg = f"{kind} has acomplete but no complete, which {method}() calls: use {instead} instead"
    raise TypeError(msg)


def checked_pricing(
    model: Model, registry: ToolRegistry, prices: Price | Mapping[str, Price] | None, limits: Limits
) -> Pricing:
    """The pricing of the agent's model; with a ``cost_budget``, a ``ValueError`` for a model or sub-agent unpriced.

    A budget over an unknown price would count that call as free: refused
    here, naming the model, rather than found out as a run overspends.
    """
    pricing = pricing_of(model, prices)
    if limits.cost_budget is None:
        return pricing
    if not pricing.known:
        raise UnpricedModelError(model, pricing)
    check_children_priced(registry.cached("children", children_in)[0])
    return pricing


def check_tools_named(settings: AgentSettings, registry: ToolRegistry) -> None:
    """Each tool ``approve=`` or ``max_tool_calls`` names is one of the agent's tools; a ``ValueError`` if not.

    A misspelt name would hold nothing back or cap nothing, silently.  Checked
    as the agent's tools are found (its first run, and after the registry
    changed), since tools may be registered after the agent is built.
    """
    caps = settings.limits.max_tool_calls
    if not isinstance(settings.approve, HeldBack) and not isinstance(caps, Mapping):
        return  # most agents name no tool: a fresh agent per request pays for nothing here
    named = (
        ("approve", settings.approve.names if isinstance(settings.approve, HeldBack) else ()),
        ("max_tool_calls", caps if isinstance(caps, Mapping) else ()),
    )
    for what, names in named:
        unknown = sorted(name for name in names if name != "*" and name not in registry)
        if unknown:
            listed = ", ".join(sorted(registry)) or "none"
            msg = f"{what} names no tool of this agent: {', '.join(map(repr, unknown))} (its tools: {listed})"
            raise ValueError(msg)


def check_children_priced(children: Mapping[str, ChildTool]) -> None:
    """A ``ValueError`` naming the first sub-agent whose model has no price: under a ``cost_budget``, none may lack one.

    Sub-agents of sub-agents too, at any depth: each one's calls are the
    parent's spending (``drivers/child_spend``), so an unpriced one deep
    down would spend dollars the budget never sees.  The error names the
    path of sub-agent tools down to it.  Asked when the agent is built and
    again when its tools change (a sub-agent registered later), before a run.
    """
    stack: list[tuple[Mapping[str, ChildTool], tuple[str, ...]]] = [(children, ())]
    seen: list[object] = []
    while stack:
        level, through = stack.pop()
        for child in level.values():
            child_pricing = child.agent.settings.pricing
            if not child_pricing.known:
                raise UnpricedModelError(child.agent.model, child_pricing, child.name, through)
            if not any(child.agent is known for known in seen):  # a cycle is check_no_cycle's to refuse
                seen.append(child.agent)
                stack.append((children_in(child.agent.registry)[0], (*through, child.name)))


def model_of(model: Any) -> Model:
    """The agent's model: one given as is, or the adapter a string names (``"openai:gpt-4o-mini"``, as ``--model``).

    ``fsm_agent.models`` is imported only for a string: ``import fsm_agent`` loads no adapter.
    """
    if not isinstance(model, str):
        return cast(Model, model)  # check_parts says what is wrong with anything else
    # models/ is built on the public API, below drivers/ in the architecture's order: loaded by name, as a
    # plug-in is, so the dependency points one way (docs/concepts/architecture.md).
    named = importlib.import_module("fsm_agent.models.named")
    return cast(Model, named.model_named(model))


def registry_of(tools: Any) -> ToolRegistry:
    """The agent's tools: a ``ToolRegistry`` as is, or one built from a list of plain functions.

    An item that is not callable is a ``TypeError`` naming it, before any
    run; a function the registry cannot describe is its ``TypeError``.
    """
    if isinstance(tools, ToolRegistry):
        return tools
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Iterable):
        msg = f"registry must be a ToolRegistry or a list of functions, got {type(tools).__name__}"
        raise TypeError(msg)
    registry = ToolRegistry()
    for index, function in enumerate(tools):
        if not callable(function):
            msg = f"tools must be functions; item {index} is {type(function).__name__} {function!r}, not callable"
            raise TypeError(msg)
        registry.register(function)
    return registry


def limits_of(limits: Limits | None, keywords: Mapping[str, Any]) -> Limits:
    """The agent's limits: ``limits=Limits(...)`` or the limit keywords (``Limits`` checks each one), not both."""
    if limits is None:
        return Limits(**keywords)
    if not isinstance(limits, Limits):
        msg = f"limits must be a Limits, got {type(limits).__name__}"
        raise TypeError(msg)
    also = [name for name, value in keywords.items() if value != getattr(_DEFAULT_LIMITS, name)]
    if also:
        msg = f"give limits=Limits(...) or the limit keywords, not both (also given: {', '.join(also)})"
        raise ValueError(msg)
    return limits


def model_keywords(model: Any, output: OutputSpec | None) -> dict[str, dict[str, Any]] | None:
    """What each model method is called with besides messages and tools (None: nothing).

    A typed answer's schema goes as ``output=`` to the methods that take that
    keyword; a model whose methods do not is free to ignore the schema.
    """
    request = None if output is None else output.request
    if request is None:
        return None
    methods: tuple[str, ...] = ("complete", "acomplete", "complete_stream", "acomplete_stream")
    found: dict[str, Callable[..., Any] | None] = {name: getattr(model, name, None) for name in methods}
    return {name: {"output": request} if accepts_output(method) else {} for name, method in found.items()}


# --- what every run reads from the registry -----------------------------------------------------------------

Parts = tuple[int, Mapping[str, ChildTool], tuple[Guard, ...], list[JSONSchema]]
"""``Agent.run_parts``: the tools' version, the sub-agents, the guards of parts the agent lacks, the schemas."""
NO_PARTS: Parts = (-1, {}, (), [])
"""The parts of an agent not yet looked up: never changed, ``refresh_parts`` replaces them."""


def schemas_of(registry: ToolRegistry) -> list[JSONSchema]:
    """The tools' schemas, by the registry's own method: a subclass may build them its way."""
    return registry.schemas()


def parts_of(registry: ToolRegistry) -> tuple[dict[str, ChildTool], bool, list[JSONSchema]]:
    """The sub-agents, whether one passes its stop on, and the schemas: one registry entry for what runs read."""
    return (*registry.cached("children", children_in), registry.cached("schemas", schemas_of))


def plain_parts(registry: ToolRegistry) -> Parts:
    """``Agent.refresh_parts`` for an agent whose unused guards are ``PLAIN_UNUSED``: kept in the registry for all."""
    children, raising, schemas = registry.cached("parts", parts_of)
    return registry.version, children, PLAIN_UNUSED if raising else (*PLAIN_UNUSED, passes_child_stop), schemas
