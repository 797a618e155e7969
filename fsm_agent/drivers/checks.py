"""The checks of an ``Agent``'s arguments: each mistake a clear error when the agent is built, never mid-run."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from fsm_agent.core.output import OutputSpec, accepts_output
from fsm_agent.definition.limits import Limits
from fsm_agent.tools import ToolRegistry


def check_parts(model: Any, registry: Any, system: Any, clock: Any, max_concurrency: Any, tool_timeout: Any) -> None:
    """The model, the tools, the system prompt, the clock and the concurrency and tool-timeout settings."""
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


_LIMITS: dict[tuple[Any, ...], Limits] = {}
"""Limits by their keyword values: frozen, so agents built with the same keywords (one per request) share one."""


def limits_of(limits: Any, keywords: Mapping[str, Any]) -> Limits:
    """The agent's limits: ``limits=Limits(...)`` or the limit keywords, not both."""
    if limits is None:
        try:
            key = tuple((type(value), value) for value in keywords.values())  # True is not 1 here
            found = _LIMITS.get(key)
        except TypeError:  # a per-tool max_tool_calls dict: built each time
            return Limits(**keywords)
        if found is None:
            if len(_LIMITS) >= 256:
                _LIMITS.clear()
            found = _LIMITS[key] = Limits(**keywords)  # Limits validates each value and names it
        return found
    if not isinstance(limits, Limits):
        msg = f"limits must be a Limits, got {type(limits).__name__}"
        raise TypeError(msg)
    given = [name for name, value in keywords.items() if value != getattr(Limits(), name)]
    if given:
        msg = f"give limits=Limits(...) or the limit keywords, not both (also given: {', '.join(given)})"
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
