"""deps reach every tool call exactly once, on both drivers, in parallel batches, streams and resumed stored runs.

A tool reading the deps of a run given none gets ``NoDepsError`` as its
error result (docs/how-to/deps.md), which counts as that call's failure.
Deps that are no instance of a tool's ``RunContext[T]`` plain class are
refused as the run starts, nothing called; for a ``T`` that is no plain
class (a generic) they are the tool's own error, counted the same way.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, RunContext, RunResult, SqliteStore, TransitionEvent
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class Ledger:
    """What the app hands its run: a dict of executions by key (empty, so falsy: still deps)."""

    def __init__(self) -> None:
        self.ran: dict[str, int] = {}


executions: list[str] = []


def record(key: str, ctx: RunContext[Ledger]) -> str:
    """Record one execution of ``key`` in the app's ledger."""
    executions.append(key)
    ctx.deps.ran[key] = ctx.deps.ran.get(key, 0) + 1
    return f"{key} by {ctx.call_id}"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    executions.clear()


def batch(*keys: str) -> Any:
    return tool_turn(*(tool_call("record", id=f"c-{key}", key=key) for key in keys))


def ended(agent: Agent, driver: str, **keywords: Any) -> RunResult:
    try:
        return agent.run("q", **keywords) if driver == "sync" else asyncio.run(agent.arun("q", **keywords))
    except AgentLoopError as stop:
        return stop.result


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_parallel_batch_of_a_stored_run_gives_each_call_the_same_falsy_deps_once(driver: str, tmp_path: Path) -> None:
    app = Ledger()
    agent = Agent(FakeModel(batch("a", "b", "c"), reply("done")), [record])
    result = ended(agent, driver, deps=app, store=SqliteStore(tmp_path / "runs.db"), run_id="r1")
    assert result.reason == "done"
    assert app.ran == {"a": 1, "b": 1, "c": 1}
    assert sorted(executions) == ["a", "b", "c"]
    assert [m.content for m in result.messages if m.role == "tool"] == ['"a by c-a"', '"b by c-b"', '"c by c-c"']


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_tool_that_needs_deps_of_a_run_given_none_is_a_counted_tool_failure(driver: str) -> None:
    agent = Agent(FakeModel(batch("a"), reply("never")), [record], max_consecutive_failures=1)
    with pytest.raises(AgentLoopError) as stop:
        agent.run("q", run_id="r-7") if driver == "sync" else asyncio.run(agent.arun("q", run_id="r-7"))
    assert stop.value.reason == "tool_failures"
    assert "NoDepsError" in stop.value.evidence["last_error"]
    assert "run 'r-7' was given none" in stop.value.evidence["last_error"]
    assert "deps=" in stop.value.evidence["last_error"]
    assert executions == ["a"]  # the tool ran once, up to reading ctx.deps; not again


@pytest.mark.parametrize("driver", DRIVERS)
def test_deps_of_another_class_than_the_tools_are_refused_before_any_call(driver: str) -> None:
    model = FakeModel(batch("a"), reply("sorry"))
    with pytest.raises(TypeError, match=r"tool 'record' takes RunContext\[Ledger\].*deps of type list"):
        ended(Agent(model, [record]), driver, deps=["not", "a", "ledger"])
    assert model.seen == []
    assert executions == []


def tally(key: str, ctx: RunContext[dict[str, int]]) -> str:
    """Count ``key`` in the app's tally (a generic ``T``: not checked when the run starts)."""
    executions.append(key)
    ctx.deps[key] = ctx.deps.get(key, 0) + 1
    return key


@pytest.mark.parametrize("driver", DRIVERS)
def test_deps_that_do_not_fit_a_generic_t_are_the_tools_error_result_not_a_setup_error(driver: str) -> None:
    model = FakeModel(tool_turn(tool_call("tally", id="c-a", key="a")), reply("sorry"))
    result = ended(Agent(model, [tally]), driver, deps=["not", "a", "dict"])
    assert result.reason == "done"
    (answer,) = [m.content for m in result.messages if m.role == "tool"]
    assert "AttributeError" in answer
    assert result.steps[0].counters["failures"][0] == 1
    assert executions == ["a"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stored_run_resumed_with_new_deps_gives_them_only_to_the_calls_not_yet_made(
    driver: str, tmp_path: Path
) -> None:
    first, second = Ledger(), Ledger()
    store = SqliteStore(tmp_path / "runs.db")
    agent = Agent(FakeModel(batch("a"), batch("b", "c"), reply("done")), [record], max_steps=1)
    assert ended(agent, driver, deps=first, store=store, run_id="r1").reason == "max_steps"
    run = agent.resume(store.load("r1"), store=store, max_steps=5, deps=second)
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert result.reason == "done"
    assert (first.ran, second.ran) == ({"a": 1}, {"b": 1, "c": 1})
    assert sorted(executions) == ["a", "b", "c"]
    assert "Ledger" not in str(store.load("r1"))  # nothing of them was stored


class Typist(FakeModel):
    def complete_stream(self, messages: Any, tools: Any, on_text: Any, **keywords: Any) -> Any:
        response = self.complete(messages, tools, **keywords)
        for word in re.findall(r"\S+\s*", response.message.content):
            on_text(word)
        return response

    async def acomplete_stream(self, messages: Any, tools: Any, on_text: Any, **keywords: Any) -> Any:
        return self.complete_stream(messages, tools, on_text, **keywords)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_streamed_run_hands_its_deps_to_each_call_of_a_batch_once(driver: str) -> None:
    app = Ledger()
    agent = Agent(
        Typist(
            tool_turn(tool_call("record", id="c-a", key="a"), tool_call("record", id="c-b", key="b"), content="Two."),
            reply("done"),
        ),
        [record],
    )
    if driver == "sync":
        events: list[Any] = list(agent.stream("q", deps=app))
    else:

        async def collect() -> list[Any]:
            return [event async for event in agent.astream("q", deps=app)]

        events = asyncio.run(collect())
    last = events[-1]
    assert isinstance(last, TransitionEvent)
    assert last.result is not None
    assert last.result.reason == "done"
    assert app.ran == {"a": 1, "b": 1}
