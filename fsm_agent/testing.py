"""Test doubles and helpers: scripted models, a demo registry, and path assertions.

Shipped with the package (like ``httpx.MockTransport``) so users can test
their own agents transition by transition without a real model.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from fsm_agent.records import Message, ModelResponse, RunResult, ToolCall, Transition, Usage
from fsm_agent.table import Row
from fsm_agent.tools import JSONSchema, ToolRegistry

_ids = itertools.count(1)


class ScriptExhaustedError(RuntimeError):
    """A ``FakeModel`` was asked for more responses than its script holds."""


def tool_call(name: str, /, id: str | None = None, **arguments: Any) -> ToolCall:  # noqa: A002 - mirrors ToolCall.id
    """A ``ToolCall`` with an automatic id unless one is given."""
    return ToolCall(id if id is not None else f"call_{next(_ids)}", name, arguments)


def tool_turn(*calls: ToolCall, content: str = "", usage: Usage | None = None) -> ModelResponse:
    """An assistant reply asking for ``calls`` (with optional text alongside)."""
    return ModelResponse(Message("assistant", content, calls), "tool_use", usage)


def reply(text: str, *, stop_reason: str = "end_turn", usage: Usage | None = None) -> ModelResponse:
    """An assistant reply with text only: a final answer, or a cut-off one with ``stop_reason="max_tokens"``."""
    return ModelResponse(Message("assistant", text), stop_reason, usage)


class FakeModel:
    """Returns scripted responses in order; an ``Exception`` in the script is raised instead.

    ``seen`` records the messages of every call, so tests can check what the
    model was shown.  Running past the end of the script raises
    ``ScriptExhaustedError`` saying so, which the engine reports as ``model_error``.
    """

    def __init__(self, responses: Iterable[ModelResponse | Exception]) -> None:
        self.responses = list(responses)
        self.seen: list[tuple[Message, ...]] = []
        self.tools_seen: list[list[JSONSchema]] = []

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """Return the next scripted response."""
        self.seen.append(tuple(messages))
        self.tools_seen.append(tools)
        call = len(self.seen)
        if call > len(self.responses):
            held = len(self.responses)
            msg = f"FakeModel script exhausted: it holds {held} response(s) and call {call} asked for another"
            raise ScriptExhaustedError(msg)
        item = self.responses[call - 1]
        if isinstance(item, Exception):
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
