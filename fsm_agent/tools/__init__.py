"""Tools: plain functions registered with a ``ToolRegistry``, offered to the model as JSON Schemas.

- ``schema``: JSON Schema from type hints, and the check of a call's arguments.
- ``calling``: how a function is called (sync, async, worker threads, deadlines).
- ``context``: ``RunContext``, the run a tool (or a check) is called for, with the application's deps.
- ``caps``: how much of one tool's output the model sees.
- ``given``: what registration is given, checked: a function, a name providers accept, a bound method.
- ``registry``: ``ToolRegistry``, ``Tool`` and ``ToolResult``: registration, execution, output caps.
- ``builtin``: the command line's safe demonstration tools.
"""

from fsm_agent.tools.caps import DEFAULT_MAX_OUTPUT_CHARS
from fsm_agent.tools.context import NoDepsError, RunContext, run_context
from fsm_agent.tools.registry import Tool, ToolRegistry, ToolResult
from fsm_agent.tools.schema import JSONSchema, ToolFunction, arguments_error

__all__ = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "JSONSchema",
    "NoDepsError",
    "RunContext",
    "Tool",
    "ToolFunction",
    "ToolRegistry",
    "ToolResult",
    "arguments_error",
    "run_context",
]
