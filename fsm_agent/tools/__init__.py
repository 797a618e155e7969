"""Tools: plain functions registered with a ``ToolRegistry``, offered to the model as JSON Schemas.

- ``schema``: JSON Schema from type hints, and the check of a call's arguments.
- ``calling``: how a function is called (sync, async, worker threads, deadlines).
- ``registry``: ``ToolRegistry``, ``Tool`` and ``ToolResult``: registration, execution, output caps.
- ``builtin``: the command line's safe demonstration tools.
"""

from fsm_agent.tools.registry import DEFAULT_MAX_OUTPUT_CHARS, Tool, ToolRegistry, ToolResult
from fsm_agent.tools.schema import JSONSchema, ToolFunction, arguments_error

__all__ = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "JSONSchema",
    "Tool",
    "ToolFunction",
    "ToolRegistry",
    "ToolResult",
    "arguments_error",
]
