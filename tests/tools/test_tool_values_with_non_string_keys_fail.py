"""A tool value holding a dict key that is not a string is a failed call naming the key, not a guessed conversion.

tools.md: "A value JSON cannot encode is a failure, never a guessed
conversion."  ``json.dumps`` writes an int, float, bool or None key as a
string, so ``{1: "a", "1": "b"}`` would reach the model as two keys "1".
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsm_agent import ToolCall, ToolRegistry


def returning(value: Any) -> ToolRegistry:
    """A registry with one tool, ``lookup``, that returns ``value``."""
    tools = ToolRegistry()
    tools.register(lambda: value, name="lookup")
    return tools


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({1: "a", "1": "b"}, "1 (int)"),
        ({1: "a", 2: "b"}, "1 (int)"),
        ({"rows": [{"id": 1}, {None: "x"}]}, "None (NoneType)"),
        ([("x", {2.5: "y"})], "2.5 (float)"),
        ({"ok": {True: 1}}, "True (bool)"),
    ],
    ids=["colliding", "int", "nested-in-a-list", "in-a-tuple", "bool"],
)
def test_a_non_string_key_anywhere_is_a_failed_call_naming_it(value: Any, named: str) -> None:
    """The error names the tool, JSON, the key and its type; the model reads it as the result."""
    result = returning(value).execute(ToolCall("c1", "lookup", {}))
    assert not result.ok
    cannot = "tool 'lookup' returned a value that cannot be encoded as JSON"
    assert result.error == f"{cannot}: a dict key must be a string, got {named}"
    assert json.loads(result.content) == {"error": result.error}


@pytest.mark.parametrize(
    "value",
    [
        {"city": "Paris", "temp": 21, "tags": ["sunny", "dry"], "wind": {"speed": 3, "dir": None}},
        [{"id": 1}, ({"x": [1.5, True]},)],
        "plain text",
        [],
    ],
    ids=["nested-dict", "list-of-dicts", "str", "empty"],
)
def test_a_value_with_string_keys_is_encoded_as_before(value: Any) -> None:
    """Every key a string: the content is ``json.dumps``'s text, as it always was."""
    result = returning(value).execute(ToolCall("c1", "lookup", {}))
    assert result.ok
    assert result.content == json.dumps(value, ensure_ascii=False, allow_nan=False)


def test_a_str_subclass_key_is_a_string() -> None:
    """A key of a ``str`` subclass is a string: JSON writes it as the string it is."""

    class Key(str):
        pass

    result = returning({Key("a"): 1}).execute(ToolCall("c1", "lookup", {}))
    assert (result.ok, result.content) == (True, '{"a": 1}')
