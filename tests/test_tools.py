"""The tool registry: schemas from type hints, JSON Schema argument checks, structural failure detection."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest

from fsm_agent import ToolCall, ToolRegistry


def _call(registry: ToolRegistry, name: str, **arguments: Any) -> Any:
    return json.loads(registry.call(ToolCall("id", name, arguments)))


def test_schema_from_hints_and_docstring_including_postponed_annotations() -> None:
    """Types map to JSON Schema, defaults make a parameter optional, the docstring is the description."""
    registry = ToolRegistry()

    @registry.register
    def search(
        query: str, limit: int = 5, tags: list[str] | None = None, mode: Literal["fast", "deep"] = "fast"
    ) -> str:
        """Search the web.

        Longer explanation.
        """
        return query

    (schema,) = registry.schemas()
    assert schema == {
        "name": "search",
        "description": "Search the web.\n\nLonger explanation.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer"},
                "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
                "mode": {"enum": ["fast", "deep"]},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    }


def test_register_with_name_and_description_and_as_decorator_factory() -> None:
    """register(fn, name=..., description=...) and @register(name=...) both work and return the function."""
    registry = ToolRegistry()

    def f(x: int) -> int:
        return x

    assert registry.register(f, name="double", description="Doubles.") is f

    @registry.register(name="triple")
    def g(x: int) -> int:
        return 3 * x

    assert [s["name"] for s in registry.schemas()] == ["double", "triple"]
    assert registry.schemas()[0]["description"] == "Doubles."
    assert _call(registry, "triple", x=2) == 6


def test_function_without_hints_or_docstring_gets_permissive_schema() -> None:
    """No annotation means any JSON value; no docstring means an empty description."""
    registry = ToolRegistry()

    def loose(x, y=1):  # type: ignore[no-untyped-def]
        return [x, y]

    registry.register(loose)
    assert registry.schemas()[0]["parameters"]["properties"] == {"x": {}, "y": {}}
    assert registry.schemas()[0]["description"] == ""
    assert _call(registry, "loose", x={"a": 1}) == [{"a": 1}, 1]


def test_registering_a_name_twice_is_an_error() -> None:
    """Silently replacing a tool would change behaviour unnoticed, so it raises."""
    registry = ToolRegistry()
    registry.register(lambda: 1, name="t")
    with pytest.raises(ValueError, match="'t' is already registered"):
        registry.register(lambda: 2, name="t")


def test_unsupported_annotation_is_a_registration_error() -> None:
    """An annotation with no JSON equivalent fails when registering, naming the tool and parameter."""
    registry = ToolRegistry()

    def f(x: complex) -> None: ...

    with pytest.raises(TypeError, match="tool 'f', parameter 'x'"):
        registry.register(f)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"n": True}, "n: expected integer, got boolean True"),
        ({"n": 1.0}, "n: expected integer, got number 1.0"),
        ({"n": "3"}, "n: expected integer, got string '3'"),
        ({"n": 3, "x": "three"}, "x: expected number, got string 'three'"),
        ({"n": 3, "flag": 1}, "flag: expected boolean, got integer 1"),
        ({"n": 3, "items": ["a", 2]}, "items[1]: expected string, got integer 2"),
        ({}, "missing required argument(s): n"),
        ({"n": 1, "bogus": 2}, "unexpected argument(s): bogus"),
    ],
)
def test_arguments_are_checked_with_json_schema_semantics(arguments: dict[str, Any], message: str) -> None:
    """No coercion: a bool is not an integer, a string is not a number; missing and extra arguments are named."""
    registry = ToolRegistry()

    @registry.register
    def t(n: int, x: float = 0.0, flag: bool = False, items: list[str] | None = None) -> int:
        """Test tool."""
        return n

    outcome = registry.execute(ToolCall("id", "t", arguments))
    assert not outcome.ok
    assert message in json.loads(outcome.content)["error"]


def test_an_integer_is_a_number() -> None:
    """An int argument is accepted where a float is declared."""
    registry = ToolRegistry()
    registry.register(lambda x: x * 2, name="dbl")
    registry.register(lambda: 0, name="zero")

    def half(x: float) -> float:
        return x / 2

    registry.register(half)
    assert _call(registry, "half", x=3) == 1.5


def test_error_word_in_a_successful_result_is_still_a_success() -> None:
    """Failure is structural: only a top-level "error" key in a returned dict marks a failure."""
    registry = ToolRegistry()
    registry.register(lambda: "no error here", name="text")
    registry.register(lambda: {"log": {"error": "nested"}}, name="nested")
    registry.register(lambda: {"error": "top"}, name="top")
    assert registry.execute(ToolCall("1", "text", {})).ok
    assert registry.execute(ToolCall("2", "nested", {})).ok
    outcome = registry.execute(ToolCall("3", "top", {}))
    assert (outcome.ok, outcome.error) == (False, "top")


def test_arguments_that_are_not_an_object_are_an_error_result() -> None:
    """A model that sends a list as arguments gets an error result, not a crash."""
    registry = ToolRegistry()
    registry.register(lambda: 1, name="t")
    outcome = registry.execute(ToolCall("1", "t", ["a"]))  # type: ignore[arg-type]
    assert outcome.error == "bad arguments for tool 't': arguments must be a JSON object, got array"


def test_undecodable_arguments_name_the_json_problem_and_keep_the_text() -> None:
    """raw_arguments (broken JSON from the model) fails the call with the decoder's message and the text."""
    registry = ToolRegistry()
    registry.register(lambda city: city, name="weather")
    outcome = registry.execute(ToolCall("1", "weather", {}, raw_arguments='{"city": "Par'))
    assert outcome.error is not None
    assert "not valid JSON" in outcome.error
    assert '\'{"city": "Par\'' in outcome.error


def test_non_json_return_value_is_an_error_result() -> None:
    """A value json cannot encode (a set, NaN) becomes an error result naming the tool."""
    registry = ToolRegistry()
    registry.register(lambda: {1, 2}, name="s")
    registry.register(lambda: float("nan"), name="nan")
    for name in ("s", "nan"):
        outcome = registry.execute(ToolCall("1", name, {}))
        assert outcome.error is not None
        assert f"tool {name!r} returned a value that cannot be encoded as JSON" in outcome.error


def test_call_returns_json_text_of_the_value() -> None:
    """call() is the JSON encoding of the return value, non-ASCII kept readable."""
    registry = ToolRegistry()
    registry.register(lambda: {"答": 42}, name="a")
    assert registry.call(ToolCall("1", "a", {})) == '{"答": 42}'


def test_a_lambda_needs_a_name() -> None:
    """A tool name must be one providers accept: a lambda without name= is refused, a hyphenated name is fine."""
    with pytest.raises(ValueError, match="'<lambda>' must be 1-64 letters, digits"):
        ToolRegistry().register(lambda: 1)
    registry = ToolRegistry()
    registry.register(lambda: 1, name="get-weather")
    assert "get-weather" in registry
