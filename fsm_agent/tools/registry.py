"""The tool registry: plain functions in, JSON Schemas and structured results out.

A tool's failure is known structurally, never by searching its output: the
tool is unknown, its arguments do not fit its signature, it raised, its value
cannot be encoded as JSON, or it returned a dict with a top-level ``"error"``
key.  Everything else is a success, even a result that mentions the word
"error".  ``call`` never raises for a tool's fault: a tool that raises
``asyncio.CancelledError`` while nobody cancelled the call, or ``GeneratorExit``,
has failed like any other.  ``KeyboardInterrupt`` and ``SystemExit`` still
propagate, and so does a real cancellation of the task awaiting ``aexecute``.

A return value that JSON cannot encode (a set, bytes, NaN, an object, a
structure that contains itself, a dict key that is not a string) is an
error result naming the tool, not a conversion: a guessed ``str(value)``
would hand the model text nobody designed.  Output longer than the
registry's ``max_output_chars`` is cut, with a marker saying how much, so
one tool cannot flood the conversation.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Never, TypeVar, overload

import attrs

from fsm_agent.records import ChildOutcome, ToolCall
from fsm_agent.tools.calling import DeadlineError, ToolExit, call_sync, call_with_deadline, own_arguments, started
from fsm_agent.tools.caps import DEFAULT_MAX_OUTPUT_CHARS, clip
from fsm_agent.tools.caps import max_output_chars as max_output_chars_of
from fsm_agent.tools.context import context_for, context_parameter
from fsm_agent.tools.encoding import json_text
from fsm_agent.tools.given import check_bound, check_given, check_name, given_schema_context
from fsm_agent.tools.schema import (
    CALL_ID,
    JSONSchema,
    ToolFunction,
    accepts_call_id,
    arguments_error,
    json_problem,
    parameters_schema,
)

T = TypeVar("T")
F = TypeVar("F", bound=ToolFunction)  # a registered function, handed back as it is: its signature kept for a checker


@attrs.frozen
class ToolResult:
    """The outcome of one tool call: the text the model sees and, on failure, why."""

    content: str
    error: str | None = None
    truncated: int = 0
    """Characters cut from ``content`` by the registry's ``max_output_chars`` (0: the output is whole)."""
    child: ChildOutcome | None = None
    """The sub-agent run the call was (``Agent.as_tool``), or None for any other tool."""
    reused_from: str | None = None
    """On a fork: the source run's call (``run_id/call_id``) this result was recorded for, not made again."""

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
    takes_call_id: bool = False
    """The function declares ``call_id``: the registry passes it the ``ToolCall.id`` (never shown to the model)."""
    schema_given: bool = False
    """``parameters`` was given as is (an MCP server's input schema): arguments are checked only to be an object.

    The schema's owner validates the rest; the registry's checker knows only
    the subset of JSON Schema it emits itself, and would misjudge the others.
    """
    takes_context: str | None = None
    """The function's parameter annotated ``RunContext[T]``: the registry passes it the run's context there."""

    @property
    def schema(self) -> JSONSchema:
        """The tool as offered to a model: name, description and parameters."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


def _error(message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": message}, ensure_ascii=False), message)


_ANY_OBJECT: JSONSchema = {"properties": {}, "required": [], "additionalProperties": True}
"""What the registry itself checks of arguments to a tool whose schema was given: a JSON object, nothing more."""


def _tool_fault(exc: BaseException) -> bool:
    """True when a tool raising ``exc`` has failed on its own: ``Exception``, ``GeneratorExit``, ``CancelledError``.

    ``asyncio`` is imported only for an exception that is neither of the first
    two (a ``CancelledError`` exists only once asyncio is loaded), so neither
    ``import fsm_agent`` nor a sync tool that fails loads it.  ``aexecute``
    first tells a real cancellation apart; ``KeyboardInterrupt`` and
    ``SystemExit`` are not faults.
    """
    if isinstance(exc, (Exception, GeneratorExit)):
        return True
    import asyncio

    return isinstance(exc, asyncio.CancelledError)


def _cancelled_from_outside() -> bool:
    """True when someone asked to cancel the current task (``cancelling()``), not just a tool raising it."""
    import asyncio

    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _raised(call: ToolCall, exc: BaseException) -> ToolResult:
    if isinstance(exc, ToolExit):
        exc = exc.original  # the model hears what the tool raised, whichever driver ran it
    return _error(f"tool {call.name!r} raised {type(exc).__name__}: {exc}")


def _encoded(call: ToolCall, value: Any) -> ToolResult:
    """The JSON text of a tool's value; a value with a top-level ``"error"`` key is a failure.

    A ``ToolResult`` is taken as it is: a tool that knows its own outcome
    (an MCP server's ``isError``, text that must not be JSON-quoted) says so.
    """
    if isinstance(value, ToolResult):
        return value
    try:
        content = json_text(value)
    except (TypeError, ValueError) as exc:
        return _error(f"tool {call.name!r} returned a value that cannot be encoded as JSON: {exc}")
    if isinstance(value, Mapping) and "error" in value:
        return ToolResult(content, str(value["error"]))
    return ToolResult(content)


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

    A tool gets its own deep copy of the call's arguments, so a tool that
    changes them (appends to a list it was given) cannot change the
    ``ToolCall`` recorded in the run's history.  A function that declares a
    parameter named ``call_id`` receives the ``ToolCall.id`` there, to make
    its effect idempotent (a call in flight when a process dies may run
    again on resume); ``call_id`` is not in the schema the model sees, and
    arguments that carry one are an error result.  A parameter annotated
    ``RunContext[T]`` (any name) gets the run's context the same way
    (``tools.context``): the application's ``deps``, the run id, usage, the call.
    """

    def __init__(
        self, *functions: Never, max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS, source: str = "local tools"
    ) -> None:
        if functions:  # ToolRegistry([f, g]): the functions go in one by one, or the list to Agent
            msg = "ToolRegistry() takes no tools: register each with tools.register(f), or pass Agent(model, [f, ...])"
            raise TypeError(msg)
        self._tools: dict[str, Tool] = {}
        self._sources: dict[str, str] = {}
        self.max_output_chars = max_output_chars_of(max_output_chars)
        self.source = source
        """Where this registry's own tools come from, named when a merge (``include``) finds a clash."""
        self.version = 0
        self._derived: dict[str, tuple[int, Any]] = {}
        """Counts the changes to the set of tools, so an agent rebuilds the schemas it offers only after one."""

    @overload
    def register(
        self,
        function: F,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: JSONSchema | None = None,
    ) -> F: ...

    @overload
    def register(
        self,
        function: None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: JSONSchema | None = None,
    ) -> Callable[[F], F]: ...

    def register(
        self,
        function: F | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: JSONSchema | None = None,
    ) -> F | Callable[[F], F]:
        """Register ``function`` as a tool; usable as ``@register`` or ``@register(name=...)``.

        Returns the function unchanged, so a decorated function stays callable (and typed as it was).  Registering
        a name twice is a ``ValueError``: silently replacing a tool would change what an agent does without anyone
        noticing.  With ``parameters`` the schema is shown to the model as given instead of being derived from type
        hints (tools of another system, such as an MCP server, bring their own); the registry then only checks that
        the arguments are a JSON object; ``call_id`` is not filled, a ``RunContext`` parameter is.
        """
        if not isinstance(self, ToolRegistry):  # ToolRegistry.register(f): f taken for the registry, nothing kept
            msg = "register is a registry's method: make one with tools = ToolRegistry(), then use @tools.register"
            raise TypeError(msg)
        if function is None:
            return lambda fn: self.register(fn, name=name, description=description, parameters=parameters)
        check_given(function, name)
        tool_name = name if name else str(getattr(function, "__name__", ""))
        self._check_free(tool_name, self.source)
        check_bound(function, tool_name)
        doc = description if description is not None else (inspect.getdoc(function) or "")
        if parameters is None:
            schema, context = parameters_schema(function, tool_name), context_parameter(function)
            tool = Tool(tool_name, doc, function, schema, accepts_call_id(function), takes_context=context)
        else:
            context = given_schema_context(function, parameters, tool_name)
            tool = Tool(tool_name, doc, function, dict(parameters), schema_given=True, takes_context=context)
        self._tools[tool_name] = tool
        self._sources[tool_name] = self.source
        self.version += 1
        return function

    def include(self, other: ToolRegistry, *, prefix: str = "") -> None:
        """Add every tool of ``other`` (an MCP server's, another set of local tools), named ``prefix + name``.

        A name that is already taken is a ``ValueError`` naming both sources,
        and nothing is added: which of two tools called ``search`` the model
        meant cannot be guessed, so the caller picks a ``prefix``.  The tools
        keep calling what they called (an MCP tool keeps its server-side name).
        """
        renamed = {prefix + name: other.get(name) for name in other}
        for new_name, tool in renamed.items():
            if tool is not None:
                self._check_free(new_name, other.source_of(tool.name), including=True)
        for new_name, tool in renamed.items():
            if tool is not None:
                self._tools[new_name] = attrs.evolve(tool, name=new_name)
                self._sources[new_name] = other.source_of(tool.name)
        self.version += 1

    def source_of(self, name: str) -> str:
        """Where the tool called ``name`` comes from (``source`` of the registry it was registered with)."""
        return self._sources.get(name, self.source)

    def _check_free(self, name: str, source: str, *, including: bool = False) -> None:
        check_name(name)
        if name in self._tools:
            taken = self._sources[name]
            if taken == source == self.source and not including:
                msg = f"a tool named {name!r} is already registered: register the other under a new name, with name=..."
            else:
                theirs = f"the {name!r} already registered here" if taken == source else f"{name!r} from {taken}"
                msg = f"tool {name!r} from {source} clashes with {theirs}; include one with prefix=..."
            raise ValueError(msg)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool | None:
        """The registered tool called ``name``, or None."""
        return self._tools.get(name)

    def cached(self, name: str, build: Callable[[ToolRegistry], T]) -> T:
        """``build(self)``, kept until the tools change: what agents derive from the tools, shared by all of them.

        Every agent over this registry (a fresh one per request, say) then
        finds it built; a race builds it twice, harmlessly.
        """
        found = self._derived.get(name)
        if found is None or found[0] != self.version:
            found = self._derived[name] = (self.version, build(self))
        value: T = found[1]  # an annotation, not typing.cast: that is a function call, on every run
        return value

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
        function, arguments = prepared
        try:
            if timeout is None:
                value = call_sync(function, arguments)
            else:
                value = call_with_deadline(function, arguments, timeout, call.name)
        except DeadlineError:
            return self._capped(_error(f"tool {call.name!r} timed out after {timeout:g} s"))
        except BaseException as exc:
            if not _tool_fault(exc):
                raise
            return self._capped(_raised(call, exc))  # a tool's exception is data for the model, not a crash
        return self._capped(_encoded(call, value))

    async def aexecute(self, call: ToolCall, timeout: float | None = None) -> ToolResult:
        """Like ``execute`` for the async driver: async tools are awaited, sync ones run in a worker thread.

        At the ``timeout`` an async tool is cancelled; a sync one is left to
        finish in its thread, its result discarded.  A ``CancelledError``
        propagates only when the awaiting task was really cancelled
        (``asyncio.current_task().cancelling()`` is not 0); raised by the
        tool on its own, it is an error result.
        """
        import asyncio

        prepared = self._prepare(call)
        if isinstance(prepared, ToolResult):
            return prepared
        function, arguments = prepared
        deadline = None
        try:
            if timeout is None:  # no timeout context: it costs more than calling a quick tool
                value = await started(function, arguments, None)
            else:
                async with asyncio.timeout(timeout) as deadline:
                    value = await started(function, arguments, timeout)
        except TimeoutError as exc:
            if deadline is not None and deadline.expired():
                return self._capped(_error(f"tool {call.name!r} timed out after {timeout:g} s"))
            return self._capped(_raised(call, exc))
        except asyncio.CancelledError as exc:
            if _cancelled_from_outside():
                raise
            return self._capped(_raised(call, exc))
        except (Exception, GeneratorExit) as exc:  # noqa: BLE001 - a tool's exception is data for the model, not a crash
            return self._capped(_raised(call, exc))
        return self._capped(_encoded(call, value))

    def _prepare(self, call: ToolCall) -> tuple[ToolFunction, dict[str, Any]] | ToolResult:
        """The function and the tool's own copy of its arguments, or the error result of a call that cannot be made."""
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return _error(f"unknown tool {call.name!r}; registered tools: {known}")
        if call.raw_arguments is not None:
            return _error(f"arguments for tool {call.name!r} are not valid JSON ({json_problem(call.raw_arguments)})")
        problem = arguments_error(call.arguments, _ANY_OBJECT if tool.schema_given else tool.parameters)
        if problem is not None:
            return _error(f"bad arguments for tool {call.name!r}: {problem}")
        arguments = own_arguments(call.arguments)
        if tool.takes_call_id:
            if CALL_ID in arguments:
                return _error(f"bad arguments for tool {call.name!r}: {CALL_ID} is filled by the registry, not passed")
            arguments[CALL_ID] = call.id
        if tool.takes_context is not None:
            if tool.takes_context in arguments:
                return _error(f"bad arguments for tool {call.name!r}: {tool.takes_context} is the run's context")
            arguments[tool.takes_context] = context_for(call)
        return tool.function, arguments

    def _capped(self, outcome: ToolResult) -> ToolResult:
        cap = self.max_output_chars
        if cap is None or len(outcome.content) <= cap:
            return outcome
        content, cut = clip(outcome.content, cap)
        error = None if outcome.error is None else clip(outcome.error, cap)[0]
        return ToolResult(content, error, cut)

    def call(self, call: ToolCall) -> str:
        """Run one tool call and return the JSON text the model sees (``{"error": ...}`` on failure)."""
        return self.execute(call).content
