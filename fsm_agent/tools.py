"""The tool registry: plain functions in, JSON Schemas and structured results out.

A tool's failure is known structurally, never by searching its output: the
tool is unknown, its arguments do not fit its signature, it raised, its value
cannot be encoded as JSON, or it returned a dict with a top-level ``"error"``
key.  Everything else is a success, even a result that mentions the word
"error".  ``call`` never raises for a tool's fault; ``BaseException``s that are
not ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) still propagate.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, overload

import attrs

from fsm_agent.records import ToolCall

JSONSchema = dict[str, Any]
ToolFunction = Callable[..., Any]

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


@attrs.frozen
class ToolResult:
    """The outcome of one tool call: the text the model sees and, on failure, why."""

    content: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the call succeeded."""
        return self.error is None


@attrs.frozen
class Tool:
    """A registered function with the JSON Schema the model is shown."""

    name: str
    description: str
    function: ToolFunction
    parameters: JSONSchema

    @property
    def schema(self) -> JSONSchema:
        """The tool as offered to a model: name, description and parameters."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


def _type_schema(hint: Any, where: str) -> JSONSchema:
    """Translate one annotation into JSON Schema; unsupported annotations are a registration error."""
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is typing.Union or origin is types.UnionType:
        return {"anyOf": [_type_schema(arg, where) for arg in args]}
    if hint in (list, tuple) or origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            msg = f"{where}: fixed-length tuple annotations are not supported; use list[T] or tuple[T, ...]"
            raise TypeError(msg)
        return {"type": "array", "items": _type_schema(args[0], where)} if args else {"type": "array"}
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            msg = f"{where}: dict keys must be str to map onto a JSON object"
            raise TypeError(msg)
        return {"type": "object", "additionalProperties": _type_schema(args[1], where)} if args else {"type": "object"}
    msg = (
        f"{where}: annotation {hint!r} has no JSON Schema equivalent; "
        "use str, int, float, bool, list, dict, Literal, a union of them, or Any"
    )
    raise TypeError(msg)


def _parameters_schema(function: ToolFunction, name: str) -> JSONSchema:
    hints = typing.get_type_hints(function)
    properties: dict[str, JSONSchema] = {}
    required: list[str] = []
    extra_allowed = False
    for param in inspect.signature(function).parameters.values():
        where = f"tool {name!r}, parameter {param.name!r}"
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra_allowed = True
            continue
        if param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            msg = f"{where}: tools are called with keyword arguments; positional-only and *args cannot be filled"
            raise TypeError(msg)
        properties[param.name] = _type_schema(hints.get(param.name, inspect.Parameter.empty), where)
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": extra_allowed}


def _type_ok(value: Any, kind: str) -> bool:
    # bool is a subclass of int in Python but not an integer in JSON Schema.
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "array":
        return isinstance(value, list | tuple)
    if kind == "object":
        return isinstance(value, dict)
    return False


def _json_kind(value: Any) -> str:
    for kind in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _type_ok(value, kind):
            return kind
    return type(value).__name__


def _schema_error(value: Any, schema: JSONSchema, path: str) -> str | None:
    """Return why ``value`` does not fit ``schema`` (the subset ``_type_schema`` emits), or None."""
    if "anyOf" in schema:
        errors = [_schema_error(value, option, path) for option in schema["anyOf"]]
        if None in errors:
            return None
        # Where the value has the right outer type, the inner mismatch is the useful message.
        same_kind = [e for e, o in zip(errors, schema["anyOf"], strict=True) if _type_ok(value, o.get("type", ""))]
        return same_kind[0] if same_kind else f"{path}: {_json_kind(value)} {value!r} matches none of the allowed types"
    if "enum" in schema:
        if any(value == option and type(value) is type(option) for option in schema["enum"]):
            return None
        return f"{path}: {value!r} is not one of {schema['enum']!r}"
    kind = schema.get("type")
    if kind is None:
        return None
    if not _type_ok(value, kind):
        return f"{path}: expected {kind}, got {_json_kind(value)} {value!r}"
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            if (error := _schema_error(item, schema["items"], f"{path}[{i}]")) is not None:
                return error
    if kind == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        for key, item in value.items():
            if (error := _schema_error(item, schema["additionalProperties"], f"{path}.{key}")) is not None:
                return error
    return None


def arguments_error(arguments: Any, parameters: JSONSchema) -> str | None:
    """Check call arguments against a tool's parameter schema; return the first problem or None."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {_json_kind(arguments)}"
    properties: dict[str, JSONSchema] = parameters["properties"]
    missing = [name for name in parameters["required"] if name not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    if not parameters["additionalProperties"]:
        extra = sorted(name for name in arguments if name not in properties)
        if extra:
            return f"unexpected argument(s): {', '.join(extra)}; allowed: {', '.join(properties) or 'none'}"
    for name, value in arguments.items():
        if name in properties and (error := _schema_error(value, properties[name], name)) is not None:
            return error
    return None


def _json_problem(raw: str) -> str:
    try:
        json.loads(raw)
    except ValueError as exc:
        return f"{exc}; received {raw[:200]!r}"
    return f"not a JSON object: {raw[:200]!r}"


def _error(message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": message}, ensure_ascii=False), message)


class ToolRegistry:
    """Functions the model may call, with schemas derived from their type hints and docstrings.

    A function without a docstring gets an empty description; a parameter
    without an annotation accepts any JSON value.  Both are allowed because the
    model still sees the parameter names, but documented functions work better.
    """

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    @overload
    def register(
        self, function: ToolFunction, *, name: str | None = None, description: str | None = None
    ) -> ToolFunction: ...

    @overload
    def register(
        self, function: None = None, *, name: str | None = None, description: str | None = None
    ) -> Callable[[ToolFunction], ToolFunction]: ...

    def register(
        self, function: ToolFunction | None = None, *, name: str | None = None, description: str | None = None
    ) -> ToolFunction | Callable[[ToolFunction], ToolFunction]:
        """Register ``function`` as a tool; usable as ``@register`` or ``@register(name=...)``.

        Returns the function unchanged so decorated functions stay callable.
        Registering a name twice is a ``ValueError``: silently replacing a tool
        would change what an agent does without anyone noticing.
        """
        if function is None:
            return lambda fn: self.register(fn, name=name, description=description)
        tool_name = name or function.__name__
        if tool_name in self._tools:
            msg = f"a tool named {tool_name!r} is already registered"
            raise ValueError(msg)
        doc = description if description is not None else (inspect.getdoc(function) or "")
        self._tools[tool_name] = Tool(tool_name, doc, function, _parameters_schema(function, tool_name))
        return function

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool | None:
        """The registered tool called ``name``, or None."""
        return self._tools.get(name)

    def schemas(self) -> list[JSONSchema]:
        """One JSON Schema per tool: ``{"name", "description", "parameters"}``, in registration order."""
        return [tool.schema for tool in self._tools.values()]

    def execute(self, call: ToolCall) -> ToolResult:
        """Run one tool call and classify the outcome; never raises for the tool's fault."""
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return _error(f"unknown tool {call.name!r}; registered tools: {known}")
        if call.raw_arguments is not None:
            return _error(f"arguments for tool {call.name!r} are not valid JSON ({_json_problem(call.raw_arguments)})")
        problem = arguments_error(call.arguments, tool.parameters)
        if problem is not None:
            return _error(f"bad arguments for tool {call.name!r}: {problem}")
        try:
            value = tool.function(**call.arguments)
        except Exception as exc:  # noqa: BLE001 - a tool's exception is data for the model, not a crash
            return _error(f"tool {call.name!r} raised {type(exc).__name__}: {exc}")
        try:
            content = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            return _error(f"tool {call.name!r} returned a value that cannot be encoded as JSON: {exc}")
        if isinstance(value, Mapping) and "error" in value:
            return ToolResult(content, str(value["error"]))
        return ToolResult(content)

    def call(self, call: ToolCall) -> str:
        """Run one tool call and return the JSON text the model sees (``{"error": ...}`` on failure)."""
        return self.execute(call).content
