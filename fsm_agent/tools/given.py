"""What ``ToolRegistry.register`` is given, checked before anything is registered: each mistake a named error.

A function, not its name; a tool name the providers accept; a method bound
to its instance, not taken from its class; a ``RunContext`` parameter that
a given schema does not also name.  Each is found here, at
registration, rather than by the first model call (a provider refusing the
name) or by every call the model makes (a ``self`` it cannot fill).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from fsm_agent.tools.context import context_parameter
from fsm_agent.tools.schema import JSONSchema, ToolFunction

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""Tool names both OpenAI and Anthropic accept."""


def check_given(function: Any, name: Any) -> None:
    """A ``TypeError`` unless ``function`` is callable (a str: the tool's name, given where the function goes)."""
    if isinstance(function, str):
        msg = f"register takes the function, not its name: name the tool with @register(name={function!r})"
        raise TypeError(msg)
    if not callable(function):
        msg = f"a tool must be a function (or another callable), got {type(function).__name__}"
        raise TypeError(msg)
    if name is not None and not isinstance(name, str):
        msg = f"a tool's name must be a str, got {type(name).__name__}"
        raise TypeError(msg)


def check_name(name: str) -> None:
    """A ``ValueError`` for a name providers refuse, but only at the first model call; "<lambda>" is the usual one."""
    if not TOOL_NAME.fullmatch(name):
        msg = f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'; pass name=... (e.g. for a lambda)"
        raise ValueError(msg)


def check_bound(function: ToolFunction, name: str) -> None:
    """A ``TypeError`` for a method taken from its class (``register(Forecasts.forecast)``): its ``self`` unfilled.

    The model would be shown ``self`` as a parameter to fill, and every call
    it made without one would fail; the bound method of an instance has none.
    """
    if not inspect.isfunction(function):
        return
    owner, _, _ = function.__qualname__.rpartition(".")
    if not owner or owner.endswith("<locals>"):  # a module's function, or one defined inside a function
        return
    first = next(iter(inspect.signature(function).parameters), None)
    if first == "self":
        msg = (
            f"tool {name!r} takes self: {function.__qualname__} was taken from its class; "
            f"register the bound method of an instance instead, as register({owner}().{function.__name__})"
        )
        raise TypeError(msg)


def given_schema_context(function: ToolFunction, parameters: JSONSchema, name: str) -> str | None:
    """The ``RunContext`` parameter of a function registered with its own schema, which must not be a property of it."""
    context = context_parameter(function)
    if context is not None and context in (parameters.get("properties") or {}):
        msg = f"tool {name!r}: its RunContext parameter {context!r} is also a property of its schema"
        raise ValueError(msg)
    return context
