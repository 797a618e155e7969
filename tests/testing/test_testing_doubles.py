"""The test doubles in fsm_agent.testing cannot be misused silently: a wrong call is a TypeError saying what to do."""

from __future__ import annotations

from typing import Any

import pytest

from fsm_agent import Message, ModelResponse, ToolCall, Usage
from fsm_agent.testing import FakeModel, ScriptExhaustedError, reply, tool_call, tool_turn


def _script(model: FakeModel, calls: int) -> list[Any]:
    """What ``calls`` calls of ``model`` return (or raise), in order."""
    out: list[Any] = []
    for _ in range(calls):
        try:
            out.append(model.complete([Message("user", "q")], []))
        except Exception as exc:  # noqa: BLE001 - the scripted exception is what the test compares
            out.append(exc)
    return out


def test_tool_call_takes_arguments_as_keywords_and_id_only_by_keyword() -> None:
    """Arguments are keywords (even one called name), id= fixes the id, and an automatic id is a fresh str."""
    call = tool_call("meet", id="m1", name="Ada", when=3)
    assert call == ToolCall("m1", "meet", {"name": "Ada", "when": 3})
    held = {"a": 1}
    assert tool_call("add", **held).arguments == held
    first, second = tool_call("echo", text="x"), tool_call("echo", text="x")
    assert isinstance(first.id, str)
    assert first.id != second.id


def test_tool_call_with_a_positional_dict_is_a_type_error_saying_to_pass_keywords() -> None:
    """tool_call("add", {"a": 1}) once built a call whose id was the dict and whose arguments were empty."""
    with pytest.raises(TypeError, match=r"only the tool's name positionally, got 1 more \(dict \{'a': 1\}\)") as info:
        tool_call("add", {"a": 1})  # type: ignore[arg-type]
    assert "tool_call('add', a=1, ...) or tool_call('add', **arguments)" in str(info.value)


@pytest.mark.parametrize("name", [{"a": 1}, None, 3, ToolCall("1", "add", {})], ids=repr)
def test_tool_call_with_a_name_that_is_not_a_str_is_a_type_error(name: Any) -> None:
    """The name must be the tool's name; the message says arguments go as keywords."""
    with pytest.raises(
        TypeError, match=r"tool_call's name must be the tool's name as a str \(arguments go as keywords"
    ):
        tool_call(name)


def test_tool_call_with_an_id_that_is_not_a_str_is_a_type_error() -> None:
    """A ToolCall's id is a str; tool_call says so instead of building a call providers would reject."""
    with pytest.raises(TypeError, match="tool_call's id= must be a str, got int 7"):
        tool_call("echo", id=7, text="x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ((["echo"],), "tool_turn's call 0 must be a ToolCall, built with tool_call"),
        (("echo",), "tool_turn's call 0 must be a ToolCall"),
        (([tool_call("echo", text="a")],), r"unpack a list with tool_turn\(\*calls\)"),
    ],
)
def test_tool_turn_with_something_that_is_not_a_tool_call_is_a_type_error(calls: tuple[Any, ...], message: str) -> None:
    """tool_turn takes ToolCall objects; a name or a list is refused with a hint."""
    with pytest.raises(TypeError, match=message):
        tool_turn(*calls)


def test_tool_turn_checks_its_content_and_usage() -> None:
    """content must be a str and usage a Usage (or None)."""
    call = tool_call("echo", text="a")
    with pytest.raises(TypeError, match="tool_turn's content= must be a str, got NoneType None"):
        tool_turn(call, content=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tool_turn's usage= must be a Usage or None, got dict"):
        tool_turn(call, usage={"input_tokens": 1})  # type: ignore[arg-type]
    assert tool_turn(call, usage=Usage(1, 2)).usage == Usage(1, 2)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"text": None}, "reply's text must be a str"),
        ({"text": tool_call("echo", text="a")}, r"a reply asking for tools is tool_turn\(tool_call"),
        ({"text": "hi", "stop_reason": None}, "reply's stop_reason= must be a str"),
        ({"text": "hi", "usage": (1, 2)}, "reply's usage= must be a Usage or None, got tuple"),
    ],
)
def test_reply_with_inputs_of_the_wrong_type_is_a_type_error(arguments: dict[str, Any], message: str) -> None:
    """reply names the input at fault and what it should be."""
    with pytest.raises(TypeError, match=message):
        reply(**arguments)


def test_fake_model_takes_several_responses_or_one_iterable_of_them() -> None:
    """FakeModel(a, b), FakeModel([a, b]), FakeModel(iter) and FakeModel(a) all script the same way."""
    a, b = reply("a"), reply("b")
    boom = RuntimeError("boom")
    assert _script(FakeModel(a, b), 2) == [a, b]
    assert _script(FakeModel([a, b]), 2) == [a, b]
    assert _script(FakeModel(r for r in (a, b)), 2) == [a, b]
    assert _script(FakeModel(a, boom), 2) == [a, boom]
    only = _script(FakeModel(a), 2)
    assert only[0] == a
    assert isinstance(only[1], ScriptExhaustedError)
    assert isinstance(_script(FakeModel(), 1)[0], ScriptExhaustedError)


@pytest.mark.parametrize("entry", ["plain text", {"role": "assistant"}, None], ids=repr)
def test_fake_model_returns_a_lone_malformed_entry_as_one_response(entry: Any) -> None:
    """A lone str or mapping is one (malformed) response, not a script to unpack, so engine tests can script it."""
    assert _script(FakeModel(entry), 1) == [entry]
    assert _script(FakeModel([entry]), 1) == [entry]


def test_fake_model_raises_a_scripted_base_exception() -> None:
    """A KeyboardInterrupt in the script is raised, not returned as if it were a response."""
    model = FakeModel(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        model.complete([Message("user", "q")], [])
    assert isinstance(FakeModel(ModelResponse(Message("assistant", "x"))).responses[0], ModelResponse)
