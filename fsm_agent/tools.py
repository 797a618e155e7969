"""The tool registry: plain functions in, JSON Schemas and structured results out.

A tool's failure is known structurally, never by searching its output: the
tool is unknown, its arguments do not fit its signature, it raised, its value
cannot be encoded as JSON, or it returned a dict with a top-level ``"error"``
key.  Everything else is a success, even a result that mentions the word
"error".  ``call`` never raises for a tool's fault; ``BaseException``s that are
not ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) still propagate.

A return value that JSON cannot encode (a set, bytes, NaN, an object, a
structure that contains itself) is an error result naming the tool, not a
conversion: a guessed ``str(value)`` would hand the model text nobody
designed.  Output longer than the registry's ``max_output_chars`` is cut, with
a marker saying how much, so one tool cannot flood the conversation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import re
import threading
import types
import typing
from collections.abc import Awaitable, Callable, Iterator, Mapping
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
    truncated: int = 0
    """Characters cut from ``content`` by the registry's ``max_output_chars`` (0: the output is whole)."""

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


def _json_problem(raw: str) -> str:
    try:
        json.loads(raw)
    except ValueError as exc:
        return f"{exc}; received {raw[:200]!r}"
    return f"not a JSON object: {raw[:200]!r}"


def _error(message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": message}, ensure_ascii=False), message)


DEFAULT_MAX_OUTPUT_CHARS = 100_000
"""The default cap on one tool's output: about 25k tokens, far above a useful answer, far below a flood."""


def _clip(text: str, cap: int) -> tuple[str, int]:
    """``text`` cut to ``cap`` characters plus a marker saying how many were cut, and that number."""
    cut = len(text) - cap
    if cut <= 0:
        return text, 0
    return f"{text[:cap]}\n[truncated: {cut} of {len(text)} characters cut, max_output_chars={cap}]", cut


def _max_output_chars(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        msg = f"max_output_chars must be an integer >= 1, or None for no cap, got {value!r}"
        raise ValueError(msg)
    return value


_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""Tool names both OpenAI and Anthropic accept."""


class _DeadlineError(Exception):
    """A sync tool ran past its timeout (kept apart from a ``TimeoutError`` the tool raised itself)."""


def _raised(call: ToolCall, exc: BaseException) -> ToolResult:
    return _error(f"tool {call.name!r} raised {type(exc).__name__}: {exc}")


def _encoded(call: ToolCall, value: Any) -> ToolResult:
    """The JSON text of a tool's value; a value with a top-level ``"error"`` key is a failure."""
    try:
        content = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return _error(f"tool {call.name!r} returned a value that cannot be encoded as JSON: {exc}")
    if isinstance(value, Mapping) and "error" in value:
        return ToolResult(content, str(value["error"]))
    return ToolResult(content)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _call_sync(function: ToolFunction, arguments: dict[str, Any]) -> Any:
    """Call a tool from sync code; an awaitable result is run to completion on an event loop of its own."""
    value = function(**arguments)
    if not inspect.isawaitable(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(value))
    # Called from inside a running loop (a sync driver within async code): use a loop on another thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _awaited(value)).result()


def _in_daemon_thread(function: ToolFunction, arguments: dict[str, Any], name: str) -> asyncio.Future[Any]:
    """Run a sync tool in a thread of its own, so one abandoned at its deadline never holds up the event loop's exit.

    (``asyncio.to_thread`` uses the loop's executor, whose threads
    ``asyncio.run`` waits for when it closes.)
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def work() -> None:
        try:
            value, error = _call_sync(function, arguments), None
        except BaseException as exc:  # noqa: BLE001 - handed back to the loop below
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop may be closed by the time an abandoned call ends
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name=f"fsm_agent tool {name}", daemon=True).start()
    return future


def _call_with_deadline(function: ToolFunction, arguments: dict[str, Any], timeout: float, name: str) -> Any:
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = _call_sync(function, arguments)
        except BaseException as exc:  # noqa: BLE001 - handed back to the calling thread below
            outcome["error"] = exc

    worker = threading.Thread(target=work, name=f"fsm_agent tool {name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise _DeadlineError
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class ToolRegistry:
    """Functions the model may call, with schemas derived from their type hints and docstrings.

    A function without a docstring gets an empty description; a parameter
    without an annotation accepts any JSON value.  Both are allowed because the
    model still sees the parameter names, but documented functions work better.

    ``max_output_chars`` caps the text of one result (default
    ``DEFAULT_MAX_OUTPUT_CHARS`` = 100,000; ``None`` for no cap).  Longer output
    keeps its first ``max_output_chars`` characters followed by a line
    ``[truncated: N of M characters cut, max_output_chars=C]``, so the model
    sees that it was cut, and ``ToolResult.truncated`` records N.  A cut result
    keeps its success or failure.
    """

    def __init__(self, *, max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS) -> None:
        self._tools: dict[str, Tool] = {}
        self.max_output_chars = _max_output_chars(max_output_chars)

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
        if not _TOOL_NAME.fullmatch(tool_name):
            # Providers reject other names, but only at the first model call; "<lambda>" is the usual culprit.
            msg = f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'; pass name=... (e.g. for a lambda)"
            raise ValueError(msg)
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

    def execute(self, call: ToolCall, timeout: float | None = None) -> ToolResult:
        """Run one tool call and classify the outcome, capped at ``max_output_chars``; never raises for its fault.

        An ``async def`` tool is run to completion on an event loop of its own.
        With ``timeout``, the call runs in a worker thread that is abandoned
        (Python cannot kill a thread) once the deadline passes, and the
        outcome is an error result saying the tool timed out.
        """
        prepared = self._prepare(call)
        if isinstance(prepared, ToolResult):
            return prepared
        try:
            if timeout is None:
                value = _call_sync(prepared.function, call.arguments)
            else:
                value = _call_with_deadline(prepared.function, call.arguments, timeout, call.name)
        except _DeadlineError:
            return self._capped(_error(f"tool {call.name!r} timed out after {timeout:g} s"))
        except Exception as exc:  # noqa: BLE001 - a tool's exception is data for the model, not a crash
            return self._capped(_raised(call, exc))
        return self._capped(_encoded(call, value))

    async def aexecute(self, call: ToolCall, timeout: float | None = None) -> ToolResult:
        """Like ``execute`` for the async driver: async tools are awaited, sync ones run in a worker thread.

        At the ``timeout`` an async tool is cancelled; a sync one is left to
        finish in its thread, its result discarded.
        """
        prepared = self._prepare(call)
        if isinstance(prepared, ToolResult):
            return prepared
        function = prepared.function
        try:
            async with asyncio.timeout(timeout) as deadline:
                if inspect.iscoroutinefunction(function):
                    value = await function(**call.arguments)
                elif timeout is None:
                    value = await asyncio.to_thread(_call_sync, function, call.arguments)
                else:
                    value = await _in_daemon_thread(function, call.arguments, call.name)
        except TimeoutError as exc:
            if deadline.expired():
                return self._capped(_error(f"tool {call.name!r} timed out after {timeout:g} s"))
            return self._capped(_raised(call, exc))
        except Exception as exc:  # noqa: BLE001 - a tool's exception is data for the model, not a crash
            return self._capped(_raised(call, exc))
        return self._capped(_encoded(call, value))

    def _prepare(self, call: ToolCall) -> Tool | ToolResult:
        """The tool to call, or the error result of a call that cannot be made (unknown tool, bad arguments)."""
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return _error(f"unknown tool {call.name!r}; registered tools: {known}")
        if call.raw_arguments is not None:
            return _error(f"arguments for tool {call.name!r} are not valid JSON ({_json_problem(call.raw_arguments)})")
        problem = arguments_error(call.arguments, tool.parameters)
        if problem is not None:
            return _error(f"bad arguments for tool {call.name!r}: {problem}")
        return tool

    def _capped(self, outcome: ToolResult) -> ToolResult:
        cap = self.max_output_chars
        if cap is None or len(outcome.content) <= cap:
            return outcome
        content, cut = _clip(outcome.content, cap)
        error = None if outcome.error is None else _clip(outcome.error, cap)[0]
        return ToolResult(content, error, cut)

    def call(self, call: ToolCall) -> str:
        """Run one tool call and return the JSON text the model sees (``{"error": ...}`` on failure)."""
        return self.execute(call).content
