"""A model's return value checked before any of it is kept: its type, its calls' arguments, its usage.

A reply the run cannot keep (not a ``ModelResponse``, arguments nested past
what the snapshot can walk or holding what JSON cannot encode, a usage whose
counts would switch ``token_budget`` off) is refused as it arrives, naming
the part at fault, instead of failing at the next write; ``as_kept`` is how
the exchange log still keeps it for a person to read.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from fsm_agent.jsontext import not_json
from fsm_agent.records import Message, ModelResponse, ToolCall, Usage

MAX_NESTING = 100
"""How deep a tool call's arguments may nest (objects and arrays); deeper is an unusable reply.

Real tool arguments nest a few levels.  Hundreds of levels are valid JSON
but past what the snapshot, the journal and the providers' encoders can walk
(Python's recursion limit), so they are refused once, when the reply
arrives, instead of failing wherever the run is written next.
"""
_CONTAINERS = (dict, list, tuple)
MAX_TOKENS = 2**53 - 1
"""The largest token count a reply may report: larger ones are a broken count (and past what JSON keeps exactly)."""


def malformed(response: object) -> str | None:
    """Why a model's return value is not a usable ``ModelResponse``, or None; checked before anything is recorded."""
    if type(response) is ModelResponse:  # every reply is checked: the usual one is cleared on exact types first
        message = response.message
        if (
            type(message) is Message
            and message.role == "assistant"
            and type(message.content) is str
            and type(message.tool_calls) is tuple
        ):
            for call in message.tool_calls:
                if type(call) is not ToolCall or type(call.id) is not str or type(call.name) is not str:
                    break
                if _nested(call.arguments) and nests_deeper(call.arguments, MAX_NESTING):
                    return _too_deep(call)
                if (unusable := _not_json_arguments(call)) is not None:
                    return unusable
            else:
                return None
    if not isinstance(response, ModelResponse):
        return f"model returned {type(response).__name__}, expected ModelResponse"
    message = response.message
    if not isinstance(message, Message):
        return f"ModelResponse.message is a {type(message).__name__}, expected Message"
    if message.role != "assistant":  # kept, the next turn would send it to the provider as someone else's words
        return f"Message.role is {message.role!r}, expected 'assistant': a reply is the model's own message"
    if not isinstance(message.content, str):
        return f"Message.content is a {type(message.content).__name__}, expected str"
    if not isinstance(message.tool_calls, tuple):
        return f"Message.tool_calls is a {type(message.tool_calls).__name__}, expected a tuple of ToolCall"
    for call in message.tool_calls:
        if not isinstance(call, ToolCall):
            return f"a tool call is a {type(call).__name__}, expected ToolCall"
        if not isinstance(call.id, str) or not isinstance(call.name, str):
            return f"a tool call's id and name must be str, got id {call.id!r} and name {call.name!r}"
        if nests_deeper(call.arguments, MAX_NESTING):
            return _too_deep(call)
        if (unusable := _not_json_arguments(call)) is not None:
            return unusable
    return None


def nests_deeper(value: object, limit: int) -> bool:
    """Whether ``value``'s dicts, lists and tuples nest more than ``limit`` levels; walked without recursion."""
    if not isinstance(value, _CONTAINERS):
        return False
    level: list[object] = [value]
    for _ in range(limit):
        level = [
            item
            for container in level
            for item in (container.values() if isinstance(container, dict) else container)  # type: ignore[attr-defined]
            if isinstance(item, _CONTAINERS)
        ]
        if not level:
            return False
    return True


def _nested(arguments: object) -> bool:
    """Whether arguments hold any object or array at all: flat ones, the usual kind, need no walk (``make bench``)."""
    if type(arguments) is not dict:
        return True
    for item in arguments.values():  # noqa: SIM110 - a loop that returns early is faster than any() here
        if isinstance(item, _CONTAINERS):
            return True
    return False


def _too_deep(call: ToolCall) -> str:
    return (
        f"tool call {call.name!r} ({call.id}) has arguments nested more than {MAX_NESTING} levels deep; "
        "the reply is not kept"
    )


def _not_json_arguments(call: ToolCall) -> str | None:
    """Why a call's arguments cannot be kept: they hold what JSON cannot encode (bytes, a set, an object); or None.

    Checked after their nesting is bounded.  Such a reply could not be
    written to a snapshot, a store or ``RunResult.to_json``, so it is refused
    as it arrives (``model_error``, naming the part at fault) rather than
    failing at the next write or losing that part.  Arguments that are no
    dict are the adapter's mistake, not the model's: the built-in adapters
    keep a model's text that is no JSON object in ``raw_arguments`` (which the
    registry refuses as a result the model reads), so a str here is text
    nobody decoded, and telling the model would only make it ask again.
    """
    raw = call.raw_arguments
    if raw is None and isinstance(call.arguments, dict) and call.canonical_arguments is not None:
        return None  # they encode: the one encoding the guards and the ledger read (``ToolCall.canonical_arguments``)
    if raw is not None and not isinstance(raw, str):
        problem: str | None = f"raw_arguments is of type {type(raw).__name__}, not str"
    else:
        problem = not_json(call.arguments, "arguments")
    if problem is None:
        if isinstance(call.arguments, dict):
            return None
        return (
            f"tool call {call.name!r} ({call.id}) has ToolCall.arguments of type {type(call.arguments).__name__}, "
            "expected the decoded dict: the adapter puts text it could not parse as a JSON object in raw_arguments"
        )
    return f"tool call {call.name!r} ({call.id}) has arguments that are not JSON: {problem}; the reply is not kept"


def usage_problem(usage: object) -> str | None:
    """Why a reply's ``usage`` cannot be counted (a malformed count would switch ``token_budget`` off), or None."""
    if usage is None:
        return None
    if not isinstance(usage, Usage):
        return f"ModelResponse.usage is a {type(usage).__name__}, expected Usage or None"
    for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
        value = getattr(usage, name)
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS
        if not ok:
            shown = "NaN" if isinstance(value, float) and math.isnan(value) else repr(value)
            return f"ModelResponse.usage.{name} must be a whole number from 0 to 2**53 - 1, got {shown}"
    cost = usage.cost
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < math.inf):
        return f"ModelResponse.usage.cost must be None or a finite number of US dollars >= 0, got {cost!r}"
    return None


def as_kept(response: ModelResponse) -> ModelResponse:
    """An unusable reply as the run's exchange log keeps it: an uncountable usage or non-text stop reason as its repr.

    Why: every reply must fit in a snapshot (stores write JSON, and PostgreSQL refuses NaN), or a run stopped by
    such a reply could not be checkpointed, resumed or forked.  The text is as unusable to ``record_reply`` as
    the original was, so a replay or a fork meets the same ``model_error``, and a person still reads what came.
    """
    usage, stop = response.usage, response.stop_reason
    kept_usage: Any = usage if usage_problem(usage) is None else repr(usage)
    return attrs.evolve(response, usage=kept_usage, stop_reason=stop if isinstance(stop, str) else repr(stop))
