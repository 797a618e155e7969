"""The tool registry: schemas from type hints, JSON Schema argument checks, structural failure detection."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest

import fsm_agent
from fsm_agent import ToolCall, ToolRegistry, ToolResult
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_turn


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


# --- one call, both ways of running it ----------------------------------------------------------------------

Runner = Callable[[ToolRegistry, ToolCall, "float | None"], ToolResult]
RUNNERS: dict[str, Runner] = {
    "execute": lambda registry, call, timeout: registry.execute(call, timeout=timeout),
    "aexecute": lambda registry, call, timeout: asyncio.run(registry.aexecute(call, timeout=timeout)),
}


def _counted(kind: str, body: Callable[..., Any]) -> tuple[ToolRegistry, list[dict[str, Any]]]:
    """A registry whose one tool ``t`` (a def or an async def) records each call's arguments, then runs ``body``."""
    registry, calls = ToolRegistry(), []

    def t(**arguments: Any) -> Any:
        calls.append(arguments)
        return body(**arguments)

    async def at(**arguments: Any) -> Any:
        return t(**arguments)

    registry.register(t if kind == "sync" else at, name="t")
    return registry, calls


def _raise(error: BaseException) -> Callable[..., Any]:
    def body(**_: Any) -> Any:
        raise error

    return body


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("timeout", [None, 5.0])
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("error", [asyncio.CancelledError, GeneratorExit])
def test_a_tool_raising_cancelled_error_or_generator_exit_on_its_own_is_an_error_result(
    runner: str, timeout: float | None, kind: str, error: type[BaseException]
) -> None:
    """Nobody cancelled the call, so the tool's own CancelledError or GeneratorExit is a failure like any other."""
    registry, calls = _counted(kind, _raise(error("on its own")))
    outcome = RUNNERS[runner](registry, ToolCall("1", "t", {}), timeout)
    assert outcome.error == f"tool 't' raised {error.__name__}: on its own"
    assert len(calls) == 1


@pytest.mark.parametrize("timeout", [None, 5.0])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_cancelling_the_task_that_awaits_aexecute_still_propagates(timeout: float | None, kind: str) -> None:
    """A real cancellation (the awaiting task's cancelling() > 0) is not turned into a tool result."""
    release, started = threading.Event(), threading.Event()
    registry, calls = ToolRegistry(), []

    def t() -> bool:
        calls.append(1)
        started.set()
        return release.wait(5)

    async def at() -> str:
        calls.append(1)
        started.set()
        await asyncio.sleep(5)
        return "never"

    registry.register(t if kind == "sync" else at, name="t")

    async def main() -> None:
        task = asyncio.ensure_future(registry.aexecute(ToolCall("1", "t", {}), timeout=timeout))
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            release.set()

    asyncio.run(main())
    assert len(calls) == 1


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("signal", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_from_a_tool_still_propagate(
    runner: str, kind: str, signal: type[BaseException]
) -> None:
    """The person or the process wants to stop: that is never a tool result."""
    registry, calls = _counted(kind, _raise(signal()))
    with pytest.raises(signal):
        RUNNERS[runner](registry, ToolCall("1", "t", {}), None)
    assert len(calls) == 1


def _grab(items: list[str], meta: dict[str, list[int]]) -> int:
    items.append("added")
    meta["n"].append(2)
    meta["new"] = [3]
    return len(items) + len(meta["n"])


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_tool_that_changes_its_arguments_cannot_change_the_call(runner: str, kind: str) -> None:
    """The tool gets its own deep copy: the ToolCall keeps its arguments, and running it again sees them unchanged."""
    registry, calls = _counted(kind, _grab)
    call = ToolCall("1", "t", {"items": ["a"], "meta": {"n": [1]}})
    before = copy.deepcopy(call.arguments)
    first = RUNNERS[runner](registry, call, None)
    second = RUNNERS[runner](registry, call, None)
    assert call.arguments == before
    assert (first.content, second.content) == ("4", "4")
    assert len(calls) == 2


@pytest.mark.parametrize("driver", ["run", "arun"])
def test_a_tool_that_changes_its_arguments_leaves_the_history_unchanged(driver: str) -> None:
    """Through either driver, the assistant message in the result still holds the arguments the model sent."""
    registry, calls = _counted("sync", _grab)
    arguments = {"items": ["a"], "meta": {"n": [1]}}
    model = FakeModel(tool_turn(ToolCall("g1", "t", copy.deepcopy(arguments))), reply("ok"))
    if driver == "run":
        result = fsm_agent.run(model, registry, "q")
    else:
        result = asyncio.run(fsm_agent.arun(model, registry, "q"))
    assert result.messages[1].tool_calls[0].arguments == arguments
    assert len(calls) == 1


@pytest.mark.parametrize("driver", ["run", "arun"])
def test_a_tool_raising_cancelled_error_on_its_own_is_a_tool_failure_in_both_drivers(driver: str) -> None:
    """The run is not recorded as cancelled: the tool failed, the model sees the error, and the run goes on."""
    registry, calls = _counted("async", _raise(asyncio.CancelledError("on its own")))
    model = FakeModel(tool_turn(ToolCall("c1", "t", {})), reply("ok"))
    if driver == "run":
        result = fsm_agent.run(model, registry, "q")
    else:
        result = asyncio.run(fsm_agent.arun(model, registry, "q"))
    assert (result.reason, result.final) == ("done", "ok")
    assert json.loads(result.messages[2].content) == {"error": "tool 't' raised CancelledError: on its own"}
    assert len(calls) == 1


def test_a_tool_declaring_call_id_is_not_offered_it_in_its_schema() -> None:
    """call_id is filled by the registry, so the model never sees it, whether positional-or-keyword or keyword-only."""
    registry = ToolRegistry()

    def charge(card: str, call_id: str) -> str:
        return card

    async def refund(card: str, *, call_id: str = "") -> str:
        return card

    registry.register(charge)
    registry.register(refund)
    for schema in registry.schemas():
        assert schema["parameters"]["properties"] == {"card": {"type": "string"}}
        assert schema["parameters"]["required"] == ["card"]
    assert [registry.get(name).takes_call_id for name in ("charge", "refund")] == [True, True]  # type: ignore[union-attr]


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_tool_declaring_call_id_receives_the_tool_call_id(runner: str, kind: str) -> None:
    """The registry passes ToolCall.id as call_id, so a tool can make its effect idempotent."""
    registry, calls = ToolRegistry(), []

    def charge(card: str, call_id: str) -> str:
        calls.append(call_id)
        return card

    async def acharge(card: str, *, call_id: str) -> str:
        return charge(card, call_id)

    registry.register(charge if kind == "sync" else acharge, name="charge")
    outcome = RUNNERS[runner](registry, ToolCall("call_7", "charge", {"card": "4242"}), None)
    assert (outcome.ok, outcome.content) == (True, '"4242"')
    assert calls == ["call_7"]


@pytest.mark.parametrize("runner", RUNNERS)
def test_call_id_sent_by_the_model_is_an_error_result_and_the_tool_does_not_run(runner: str) -> None:
    """The model cannot choose the id a tool de-duplicates on, not even through **kwargs."""
    registry, calls = ToolRegistry(), []

    def strict(card: str, call_id: str) -> None:
        calls.append(call_id)

    def loose(call_id: str, **extra: Any) -> None:
        calls.append(call_id)

    registry.register(strict)
    registry.register(loose)
    outcomes = [
        RUNNERS[runner](registry, ToolCall("1", name, {"card": "4242", "call_id": "forged"}), None)
        for name in ("strict", "loose")
    ]
    assert [outcome.error for outcome in outcomes] == [
        "bad arguments for tool 'strict': unexpected argument(s): call_id; allowed: card",
        "bad arguments for tool 'loose': call_id is filled by the registry, not passed",
    ]
    assert calls == []


def test_tools_is_a_package_of_small_modules_that_keeps_its_public_names() -> None:
    """fsm_agent.tools is a package (schema, registry, builtin, ...) of modules under 400 lines, same public names."""
    import fsm_agent.tools as tools
    from fsm_agent.tools import DEFAULT_MAX_OUTPUT_CHARS, JSONSchema, Tool

    assert (DEFAULT_MAX_OUTPUT_CHARS, JSONSchema, Tool.__name__) == (100_000, dict[str, Any], "Tool")
    assert tools.__all__ == sorted(tools.__all__)
    folder = Path(tools.__file__).parent
    sizes = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in folder.glob("*.py")}
    assert {"__init__.py", "schema.py", "registry.py", "builtin.py"} <= set(sizes)
    assert max(sizes.values()) <= 400, sizes


def test_an_agent_offers_a_tool_registered_after_its_last_run_and_each_run_its_own_list() -> None:
    """The agent keeps the schemas between runs, but a change to the registry is offered at the next run."""
    from fsm_agent import Agent

    registry = ToolRegistry()

    @registry.register
    def first() -> str:
        """The first tool."""
        return "1"

    model = FakeModel(reply("a"), reply("b"), reply("c"))
    agent = Agent(model, registry)
    agent.run("q")
    agent.run("q")

    @registry.register
    def second() -> str:
        """Registered after two runs."""
        return "2"

    agent.run("q")
    assert [[tool["name"] for tool in tools] for tools in model.tools_seen] == [
        ["first"],
        ["first"],
        ["first", "second"],
    ]
    model.tools_seen[0].clear()  # a model that changes what it was offered changes no other run
    assert model.tools_seen[1] == [registry.get("first").schema]  # type: ignore[union-attr]


def test_a_handoff_waits_until_its_work_ends_then_gives_what_it_returned_or_raised() -> None:
    """``Handoff``: ``wait`` times out while the work runs, and ``result`` is the work's value or its exception."""
    from fsm_agent.tools.calling import DeadlineError, Handoff, within_deadline

    gate = threading.Event()
    ran: list[str] = []

    def work() -> str:
        gate.wait()
        ran.append(threading.current_thread().name)
        return "answer"

    handoff = Handoff(work)
    assert handoff.wait(0.05) is False  # still waiting at the gate
    gate.set()
    assert handoff.wait(None) is True
    assert handoff.wait(0) is True  # it stays ended for every later wait
    assert handoff.result() == "answer"
    assert ran == ["fsm_agent worker"]

    def broken() -> None:
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        Handoff(broken).result()
    slow = threading.Event()
    with pytest.raises(DeadlineError, match=r"slow still running after 0\.05 s"):
        within_deadline(slow.wait, 0.05, "slow")
    slow.set()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_deadline_longer_than_a_lock_can_wait_bounds_nothing_and_breaks_nothing(driver: str) -> None:
    """``timeout=1e12`` and ``tool_timeout=1e12`` are valid limits: the run finishes with the tool's real output."""
    script = [tool_turn(ToolCall("c1", "echo", {"text": "hi"})), reply("ok")]
    agent = fsm_agent.Agent(FakeModel(script), demo_registry(), timeout=1e12, tool_timeout=1e12)
    result = agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    unbounded = fsm_agent.Agent(FakeModel(script), demo_registry()).run("q")
    assert (result.final, result.messages) == ("ok", unbounded.messages)
    assert [m.content for m in result.messages if m.role == "tool"] == ['"hi"']
