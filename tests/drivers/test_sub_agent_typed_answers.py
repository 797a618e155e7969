"""A typed sub-agent's answer reaches its parent as the tool's JSON (docs/how-to/sub-agents.md, typed-answers.md).

"The tool message holds the child's answer as JSON: its final text, or its
typed ``output``"; and every run stops with a named reason.  Each output
kind the typed-answers page lists is tried, on both drivers.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict

from fsm_agent import Agent, AgentLoopError, Retry, RunResult, SqliteStore
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class Weather(BaseModel):
    city: str
    celsius: int


@dataclass
class Forecast:
    city: str
    celsius: int


class Place(TypedDict):
    city: str


@dataclass
class Trip:
    city: str
    day: datetime.date


class Visit(TypedDict):
    city: str
    day: datetime.date


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _parent(child: Agent, **options: Any) -> tuple[Agent, FakeModel]:
    tools = demo_registry()
    tools.register(child.as_tool("ask", "Answers one question."))
    model = FakeModel(tool_turn(tool_call("ask", id="c1", input="where?")), reply("thanks"))
    return Agent(model, tools, **options), model


def _finish(agent: Agent, driver: str, **options: Any) -> RunResult:
    if driver == "sync":
        return agent.run("go", **options)
    return asyncio.run(agent.arun("go", **options))


def _shout(text: str) -> str:
    return text.upper()


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("output_type", "validators", "answer", "told"),
    [
        (Weather, [], '{"city": "Oslo", "celsius": 21}', {"city": "Oslo", "celsius": 21}),
        (Forecast, [], '{"city": "Oslo", "celsius": 21}', {"city": "Oslo", "celsius": 21}),
        (Place, [], '{"city": "Oslo"}', {"city": "Oslo"}),
        (SCHEMA, [], '```json\n{"city": "Oslo"}\n```', {"city": "Oslo"}),
        (str, [_shout], "oslo", "OSLO"),
    ],
    ids=["pydantic", "dataclass", "typeddict", "schema-fenced", "str-validated"],
)
def test_each_output_kind_of_a_child_is_the_parents_tool_message_as_json(
    driver: str, output_type: Any, validators: list[Any], answer: str, told: Any
) -> None:
    child_model = FakeModel(reply(answer))
    child = Agent(child_model, demo_registry(), output_type=output_type, output_validators=validators)
    parent, model = _parent(child)
    result = _finish(parent, driver)
    assert result.final == "thanks"
    assert json.loads(result.messages[2].content) == told
    assert json.loads(model.seen[1][-1].content) == told  # the parent's model was sent exactly that
    assert len(child_model.seen) == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_child_answer_sent_back_is_retried_inside_the_child_and_only_the_checked_one_reaches_the_parent(
    driver: str,
) -> None:
    """The child's invalid answer goes back to the child's model (its retry), never to the parent."""
    checked: list[str] = []

    def plausible(weather: Weather) -> Weather:
        checked.append(weather.city)
        if weather.celsius > 60:
            raise Retry("not a temperature on Earth")
        return weather

    child_model = FakeModel(reply('{"city": "Oslo", "celsius": 210}'), reply('{"city": "Oslo", "celsius": 21}'))
    child = Agent(child_model, demo_registry(), output_type=Weather, output_validators=[plausible])
    parent, _ = _parent(child)
    result = _finish(parent, driver)
    assert json.loads(result.messages[2].content) == {"city": "Oslo", "celsius": 21}
    assert checked == ["Oslo", "Oslo"]
    assert len(child_model.seen) == 2


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_child_whose_answer_never_fits_is_a_tool_error_with_its_output_invalid_evidence(driver: str) -> None:
    child = Agent(FakeModel(reply('{"city": 1}'), reply('{"city": 2}')), demo_registry(), output_type=Weather)
    parent, _ = _parent(child)
    result = _finish(parent, driver)
    error = json.loads(result.messages[2].content)
    assert error["reason"] == "output_invalid"
    assert error["evidence"]["retries"] == error["evidence"]["limit"] == 1
    assert error["evidence"]["answer"] == '{"city": 2}'
    assert result.steps[0].counters["failures"][0] == 1


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("output_type", [Trip, Visit], ids=["dataclass", "typeddict"])
def test_a_typed_child_with_a_date_field_answers_its_parent(driver: str, output_type: Any, tmp_path: Path) -> None:
    """A dataclass or TypedDict with a ``date`` field is a valid output type (pydantic checks it); the parent
    must get the answer as JSON, or at least stop with a named reason, never a TypeError left unfinished."""
    child = Agent(FakeModel(reply('{"city": "Oslo", "day": "2024-05-01"}')), demo_registry(), output_type=output_type)
    parent, _ = _parent(child)
    store = SqliteStore(str(tmp_path / "runs.db"))
    try:
        result = _finish(parent, driver, store=store, run_id="p")
    except AgentLoopError as stop:
        result = stop.result
    assert store.load("p")["state"] in ("Done", "Failed")
    assert json.loads(result.messages[2].content) == {"city": "Oslo", "day": "2024-05-01"}
