"""Test doubles and helpers: scripted models, a demo registry, and path assertions.

Shipped with the package (like ``httpx.MockTransport``) so users can test
their own agents transition by transition without a real model.  A store's
conformance suite, ``fsm_agent.testing.stores.StoreConformance``, lives in a
module of its own: it imports pytest, which this module never does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Never

from fsm_agent.definition.table import Row
from fsm_agent.records import Message, ModelResponse, OutputSchema, RunResult, ToolCall, Transition, Usage
from fsm_agent.tools import JSONSchema, ToolRegistry

_ids = itertools.count(1)


class ScriptExhaustedError(RuntimeError):
    """A ``FakeModel`` was asked for more responses than its script holds."""


def _kind(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


def _check(what: str, value: object, expected: type | tuple[type, ...], hint: str) -> None:
    """Raise a ``TypeError`` naming ``what`` and how to build it right, unless ``value`` is an ``expected``."""
    if not isinstance(value, expected):
        msg = f"{what} must be {hint}, got {_kind(value)}"
        raise TypeError(msg)


def tool_call(name: str, /, *extra: Never, id: str | None = None, **arguments: Any) -> ToolCall:  # noqa: A002 - mirrors ToolCall.id
    """A ``ToolCall`` of tool ``name``, its arguments given as keywords; an automatic id unless ``id=`` is given.

    ``tool_call("add", a=1, b=2)``, or ``tool_call("add", **{"a": 1})`` for
    arguments held in a dict.  Anything positional after the name is a
    ``TypeError``, not a guess: ``tool_call("add", {"a": 1})`` once built a
    call whose id was the dict and whose arguments were empty.
    """
    how = f"tool_call({name!r}, a=1, ...) or tool_call({name!r}, **arguments), with id=... for a fixed id"
    if extra:
        msg = f"tool_call takes only the tool's name positionally, got {len(extra)} more ({_kind(extra[0])}); use {how}"
        raise TypeError(msg)
    _check("tool_call's name", name, str, f"the tool's name as a str (arguments go as keywords: {how})")
    if id is not None:
        _check("tool_call's id=", id, str, "a str")
    return ToolCall(id if id is not None else f"call_{next(_ids)}", name, arguments)


def tool_turn(*calls: ToolCall, content: str = "", usage: Usage | None = None) -> ModelResponse:
    """An assistant reply asking for ``calls`` (with optional text alongside)."""
    for i, call in enumerate(calls):
        hint = "a ToolCall, built with tool_call(name, **arguments); unpack a list with tool_turn(*calls)"
        _check(f"tool_turn's call {i}", call, ToolCall, hint)
    _check("tool_turn's content=", content, str, "a str")
    _check("tool_turn's usage=", usage, (Usage, type(None)), "a Usage or None")
    return ModelResponse(Message("assistant", content, calls), "tool_use", usage)


def reply(text: str, *, stop_reason: str = "end_turn", usage: Usage | None = None) -> ModelResponse:
    """An assistant reply with text only: a final answer, or a cut-off one with ``stop_reason="max_tokens"``."""
    _check("reply's text", text, str, "a str (a reply asking for tools is tool_turn(tool_call(...)))")
    _check("reply's stop_reason=", stop_reason, str, "a str such as 'end_turn' or 'max_tokens'")
    _check("reply's usage=", usage, (Usage, type(None)), "a Usage or None")
    return ModelResponse(Message("assistant", text), stop_reason, usage)


ScriptItem = ModelResponse | BaseException
"""One entry of a ``FakeModel`` script: a response to return, or an exception to raise."""


class FakeModel:
    """Returns scripted responses in order; an exception in the script is raised instead.

    The script is given as several responses, ``FakeModel(a, b)``, or as one
    iterable of them, ``FakeModel([a, b])`` (a lone str or mapping is one
    response, not a script).  Entries are returned as they are, so a test can
    script a malformed reply to check how the engine treats it.  ``seen``
    records the messages of every call, so tests can check what the model was
    shown.  Running past the end of the script raises ``ScriptExhaustedError``
    saying so, which the engine reports as ``model_error``.
    """

    def __init__(self, *script: ScriptItem | Iterable[ScriptItem]) -> None:
        self.responses: list[ScriptItem]
        if len(script) == 1 and isinstance(script[0], Iterable) and not isinstance(script[0], str | bytes | Mapping):
            self.responses = list(script[0])
        else:
            self.responses = list(script)  # type: ignore[arg-type]  # several arguments: each is one response
        self.seen: list[tuple[Message, ...]] = []
        self.tools_seen: list[list[JSONSchema]] = []
        self.outputs_seen: list[OutputSchema | None] = []

    def complete(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> ModelResponse:
        """Return the next scripted response; ``output`` (a typed agent's schema) is recorded and not followed."""
        self.seen.append(tuple(messages))
        self.tools_seen.append(tools)
        self.outputs_seen.append(output)
        call = len(self.seen)
        if call > len(self.responses):
            held = len(self.responses)
            msg = f"FakeModel script exhausted: it holds {held} response(s) and call {call} asked for another"
            raise ScriptExhaustedError(msg)
        item = self.responses[call - 1]
        if isinstance(item, BaseException):
            raise item
        return item


class LoopingModel:
    """Always asks for the same tool call: the run must stop with ``repeated_action``."""

    def __init__(self, call: ToolCall) -> None:
        self.call = call

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """Ask for the same call again."""
        return tool_turn(self.call)


class CounterModel:
    """Calls ``echo`` with ``{"text": "turn n"}``, new arguments every turn, and never converges."""

    def __init__(self) -> None:
        self.n = 0

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """Ask for one more, different, echo."""
        self.n += 1
        return tool_turn(ToolCall(f"c{self.n}", "echo", {"text": f"turn {self.n}"}))


class ManualClock:
    """A monotonic clock that only moves when told to, so timeout tests never sleep."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now += seconds


def demo_registry() -> ToolRegistry:
    """A registry with ``echo`` (returns its text), ``add`` and ``fail`` (always returns an error)."""
    registry = ToolRegistry()

    @registry.register
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @registry.register
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    @registry.register
    def fail(reason: str = "always fails") -> dict[str, str]:
        """Report an error, every time."""
        return {"error": reason}

    return registry


TOOL_THEN_ANSWER = (
    "AwaitModel",
    "CheckTruncation",
    "Dispatch",
    "ExecuteTool",
    "AwaitModel",
    "CheckTruncation",
    "Dispatch",
    "Done",
)
"""The states of a run with one tool turn and then an answer: the most common path in tests."""


def path(result: RunResult) -> list[str]:
    """The states a run went through, starting with the initial state."""
    if not result.trace:
        return []
    return [result.trace[0].source, *(t.dest for t in result.trace)]


def edge_id(edge: Row | Transition) -> str:
    """Name a table row or a trace entry as ``Source->Dest[label]`` (label: the reason, else the guard)."""
    guard = edge.guard_name if isinstance(edge, Row) else edge.guard
    label = edge.reason or guard
    return f"{edge.source}->{edge.dest}" + (f"[{label}]" if label else "")


def edges(result: RunResult) -> list[str]:
    """The edges a run took, in order, named by ``edge_id``."""
    return [edge_id(t) for t in result.trace]


def assert_path(result: RunResult, expected: Sequence[str]) -> None:
    """Fail with both paths shown unless the run went through exactly ``expected`` states."""
    actual = path(result)
    if actual != list(expected):
        msg = f"run took path {' -> '.join(actual)}\n  expected    {' -> '.join(expected)}"
        raise AssertionError(msg)
