"""A tool's value as JSON text, or an error for what JSON cannot encode as it is: never a guessed conversion.

Why a module of its own: every tool result goes through here, so the
check for dict keys that are not strings is kept to the values that hold
containers, and measured (a small flat dict: about 4% of an ``execute``).
"""

from __future__ import annotations

import json
from typing import Any

_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
"""The encoder ``json.dumps(value, ensure_ascii=False, allow_nan=False)`` builds on every call, built once."""


_SCALARS = frozenset({str, int, float, bool, type(None)})
"""The types of the JSON values that hold nothing: what the walk for dict keys passes over at once."""


def _key_not_a_string(value: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> str | None:
    """The first dict key in ``value`` that is not a string, named with its type; None if every key is one.

    ``json.dumps`` writes an int, float, bool or None key as a string: a
    guessed conversion, and ``{1: "a", "1": "b"}`` would reach the model as
    two keys both called "1".  Called once the value was encoded, so it
    holds no cycle; a loop, not recursion, so depth costs no frames.  Exact
    type checks come first: every tool result goes through here.
    """
    pending: list[Any] = [value]
    for item in pending:  # grows as it goes: each dict, list or tuple found inside is looked at in turn
        if type(item) is dict or isinstance(item, dict):
            for key in item:
                if type(key) is not str and not isinstance(key, str):
                    return f"a dict key must be a string, got {key!r} ({type(key).__name__})"
            item = item.values()
        for inner in item:
            if type(inner) not in _SCALARS and isinstance(inner, (dict, list, tuple)):
                pending.append(inner)
    return None


def json_text(value: Any) -> str:
    """``value`` as JSON text; ``TypeError`` or ``ValueError`` for what JSON cannot encode, a non-str dict key included.

    ``json.dumps`` refuses a set, bytes or NaN but writes a key of 1 as "1":
    that would be a conversion nobody asked for, so it is refused here too.
    """
    text = _JSON.encode(value)
    if isinstance(value, (dict, list, tuple)):
        key = _key_not_a_string(value)
        if key is not None:
            raise TypeError(key)
    return text
