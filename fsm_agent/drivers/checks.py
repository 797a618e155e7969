"""The checks of an ``Agent``'s arguments and what it derives from them: each mistake an error when it is built."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from fsm_agent.core.approval import approval_rule
from fsm_agent.core.history import history_settings
from fsm_agent.core.output import OutputSpec, accepts_output, output_spec
from fsm_agent.core.walker import Walker, walker_for
from fsm_agent.definition.guards import Guard, passes_child_stop
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.stops import StopCondition, check_policies, user_stops
from fsm_agent.definition.table import BUILTIN_REASONS, COMPACTING_GUARDS, TABLE, TYPED_GUARDS
from fsm_agent.drivers.child import ChildTool, children_in
from fsm_agent.records import Message, ToolCall
from fsm_agent.tools import JSONSchema, ToolRegistry

LIMIT_KEYWORDS = ("max_steps", "max_consecutive_failures", "timeout", "token_budget", "max_tool_calls", "cycle_window")
"""The ``Agent`` keywords of the limits, in the order ``limits_of`` is given their values."""

_LIMITS: dict[tuple[Any, ...], tuple[tuple[Any, ...], Limits]] = {}
"""Limits by their keyword values (and the values they were built from): frozen, so agents built with the same
keywords (one per request) share one."""


def limits_of(limits: Any, given: tuple[Any, ...]) -> Limits:
    """The agent's limits: ``limits=Limits(...)`` or the limit keywords (``given``, as ``LIMIT_KEYWORDS``), not both."""
    if limits is None:
        try:
            found = _LIMITS.get(given)
        except TypeError:  # a per-tool max_tool_calls dict: built each time
            return Limits(**dict(zip(LIMIT_KEYWORDS, given, strict=True)))
        if found is not None:
            held = found[0]
            # Equal is not the same (True == 1, 5.0 == 5): the very objects (small ints, the keywords' defaults)
            # are, and are quick to tell; else the types must be the same.  Building the key of types every
            # time cost a tenth of a fresh agent (``make bench``).
            same = given[0] is held[0] and given[1] is held[1] and given[2] is held[2] and given[3] is held[3]
            if (same and given[4] is held[4] and given[5] is held[5]) or [*map(type, given)] == [*map(type, held)]:
                return found[1]
        if len(_LIMITS) >= 256:
            _LIMITS.clear()
        built = Limits(**dict(zip(LIMIT_KEYWORDS, given, strict=True)))  # Limits validates each value and names it
        _LIMITS[given] = (given, built)
        return built
    if not isinstance(limits, Limits):
        msg = f"limits must be a Limits, got {type(limits).__name__}"
        raise TypeError(msg)
    keywords = dict(zip(LIMIT_KEYWORDS, given, strict=True))
    also = [name for name, value in keywords.items() if value != getattr(Limits(), name)]
    if also:
        msg = f"give limits=Limits(...) or the limit keywords, not both (also given: {', '.join(also)})"
        raise ValueError(msg)
    return limits


Settings = tuple[
    OutputSpec | None,
    dict[str, dict[str, Any]] | None,
    Callable[[ToolCall], bool] | None,
    Limits,
    tuple[StopCondition, ...],
    Walker,
    dict[str, str],
    tuple[Callable[[list[Message]], Any], ...],
    Callable[[list[Message]], Any] | None,
    tuple[Guard, ...],
]
_PLAIN_POLICIES = check_policies(None, TABLE.stop_for)
PLAIN_UNUSED = (*TYPED_GUARDS, *COMPACTING_GUARDS)
"""The unused guards of an agent without a typed answer or compaction (most): one tuple for all of them."""
_NONE: tuple[()] = ()
_plain: list[Walker] = []  # the built-in table's walker, found once: walker_for(TABLE), without its call


def settings(
    model: Any,
    registry: Any,
    system: Any,
    clock: Any,
    max_concurrency: Any,
    tool_timeout: Any,
    output_type: Any,
    validators: Any,
    retries: Any,
    approve: Any,
    limits: Any,
    given: tuple[Any, ...],
    stop_conditions: Any,
    on_stop: Any,
    processors: Any,
    compact: Any,
) -> Settings:
    """What an agent derives from its arguments, each checked, in this order.

    First its parts (the model, the tools, the system prompt, the clock, the concurrency and tool-timeout
    settings); then, derived, the typed answer and the keywords it asks the model for, the approval rule, the
    limits, the stop conditions, the walker of the table they make, the stop policies, the history settings, and
    the guards of what the agent lacks.  One function, and for an agent that sets none of the latter but limits
    (most, a fresh one per request among them) the defaults without a call per check: those calls were a fifth
    of a fresh agent's cost (``make bench``).
    """
    if not callable(getattr(model, "complete", None)) and not callable(getattr(model, "acomplete", None)):
        msg = f"model must have a complete(messages, tools) method, got {type(model).__name__}"
        raise TypeError(msg)
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
    if (  # the keywords' defaults; () is one object, so any other value takes the checks below
        output_type is None
        and approve is None
        and on_stop is None
        and compact is None
        and validators is _NONE
        and stop_conditions is _NONE
        and processors is _NONE
        and type(retries) is int
        and retries >= 0
    ):
        if not _plain:
            _plain.append(walker_for(TABLE))
        return None, None, None, limits_of(limits, given), (), _plain[0], dict(_PLAIN_POLICIES), (), None, PLAIN_UNUSED
    output = output_spec(output_type, validators, retries)
    keywords = None if output is None else model_keywords(model, output)
    rule = None if approve is None else approval_rule(approve)
    limits = limits_of(limits, given)
    stops = user_stops(stop_conditions, BUILTIN_REASONS)
    walker = walker_for(TABLE.with_stops(stops))
    policies = check_policies(on_stop, walker.table.stop_for)
    processors, compact = history_settings(processors, compact, policies)
    unused = (*(() if output else TYPED_GUARDS), *(() if compact else COMPACTING_GUARDS))
    unused = PLAIN_UNUSED if unused == PLAIN_UNUSED else unused  # one tuple for all plain agents (their parts)
    return output, keywords, rule, limits, stops, walker, policies, processors, compact, unused


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
