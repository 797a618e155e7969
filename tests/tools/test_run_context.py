"""RunContext: the tool parameter the model never sees, and run_context() for the other code a run calls."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from fsm_agent import (
    Agent,
    AgentLoopError,
    Message,
    Retry,
    RunContext,
    RunView,
    StopCondition,
    ToolRegistry,
    run_context,
)
from fsm_agent.errors import RunStateError
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.tools import NoDepsError


class Db:
    """An application object: not JSON, not worth pickling."""

    def __init__(self) -> None:
        self.rows = {"a": "apple", "b": "banana"}


def _registry(seen: list[RunContext[Db]]) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.register
    def lookup(key: str, context: RunContext[Db]) -> str:
        """Look a key up in the application's database."""
        seen.append(context)
        return context.deps.rows[key]

    return tools


def test_a_run_context_parameter_of_any_name_is_left_out_of_the_schema() -> None:
    """The model is offered only `key`; the RunContext parameter, whatever its name, is the registry's to fill."""
    tools = ToolRegistry()

    @tools.register
    def peek(app: RunContext[Db], key: str, call_id: str = "") -> str:
        """Peek."""
        return key

    tool = tools.get("peek")
    assert tool is not None
    assert tool.parameters["properties"] == {"key": {"type": "string"}}
    assert tool.parameters["required"] == ["key"]
    assert tool.takes_context == "app"


def test_a_tool_receives_the_runs_deps_id_call_and_usage() -> None:
    """The record names the run, the call, its turn and the tokens so far, and carries the deps given to the run."""
    seen: list[RunContext[Db]] = []
    db = Db()
    model = FakeModel(tool_turn(tool_call("lookup", id="c1", key="a"), usage=_usage(7, 3)), reply("apple it is"))
    run = Agent(model, _registry(seen)).start("which fruit?", deps=db, run_id="r-1")
    result = run.finish()
    assert result.final == "apple it is"
    assert [m.content for m in result.messages if m.role == "tool"] == ['"apple"']
    (context,) = seen
    assert context.deps is db
    assert (context.run_id, context.call_id, context.tool_name, context.turn) == ("r-1", "c1", "lookup", 1)
    assert (context.usage.input_tokens, context.usage.output_tokens) == (7, 3)
    assert "Db" not in repr(context)  # deps are not for logs


def _usage(given: int, made: int) -> Any:
    from fsm_agent import Usage

    return Usage(given, made)


def test_a_tool_that_needs_deps_of_a_run_given_none_gets_a_clear_error_result() -> None:
    """Reading ctx.deps without deps is a NoDepsError the model sees as the call's error, naming what to pass."""
    seen: list[RunContext[Db]] = []
    model = FakeModel(tool_turn(tool_call("lookup", key="a")), reply("sorry"))
    result = Agent(model, _registry(seen)).run("which fruit?")
    (answer,) = [m.content for m in result.messages if m.role == "tool"]
    error = json.loads(answer)["error"]
    assert error.startswith("tool 'lookup' raised NoDepsError: tool 'lookup' needs the run's deps")
    assert "pass agent.run(..., deps=...)" in error
    assert result.steps[0].counters["failures"][0] == 1  # counted as the failed call it is
    assert seen[0].has_deps is False
    with pytest.raises(NoDepsError):
        _ = seen[0].deps


def test_a_tool_that_reads_no_deps_runs_without_them() -> None:
    """A RunContext is given to a run without deps too: a tool that only wants the call id works."""
    tools = ToolRegistry()

    @tools.register
    def stamp(ctx: RunContext[None]) -> str:
        """The call's id."""
        return f"{ctx.run_id}:{ctx.call_id}"

    model = FakeModel(tool_turn(tool_call("stamp", id="c9")), reply("ok"))
    result = Agent(model, tools).start("go", run_id="r9").finish()
    assert [m.content for m in result.messages if m.role == "tool"] == ['"r9:c9"']


def test_arguments_that_fill_the_context_parameter_are_an_error_result() -> None:
    """A model cannot pass its own value for the context parameter: the call is refused, the tool never runs."""
    tools = ToolRegistry()
    calls: list[str] = []

    @tools.register
    def loose(ctx: RunContext[Db], **extra: Any) -> str:
        """Takes anything."""
        calls.append("ran")
        return "ran"

    outcome = tools.execute(tool_call("loose", ctx="forged"))
    assert outcome.error == "bad arguments for tool 'loose': ctx is the run's context"
    assert calls == []


def test_a_tool_called_outside_a_run_gets_a_context_without_deps() -> None:
    """registry.execute by hand: the call is named, no run and no deps."""
    seen: list[RunContext[Db]] = []
    outcome = _registry(seen).execute(tool_call("lookup", id="x", key="a"))
    assert outcome.error is not None
    assert "NoDepsError" in outcome.error
    assert (seen[0].run_id, seen[0].call_id, seen[0].has_deps) == ("", "x", False)


def test_run_context_outside_a_run_is_a_run_state_error() -> None:
    """Only code a run calls has a run context."""
    with pytest.raises(RunStateError, match="outside a run"):
        run_context()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_stop_conditions_validators_and_history_processors_read_the_deps(driver: str) -> None:
    """run_context() inside each kind of user code a run calls returns that run's deps, in both drivers."""
    db = Db()
    read: dict[str, Any] = {}

    def condition(view: RunView) -> bool:
        read["stop condition"] = run_context().deps
        return False

    def processor(messages: list[Message]) -> list[Message]:
        read["history processor"] = run_context().deps
        return messages

    def validator(output: str) -> str:
        read["output validator"] = run_context().deps
        if output != "apple":
            raise Retry("say apple")
        return output

    agent = Agent(
        FakeModel(reply("pear"), reply("apple")),
        ToolRegistry(),
        stop_conditions=[StopCondition("never", "AwaitModel", condition, "reads the deps")],
        history_processors=[processor],
        output_type=str,
        output_validators=[validator],
        output_retries=2,
        timeout=30.0,  # the output check then runs on a worker thread, which must see the run too
    )
    result = agent.run("fruit?", deps=db) if driver == "sync" else asyncio.run(agent.arun("fruit?", deps=db))
    assert result.output == "apple"
    assert read == {"stop condition": db, "history processor": db, "output validator": db}


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_tool_on_a_worker_thread_with_a_tool_timeout_still_gets_its_run(driver: str) -> None:
    """tool_timeout runs the tool on a daemon worker: run_context() there is the run's, as in the caller."""
    tools = ToolRegistry()
    db = Db()

    @tools.register
    def fetch(key: str) -> str:
        """A tool without the parameter, asking run_context() instead."""
        deps: Db = run_context().deps
        return deps.rows[key]

    agent = Agent(FakeModel(tool_turn(tool_call("fetch", key="b")), reply("ok")), tools, tool_timeout=5.0)
    result = agent.run("go", deps=db) if driver == "sync" else asyncio.run(agent.arun("go", deps=db))
    assert [m.content for m in result.messages if m.role == "tool"] == ['"banana"']


def test_a_stop_condition_of_a_run_without_deps_stops_it_with_the_error() -> None:
    """A check that needs deps the run was not given fails like any check that raises: the run says why."""

    def needs(view: RunView) -> bool:
        return bool(run_context().deps)

    agent = Agent(FakeModel(reply("hi")), ToolRegistry(), stop_conditions=[StopCondition("x", "AwaitModel", needs, "")])
    with pytest.raises(AgentLoopError) as stop:
        agent.run("go")
    assert "NoDepsError" in json.dumps(stop.value.result.evidence)


def test_a_tool_registered_with_its_own_schema_still_gets_its_run_context() -> None:
    """A bridge to another system (an MCP server) shows the model that system's schema and still learns the call."""
    seen: list[tuple[str, str | None, dict[str, Any]]] = []
    tools = ToolRegistry()

    def remote(context: RunContext[Any], **arguments: Any) -> str:
        seen.append((context.run_id, context.call_id, arguments))
        return "sent"

    schema = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}
    tools.register(remote, name="send", description="Send a note.", parameters=schema)
    assert tools.schemas()[0]["parameters"] == schema
    model = FakeModel(tool_turn(tool_call("send", id="s1", to="ana")), reply("ok"))
    Agent(model, tools).run("go", run_id="r")
    assert seen == [("r", "s1", {"to": "ana"})]


def test_a_run_context_parameter_that_is_also_a_property_of_the_given_schema_is_refused() -> None:
    def remote(context: RunContext[Any], **arguments: Any) -> str:
        return "sent"

    tools = ToolRegistry()
    with pytest.raises(ValueError, match="'context' is also a property of its schema"):
        tools.register(remote, name="send", parameters={"type": "object", "properties": {"context": {}}})
    assert tools.schemas() == []
