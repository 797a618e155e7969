"""Typed answers: every rejected answer is kept, retries stop exactly at ``output_retries``, and no tool runs again.

On both drivers: the boundary 0/1/N of ``output_retries``, a validator's
``Retry`` and a validator that breaks, a typed finalize answer, a typed
answer of a resumed stored run (its validator reading the new owner's
deps), and an output value that JSON cannot hold, stored with its run.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, Retry, RunResult, SqliteStore, ToolRegistry, run_context
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


@dataclass
class Point:
    x: int


class Counted:
    """A registry whose one tool, ``bump``, counts how often it ran for each key."""

    def __init__(self) -> None:
        self.ran: dict[str, int] = {}
        self.registry = ToolRegistry()

        @self.registry.register
        def bump(key: str) -> str:
            """Count one execution of ``key``."""
            self.ran[key] = self.ran.get(key, 0) + 1
            return f"bumped {key}"


def ended(agent: Agent, driver: str, **keywords: Any) -> RunResult:
    try:
        return agent.run("q", **keywords) if driver == "sync" else asyncio.run(agent.arun("q", **keywords))
    except AgentLoopError as stop:
        return stop.result


def answers(result: RunResult) -> list[str]:
    return [m.content for m in result.messages if m.role == "assistant"]


@pytest.mark.parametrize("retries", [0, 1, 3])
@pytest.mark.parametrize("driver", DRIVERS)
def test_retries_stop_exactly_at_the_limit_and_every_rejected_answer_is_kept(driver: str, retries: int) -> None:
    rejected = [f'{{"x": "bad {i}"}}' for i in range(retries + 1)]
    model = FakeModel(*(reply(text) for text in rejected), reply('{"x": 1}'))
    tools = Counted()
    result = ended(Agent(model, tools.registry, output_type=Point, output_retries=retries), driver)
    assert result.reason == "output_invalid"
    assert result.output is None
    assert len(model.seen) == retries + 1  # the accepted answer was never asked for
    assert answers(result) == rejected
    assert result.final == rejected[-1]
    assert result.evidence["answer"] == rejected[-1]
    assert (result.evidence["retries"], result.evidence["limit"]) == (retries, retries)
    assert edges(result).count("Dispatch->AwaitModel[output_invalid]") == retries
    assert edges(result)[-1] == "Dispatch->Failed[output_invalid]"


@pytest.mark.parametrize("driver", DRIVERS)
def test_one_retry_left_is_enough_for_a_good_second_answer(driver: str) -> None:
    model = FakeModel(reply('{"x": "bad"}'), reply('{"x": 2}'))
    result = ended(Agent(model, Counted().registry, output_type=Point, output_retries=1), driver)
    assert (result.reason, result.output) == ("done", Point(2))
    assert answers(result)[0] == '{"x": "bad"}'


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_validators_retry_with_no_retries_left_stops_at_once_with_its_message(driver: str) -> None:
    def positive(point: Point) -> Point:
        if point.x <= 0:
            raise Retry("x must be positive")
        return point

    model = FakeModel(reply('{"x": -1}'), reply('{"x": 1}'))
    agent = Agent(model, Counted().registry, output_type=Point, output_validators=[positive], output_retries=0)
    result = ended(agent, driver)
    assert result.reason == "output_invalid"
    assert result.evidence["errors"] == ["x must be positive"]
    assert len(model.seen) == 1
    assert result.final == '{"x": -1}'


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_broken_validator_of_a_stored_run_stops_it_at_once_and_the_store_keeps_the_answer(
    driver: str, tmp_path: Path
) -> None:
    def broken(point: Point) -> Point:
        raise KeyError("region")

    store = SqliteStore(tmp_path / "runs.db")
    model = FakeModel(reply('{"x": 1}'), reply('{"x": 2}'))
    agent = Agent(model, Counted().registry, output_type=Point, output_validators=[broken], output_retries=3)
    result = ended(agent, driver, store=store, run_id="r1")
    assert (result.reason, result.evidence["retryable"]) == ("output_invalid", False)
    assert len(model.seen) == 1
    stored = store.load("r1")
    assert (stored["state"], stored["reason"]) == ("Failed", "output_invalid")
    assert [m["content"] for m in stored["messages"] if m["role"] == "assistant"] == ['{"x": 1}']


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_typed_finalize_answer_is_done_with_its_output_and_no_tool_runs_twice(driver: str) -> None:
    tools = Counted()
    model = FakeModel(tool_turn(tool_call("bump", id="c1", key="a")), reply('{"x": 5}'))
    agent = Agent(model, tools.registry, output_type=Point, max_steps=1, on_stop={"max_steps": "finalize"})
    result = ended(agent, driver)
    assert (result.reason, result.ok, result.output) == ("max_steps", False, Point(5))
    assert result.evidence["finalize"]["outcome"] == "answered"
    assert tools.ran == {"a": 1}
    assert edges(result)[-1] == "Dispatch->Done[has_no_tool_calls]"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_resumed_stored_run_checks_its_typed_answer_with_the_new_owners_deps(driver: str, tmp_path: Path) -> None:
    def at_most_the_apps_limit(point: Point) -> Point:
        limit = run_context().deps
        if point.x > limit:
            raise Retry(f"x must be at most {limit}")
        return point

    tools = Counted()
    store = SqliteStore(tmp_path / "runs.db")
    model = FakeModel(
        tool_turn(tool_call("bump", id="c1", key="a")),
        tool_turn(tool_call("bump", id="c2", key="b")),
        reply('{"x": 9}'),
        reply('{"x": 2}'),
    )
    agent = Agent(model, tools.registry, max_steps=1, output_type=Point, output_validators=[at_most_the_apps_limit])
    assert ended(agent, driver, store=store, run_id="r1", deps=5).reason == "max_steps"
    run = agent.resume(store.load("r1"), store=store, max_steps=6, deps=5)
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert (result.reason, result.output) == ("done", Point(2))
    assert tools.ran == {"a": 1, "b": 1}
    assert answers(result)[-2:] == ['{"x": 9}', '{"x": 2}']
    assert store.load("r1")["state"] == "Done"


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_output_json_cannot_hold_is_returned_while_the_run_and_its_result_store_as_json(
    driver: str, tmp_path: Path
) -> None:
    class Opaque:
        """An application object: no JSON form."""

    @dataclass
    class Stamped:
        x: int
        when: Any = None
        extra: Any = None

    def stamp(value: Stamped) -> Stamped:
        return Stamped(value.x, datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), {Opaque()})

    store = SqliteStore(tmp_path / "runs.db")
    agent = Agent(FakeModel(reply('{"x": 3}')), Counted().registry, output_type=Stamped, output_validators=[stamp])
    result = ended(agent, driver, store=store, run_id="r1")
    assert result.reason == "done"
    assert isinstance(result.output, Stamped)
    assert result.output.when.year == 2024
    data = json.loads(result.to_json())
    assert "output" not in data
    assert data["final"] == '{"x": 3}'
    assert RunResult.from_dict(data).output is None
    assert store.load("r1")["state"] == "Done"
