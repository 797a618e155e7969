"""Typed answers are bounded: the schema's references, the answer's depth and numbers, the check's time and values.

Each refusal is checked where it happens (at ``Agent(...)`` for a schema,
as an ``output_invalid`` answer for a reply) and on both drivers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time
from typing import Any

import pydantic
import pytest
from support.scenarios import POINT

from fsm_agent import Agent, AgentLoopError, RunResult, ToolRegistry
from fsm_agent.testing import FakeModel, edges, reply

DRIVERS = ["sync", "async"]

TREE = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["name"],
}
"""A legitimately recursive schema: a node whose children are nodes, one level of the answer per step."""
NUMBER = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
"""An answer with one number, of any kind JSON has."""


class PointModel(pydantic.BaseModel):
    """A point given by a pydantic model."""

    x: int
    y: int


@dataclasses.dataclass
class PointClass:
    x: int
    y: int


def finish(agent: Agent, driver: str) -> RunResult:
    """Run ``agent`` to the end on the sync or the async driver."""
    if driver == "sync":
        return agent.run("where?")
    return asyncio.run(agent.arun("where?"))


def stopped(agent: Agent, driver: str) -> RunResult:
    """Run ``agent`` expecting a stop; the stop's result."""
    with pytest.raises(AgentLoopError) as caught:
        finish(agent, driver)
    return caught.value.result


# --- the schema's references ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "$ref": "#"},
        {
            "type": "object",
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"type": "object"}, {"$ref": "#/$defs/a"}]}},
            "properties": {"p": {"$ref": "#/$defs/a"}},
        },
        {"type": "object", "anyOf": [{"required": ["x"]}, {"not": {"$ref": "#"}}]},
    ],
    ids=["itself", "through_allof", "through_anyof_not"],
)
def test_a_ref_loop_without_a_step_into_the_answer_is_refused_when_the_agent_is_built(schema: Any) -> None:
    """A $ref cycle through no properties/items (validation would never end) is a ValueError naming the loop."""
    with pytest.raises(ValueError, match=r"\$ref loop .* never ends"):
        Agent(FakeModel(), ToolRegistry(), output_type=schema)


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("https://example.com/x.json", "not in the schema itself"),
        ("#/$defs/missing", "points at nothing"),
        ("#nowhere", "anchor"),
        ("#/properties/p/type", "not a schema"),
    ],
    ids=["remote", "missing", "no_anchor", "not_a_schema"],
)
def test_a_ref_the_schema_cannot_resolve_itself_is_refused_when_the_agent_is_built(ref: str, why: str) -> None:
    """A remote, dangling or non-schema $ref is a ValueError naming the reference, not a referencing error later."""
    schema = {"type": "object", "properties": {"p": {"type": "string"}, "q": {"$ref": ref}}}
    with pytest.raises(ValueError, match=rf"\$ref {re.escape(repr(ref))} at properties\.q\b.*{why}"):
        Agent(FakeModel(), ToolRegistry(), output_type=schema)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_schema_recursive_through_its_properties_is_accepted_and_checks_every_level(driver: str) -> None:
    """A tree node whose children are nodes is accepted; a bad node deep down is reported where it is."""
    good = '{"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}'
    bad = '{"name": "a", "children": [{"name": "b", "children": [{"nom": "c"}]}]}'
    model = FakeModel(reply(bad), reply(good))
    result = finish(Agent(model, ToolRegistry(), output_type=TREE), driver)
    assert result.output["children"][0]["children"] == [{"name": "c"}]
    assert "children[0].children[0]: 'name' is a required property" in model.seen[1][-1].content


# --- the answer's depth and numbers -----------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("kind", [POINT, PointModel], ids=["json_schema", "pydantic"])
@pytest.mark.parametrize("depth", [150, 100_000])
def test_an_answer_nested_past_the_limit_is_an_invalid_answer(depth: int, kind: Any, driver: str) -> None:
    """An answer nested deeper than tool arguments may be is output_invalid with the limit named, not RecursionError."""
    answer = '{"x": ' + "[" * depth + "]" * depth + ', "y": 1}'
    agent = Agent(FakeModel(reply(answer)), ToolRegistry(), output_type=kind, output_retries=0)
    result = stopped(agent, driver)
    assert result.reason == "output_invalid"
    assert result.evidence["errors"] == ["the answer nests deeper than 100 levels of objects and arrays"]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("kind", [NUMBER, PointModel], ids=["json_schema", "pydantic"])
@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_json_cannot_hold_is_an_invalid_answer(number: str, kind: Any, driver: str) -> None:
    """NaN, Infinity and a number too large for a double are refused like any answer that is not JSON."""
    model = FakeModel(reply(f'{{"x": {number}, "y": 1}}'), reply('{"x": 2, "y": 1}'))
    result = finish(Agent(model, ToolRegistry(), output_type=kind), driver)
    assert edges(result).count("Dispatch->AwaitModel[output_invalid]") == 1
    assert f"the answer is not JSON (the number {number} is not finite" in model.seen[1][-1].content


# --- what a validator returns -----------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("returned", [42, None])
@pytest.mark.parametrize(
    ("kind", "expected"),
    [(POINT, "a dict"), (PointModel, "a PointModel"), (PointClass, "a PointClass"), (str, "a str")],
    ids=["json_schema", "pydantic", "dataclass", "str"],
)
def test_a_validator_returning_a_value_of_another_type_stops_the_run(
    kind: Any, expected: str, returned: Any, driver: str
) -> None:
    """A validator's value must be of the output type: another is a broken validator, output_invalid, not retried."""

    def careless(value: Any) -> Any:
        return returned

    model = FakeModel(reply('{"x": 1, "y": 2}'), reply('{"x": 1, "y": 2}'))
    result = stopped(Agent(model, ToolRegistry(), output_type=kind, output_validators=[careless]), driver)
    assert result.reason == "output_invalid"
    assert result.evidence["retryable"] is False
    assert result.evidence["errors"] == [
        f"output validator careless returned {type(returned).__name__} {returned!r}, expected {expected}"
    ]
    assert len(model.seen) == 1


# --- the check's time -------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_validator_that_hangs_is_cut_at_the_runs_timeout(driver: str) -> None:
    """Dispatch->Failed[timeout] on expired: a validator still running at the deadline is abandoned, within 10 s."""
    release = threading.Event()

    def hangs(value: Any) -> Any:
        release.wait(20)
        return value

    model = FakeModel(reply('{"x": 1, "y": 2}'))
    agent = Agent(model, ToolRegistry(), output_type=POINT, output_validators=[hangs], timeout=0.5)
    started = time.monotonic()
    try:
        result = stopped(agent, driver)
    finally:
        release.set()
    assert time.monotonic() - started < 10  # measured: about 0.5 s
    assert result.reason == "timeout"
    assert result.trace[-1].trigger == "expired"
    assert edges(result)[-1] == "Dispatch->Failed[timeout]"
    assert result.messages[-1].content == '{"x": 1, "y": 2}'  # kept, unchecked: a resume with more time checks it


def test_a_sync_validator_does_not_block_the_async_drivers_event_loop() -> None:
    """Without a timeout, a sync validator runs off the loop: a task on the same loop runs while it waits."""
    ticked = threading.Event()

    def waits_for_the_loop(value: Any) -> Any:
        assert ticked.wait(10), "the event loop did not run while the validator waited"
        return value

    async def tick() -> None:
        for _ in range(3):
            await asyncio.sleep(0.01)
        ticked.set()

    async def main() -> RunResult:
        agent = Agent(FakeModel(reply("ok")), ToolRegistry(), output_type=str, output_validators=[waits_for_the_loop])
        ticker = asyncio.ensure_future(tick())
        result = await agent.arun("q")
        await ticker
        return result

    assert asyncio.run(main()).output == "ok"


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_schema_pattern_that_backtracks_gives_up_and_the_answer_is_invalid(driver: str) -> None:
    """`^(a|a)*$` against 40 a's and a '!': the match gives up after PATTERN_SECONDS; the model is asked again."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|a)*$"}}, "required": ["s"]}
    bad = '{"s": "' + "a" * 40 + '!"}'
    model = FakeModel(reply(bad), reply('{"s": "aaa"}'))
    agent = Agent(model, ToolRegistry(), output_type=schema)
    started = time.monotonic()
    result = finish(agent, driver)
    assert time.monotonic() - started < 30  # measured: about PATTERN_SECONDS (2 s); re alone takes hours
    assert result.output == {"s": "aaa"}
    assert "it backtracks" in model.seen[1][-1].content
    assert edges(result)[:4] == [
        "AwaitModel->CheckTruncation",
        "CheckTruncation->Dispatch",
        "Dispatch->AwaitModel[output_invalid]",
        "AwaitModel->CheckTruncation",
    ]


def test_a_schema_pattern_still_matches_and_refuses_as_json_schema_says() -> None:
    """The bounded matcher searches like JSON Schema's `pattern`: anywhere in the string, unless anchored."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "b+"}}, "required": ["s"]}
    model = FakeModel(reply('{"s": "xyz"}'), reply('{"s": "abba"}'))
    result = Agent(model, ToolRegistry(), output_type=schema).run("go")
    assert result.output == {"s": "abba"}
    assert "'xyz' does not match 'b+'" in model.seen[1][-1].content
