"""JSON Schema from a tool's type hints, and the check of a call's arguments against it.

Only the subset of JSON Schema that plain Python annotations map onto is
emitted (``type``, ``items``, ``additionalProperties``, ``enum``, ``anyOf``),
and ``arguments_error`` checks exactly that subset with JSON Schema semantics
and no coercion: a bool is not an integer, an integer is a number, ``1.0`` is
not an integer.

A parameter named ``call_id`` is not offered to the model: the registry fills
it with the ``ToolCall``'s id (see ``accepts_call_id``); nor is one annotated
``RunContext[T]``, which it fills with the run's context (``tools.context``).
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable
from typing import Any

from fsm_agent.tools.context import context_parameter

JSONSchema = dict[str, Any]
ToolFunction = Callable[..., Any]

CALL_ID = "call_id"
"""The parameter through which a tool receives its ``ToolCall.id``, filled by the registry, never by the model."""

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def accepts_call_id(function: ToolFunction) -> bool:
    """True when ``function`` declares a ``call_id`` parameter that can be passed by keyword."""
    param = inspect.signature(function).parameters.get(CALL_ID)
    return param is not None and param.kind in _BY_KEYWORD


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


def parameters_schema(function: ToolFunction, name: str) -> JSONSchema:
    """``function``'s parameters as JSON Schema, ``call_id`` and a ``RunContext`` left out; bad hints: ``TypeError``."""
    hints = typing.get_type_hints(function)
    context = context_parameter(function)
    properties: dict[str, JSONSchema] = {}
    required: list[str] = []
    extra_allowed = False
    for param in inspect.signature(function).parameters.values():
        where = f"tool {name!r}, parameter {param.name!r}"
        if param.name == CALL_ID and param.kind in _BY_KEYWORD:
            continue  # filled by the registry with the ToolCall's id
        if param.name == context:
            continue  # filled by the registry with the run's context
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
    # JSON object keys are strings; any other key cannot name a parameter (and would break the messages below).
    odd_key = next((key for key in arguments if not isinstance(key, str)), None)
    if odd_key is not None:
        return f"arguments must be a JSON object with string keys, got key {odd_key!r}"
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


def json_problem(raw: str) -> str:
    """Why ``raw`` (arguments a model sent as text) is not a JSON object, with the start of the text."""
    try:
        json.loads(raw)
    except ValueError as exc:
        return f"{exc}; received {raw[:200]!r}"
    return f"not a JSON object: {raw[:200]!r}"
