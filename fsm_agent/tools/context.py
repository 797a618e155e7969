"""``RunContext``: what the code a run calls (tools, stop conditions, validators, processors) may know of that run.

An application hands its own objects to a run (``agent.run(..., deps=db)``)
and its tools receive them through a parameter annotated
``RunContext[Db]``, which the model never sees.  Deps live only on the run
object: never in a snapshot, a store, a log, a span or a request, so they
need not be JSON, picklable or secret-free.  A run resumed elsewhere is
given them again by its new owner.

Whatever else the run calls (stop conditions, guardrails, output
validators, history processors) reads the same record from
``run_context()``: the driver sets a ``contextvars.ContextVar`` for the time
it drives the run, which the package's worker threads and asyncio's tasks
inherit, so sub-agents and parallel calls each see their own run.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

import attrs

from fsm_agent.errors import RunStateError
from fsm_agent.records import ToolCall, Usage

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


class NoDepsError(RunStateError):
    """A tool (or stop condition, ...) read ``RunContext.deps`` of a run that was given none."""


@attrs.frozen
class RunContext(Generic[T]):
    """The run a tool call (or a check) belongs to: the application's ``deps``, its id, usage so far and the call.

    ``deps`` is what the run was given (``agent.run(..., deps=...)``);
    reading it when none were given raises ``NoDepsError``, which a tool's
    caller sees as that call's error result, saying how to give them
    (``has_deps`` asks first).  ``usage`` is the run's tokens so far,
    ``turn`` the model turn the call came from; ``tool_name`` and
    ``call_id`` name the call (None outside a tool call).  ``start_id``
    names this start of the run: new each time a run is started (under a
    used ``run_id`` too, with ``overwrite=True``), the same after a resume
    or a take-over, so run, start and call together name one call made
    once ("" for a run from a snapshot older than start ids).
    """

    _deps: T | None = attrs.field(default=None, repr=False)  # an application's objects are not for logs
    run_id: str = ""
    call_id: str | None = None
    usage: Usage = attrs.field(factory=Usage)
    tool_name: str | None = None
    turn: int = 0
    start_id: str = ""

    @property
    def deps(self) -> T:
        """The run's deps; ``NoDepsError`` if it was given none."""
        if self._deps is None:
            where = f"tool {self.tool_name!r}" if self.tool_name else "this code"
            msg = (
                f"{where} needs the run's deps, and run {self.run_id or '(none)'!r} was given none: pass "
                "agent.run(..., deps=...) (a resumed or taken-over run is given them again: resume(..., deps=...))"
            )
            raise NoDepsError(msg)
        return self._deps

    @property
    def has_deps(self) -> bool:
        """True when the run was given deps."""
        return self._deps is not None


class ContextSource(Protocol):
    """A run being driven: what ``run_context()`` and a tool's ``RunContext`` parameter are built from."""

    def run_context(self, call: ToolCall | None = None) -> RunContext[Any]:
        """The run's context, for ``call`` if given."""
        ...

    def has_deadline(self) -> bool:
        """Whether the run has a ``timeout``, at which a call in flight is abandoned."""
        ...


S = TypeVar("S", bound=ContextSource)

_RUN: contextvars.ContextVar[ContextSource | None] = contextvars.ContextVar("fsm_agent_run", default=None)
"""The run being driven here (this thread, this task), set by its driver around every step."""


def run_context() -> RunContext[Any]:
    """The ``RunContext`` of the run driving this code: for stop conditions, guardrails, validators, processors.

    Outside a run (or in a thread the code started itself, which does not
    inherit the context) it is a ``RunStateError``.
    """
    source = _RUN.get()
    if source is None:
        msg = "run_context() is called outside a run: only code a run calls (tools, stop conditions, ...) has one"
        raise RunStateError(msg)
    return source.run_context()


def under_deadline() -> bool:
    """Whether the run driving this code has a deadline, so a call it makes may be abandoned in flight."""
    source = _RUN.get()
    return source is not None and source.has_deadline()


def context_for(call: ToolCall) -> RunContext[Any]:
    """The ``RunContext`` a tool is given for ``call``: its run's, or one without deps outside any run."""
    source = _RUN.get()
    if source is None:
        return RunContext(None, "", call.id, Usage(), call.name)
    return source.run_context(call)


def driving(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Wrap a driver's sync method so that the run is ``run_context()``'s while it runs."""

    def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        token = _RUN.set(self)
        try:
            return method(self, *args, **kwargs)
        finally:
            _RUN.reset(token)

    functools.update_wrapper(wrapper, method)  # the method's name and docstring, for help() and the docs
    return wrapper


def adriving(method: Callable[Concatenate[S, P], Awaitable[R]]) -> Callable[Concatenate[S, P], Awaitable[R]]:
    """``driving`` for a driver's async method: set in the task awaiting it, which the tasks it starts inherit."""

    async def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        token = _RUN.set(self)
        try:
            return await method(self, *args, **kwargs)
        finally:
            _RUN.reset(token)

    functools.update_wrapper(wrapper, method)  # the method's name and docstring, for help() and the docs
    return wrapper


def context_parameter(function: Callable[..., Any]) -> str | None:
    """The name of ``function``'s parameter annotated ``RunContext`` or ``RunContext[T]``, if it has one."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - hints that do not resolve are the schema's to report
        return None
    for name, param in inspect.signature(function).parameters.items():
        hint = hints.get(name)
        if hint is RunContext or typing.get_origin(hint) is RunContext:
            if param.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
                msg = f"the RunContext parameter {name!r} must be one a keyword can fill"
                raise TypeError(msg)
            return name
    return None


def deps_class(function: Callable[..., Any], parameter: str) -> type | None:
    """The plain class ``T`` of ``function``'s ``RunContext[T]`` parameter, or None for any other ``T``.

    A generic, a Protocol, a union, ``Any``, a TypedDict or a bare
    ``RunContext`` is not checked: ``isinstance`` cannot judge them, or
    would judge them by more than the declaration says.
    """
    try:
        args = typing.get_args(typing.get_type_hints(function).get(parameter))
    except Exception:  # noqa: BLE001 - hints that no longer resolve: nothing to check against
        return None
    wanted = args[0] if len(args) == 1 else None
    if (
        not isinstance(wanted, type)
        or wanted.__module__ in ("typing", "typing_extensions")
        or getattr(wanted, "_is_protocol", False)
        or typing.is_typeddict(wanted)
    ):
        return None
    return wanted


def deps_types(registry: Any) -> tuple[tuple[str, type], ...]:
    """The name and ``T`` of each tool of ``registry`` (a ``ToolRegistry``) whose ``RunContext[T]`` is a plain class.

    Built once per set of tools (``ToolRegistry.cached``): reading a
    function's type hints costs more than starting a run.
    """
    found = []
    for name in registry:
        tool = registry.get(name)
        wanted = None if tool is None or tool.takes_context is None else deps_class(tool.function, tool.takes_context)
        if wanted is not None:
            found.append((name, wanted))
    return tuple(found)


def refuse_deps(wanted: Iterable[tuple[str, type]], deps: Any) -> None:
    """A ``TypeError`` naming the first tool (of ``deps_types``) whose ``RunContext[T]`` the ``deps`` are not.

    Checked as a run starts, before its first call: the tool would fail on
    them, told only to the model, which would answer from nothing.
    """
    for name, cls in wanted:
        try:
            fits = isinstance(deps, cls)
        except TypeError:  # a class whose isinstance refuses to judge (a metaclass of its own): not checked
            continue
        if not fits:
            msg = (
                f"tool {name!r} takes RunContext[{cls.__qualname__}], and the run was given deps of type "
                f"{type(deps).__qualname__}: pass deps={cls.__qualname__}(...), or no deps at all"
            )
            raise TypeError(msg)
