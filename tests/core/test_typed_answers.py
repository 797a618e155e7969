"""Typed answers: the final answer checked at Dispatch, sent back on the output_invalid edge, then Failed.

Every behaviour runs on both drivers with the same scripts, and counts the
model calls the script served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest
from support.scenarios import POINT
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from fsm_agent import (
    Agent,
    AgentLoopError,
    OutputSchema,
    Retry,
    RunResult,
    SqliteStore,
    StopCondition,
    ToolRegistry,
)
from fsm_agent.testing import FakeModel, demo_registry, edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class PointModel(pydantic.BaseModel):
    """A point given by a pydantic model."""

    x: int
    y: int


@dataclasses.dataclass
class PointClass:
    x: int
    y: int


class PointDict(TypedDict):
    x: int
    y: int


def finish(agent: Agent, driver: str, question: str = "where?") -> RunResult:
    """Run ``agent`` to the end on the sync or the async driver."""
    if driver == "sync":
        return agent.run(question)
    return asyncio.run(agent.arun(question))


def stopped(agent: Agent, driver: str) -> RunResult:
    """Run ``agent`` expecting a stop; the stop's result."""
    with pytest.raises(AgentLoopError) as caught:
        finish(agent, driver)
    return caught.value.result


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (PointModel, PointModel(x=1, y=2)),
        (PointClass, PointClass(1, 2)),
        (PointDict, {"x": 1, "y": 2}),
        (POINT, {"x": 1, "y": 2}),
        (str, '{"x": 1, "y": 2}'),
    ],
    ids=["pydantic", "dataclass", "typeddict", "json_schema", "str"],
)
def test_each_kind_of_output_type_gives_its_value_as_the_output(kind: Any, expected: Any, driver: str) -> None:
    """A valid answer ends in Done and RunResult.output holds it as the output type's value."""
    model = FakeModel(reply('{"x": 1, "y": 2}'))
    result = finish(Agent(model, ToolRegistry(), output_type=kind), driver)
    assert result.output == expected
    assert type(result.output) is type(expected)
    assert result.final == '{"x": 1, "y": 2}'
    assert edges(result)[-1] == "Dispatch->Done[has_no_tool_calls]"
    assert len(model.seen) == 1


@pytest.mark.parametrize("kind", [PointModel, PointClass], ids=["pydantic", "dataclass"])
def test_a_typed_result_goes_to_json_without_its_output_and_reads_back_equal(kind: Any) -> None:
    """to_dict() leaves ``output`` out (any Python value); the JSON round trip keeps ``final``, which it came from."""
    result = finish(Agent(FakeModel(reply('{"x": 1, "y": 2}')), ToolRegistry(), output_type=kind), "sync")
    assert "output" not in result.to_dict()
    again = RunResult.from_json(result.to_json())
    assert again == result
    assert (again.final, again.output) == ('{"x": 1, "y": 2}', None)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    "kind", [PointModel, PointClass, PointDict, POINT], ids=["pydantic", "dataclass", "typeddict", "json_schema"]
)
def test_dispatch_to_await_model_output_invalid_sends_the_errors_as_the_next_message(kind: Any, driver: str) -> None:
    """Dispatch->AwaitModel[output_invalid]: the model is shown what was wrong, and its next answer is the output."""
    model = FakeModel(reply('{"x": 1}'), reply('{"x": 1, "y": 2}'))
    result = finish(Agent(model, ToolRegistry(), output_type=kind), driver)
    assert edges(result)[2] == "Dispatch->AwaitModel[output_invalid]"
    assert result.ok
    assert len(model.seen) == 2
    retry = model.seen[1][-1]
    assert retry.role == "user"
    assert "y" in retry.content
    assert "required" in retry.content.lower()
    assert '"required": ["x", "y"]' in retry.content  # the schema to answer with
    assert [step.kind for step in result.steps] == ["output_invalid", "final"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_dispatch_to_failed_output_invalid_holds_the_errors_and_the_last_answer(driver: str) -> None:
    """Dispatch->Failed[output_invalid]: once the retries are spent, the run stops with the errors as evidence."""
    model = FakeModel(reply("not json"), reply('{"x": "one", "y": 2}'), reply("unused"))
    result = stopped(Agent(model, ToolRegistry(), output_type=POINT), driver)
    assert edges(result)[-1] == "Dispatch->Failed[output_invalid]"
    assert result.reason == "output_invalid"
    assert result.final == '{"x": "one", "y": 2}'
    assert result.output is None
    assert result.evidence["errors"] == ["x: 'one' is not of type 'integer'"]
    assert result.evidence["answer"] == '{"x": "one", "y": 2}'
    assert (result.evidence["retries"], result.evidence["limit"]) == (1, 1)
    assert "blocked_by" not in result.evidence
    assert len(model.seen) == 2


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("retries", [0, 1, 3])
def test_output_retries_bounds_the_answers_sent_back(retries: int, driver: str) -> None:
    """At most output_retries answers go back: the model is called output_retries + 1 times, then the run stops."""
    model = FakeModel([reply("[]")] * 10)
    result = stopped(Agent(model, ToolRegistry(), output_type=POINT, output_retries=retries, max_steps=20), driver)
    assert len(model.seen) == retries + 1
    assert edges(result).count("Dispatch->AwaitModel[output_invalid]") == retries
    assert result.evidence["retries"] == retries


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_limit_that_forbids_the_next_model_call_stops_the_retry_and_says_so(driver: str) -> None:
    """With max_steps spent, an invalid answer is not sent back: Failed[output_invalid], blocked_by max_steps."""
    model = FakeModel(tool_turn(tool_call("echo", text="a")), reply("{}"), reply('{"x": 1, "y": 2}'))
    result = stopped(Agent(model, demo_registry(), output_type=POINT, max_steps=2), driver)
    assert result.reason == "output_invalid"
    assert result.evidence["blocked_by"] == "max_steps"
    assert len(model.seen) == 2


@pytest.mark.parametrize("driver", DRIVERS)
def test_validators_may_change_the_value_or_send_the_model_back_with_retry(driver: str) -> None:
    """A sync and an async validator run in order; Retry("why") takes the output_invalid edge with that message."""
    seen: list[int] = []

    def positive(point: dict[str, int]) -> dict[str, int]:
        seen.append(point["x"])
        if point["x"] <= 0:
            raise Retry("x must be positive")
        return point

    async def labelled(point: dict[str, int]) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {**point, "label": f"({point['x']}, {point['y']})"}

    model = FakeModel(reply('{"x": 0, "y": 2}'), reply('{"x": 3, "y": 2}'))
    agent = Agent(model, ToolRegistry(), output_type=POINT, output_validators=[positive, labelled])
    result = finish(agent, driver)
    assert result.output == {"x": 3, "y": 2, "label": "(3, 2)"}
    assert seen == [0, 3]
    assert "- x must be positive" in model.seen[1][-1].content
    assert edges(result).count("Dispatch->AwaitModel[output_invalid]") == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_async_validator_takes_effect_on_both_drivers(driver: str) -> None:
    """An async validator's Retry and its returned value count on the sync driver too: it is awaited, not dropped."""
    calls: list[str] = []

    async def refuse_first(text: str) -> str:
        calls.append(text)
        await asyncio.sleep(0)
        if len(calls) == 1:
            raise Retry("say it in capitals")
        return text.upper()

    model = FakeModel(reply("paris"), reply("Paris"))
    result = finish(Agent(model, ToolRegistry(), output_type=str, output_validators=[refuse_first]), driver)
    assert (result.output, calls) == ("PARIS", ["paris", "Paris"])
    assert "say it in capitals" in model.seen[1][-1].content


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_validator_that_breaks_stops_the_run_at_once_with_what_it_raised(driver: str) -> None:
    """A validator raising anything but Retry is not retried: asking the model again cannot mend it."""

    def broken(point: dict[str, int]) -> dict[str, int]:
        raise KeyError("z")

    model = FakeModel(reply('{"x": 1, "y": 2}'), reply('{"x": 1, "y": 2}'))
    result = stopped(Agent(model, ToolRegistry(), output_type=POINT, output_validators=[broken]), driver)
    assert result.reason == "output_invalid"
    assert result.evidence["retryable"] is False
    assert result.evidence["errors"] == ["output validator broken raised KeyError: 'z'"]
    assert len(model.seen) == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_tool_turns_come_before_the_typed_answer_and_each_tool_runs_once(driver: str) -> None:
    """Only a reply without tool calls is checked; tools run as usual, once each, across a retry."""
    ran: list[str] = []
    registry = ToolRegistry()

    @registry.register
    def locate(city: str) -> dict[str, int]:
        """Where ``city`` is."""
        ran.append(city)
        return {"x": 4, "y": 5}

    model = FakeModel(tool_turn(tool_call("locate", city="Oslo")), reply("x=4, y=5"), reply('{"x": 4, "y": 5}'))
    result = finish(Agent(model, registry, output_type=PointModel), driver)
    assert result.output == PointModel(x=4, y=5)
    assert ran == ["Oslo"]
    assert edges(result).count("Dispatch->ExecuteTool") == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_model_is_given_the_schema_with_every_call_including_the_retry(driver: str) -> None:
    """A model whose complete takes output= receives the OutputSchema built from the output type."""
    model = FakeModel(reply("{}"), reply('{"x": 1, "y": 2}'))
    finish(Agent(model, ToolRegistry(), output_type=PointModel), driver)
    expected = OutputSchema("PointModel", PointModel.model_json_schema(), "A point given by a pydantic model.")
    assert model.outputs_seen == [expected, expected]


def test_a_model_without_the_output_keyword_is_called_as_before() -> None:
    """A model whose complete(messages, tools) takes no output keyword still serves a typed agent."""

    class Plain:
        def __init__(self) -> None:
            self.calls = 0

        def complete(self, messages: Any, tools: Any) -> Any:
            self.calls += 1
            return reply('{"x": 1, "y": 2}')

    plain = Plain()
    assert Agent(plain, ToolRegistry(), output_type=POINT).run("q").output == {"x": 1, "y": 2}
    assert plain.calls == 1


def test_a_schema_is_strict_only_when_every_object_closes_and_requires_all_its_properties() -> None:
    """OutputSchema.strict is true for a closed, fully required schema, false for one with optional fields."""
    closed = Agent(FakeModel(), ToolRegistry(), output_type=POINT).output
    loose = Agent(FakeModel(), ToolRegistry(), output_type=PointModel).output
    assert closed is not None
    assert loose is not None
    assert closed.request is not None
    assert loose.request is not None
    assert (closed.request.strict, loose.request.strict) == (True, False)


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_answer_in_a_code_fence_is_read_without_the_fence(driver: str) -> None:
    """Models without a JSON mode often fence their JSON; one surrounding fence is not an error."""
    model = FakeModel(reply('```json\n{"x": 1, "y": 2}\n```'))
    assert finish(Agent(model, ToolRegistry(), output_type=POINT), driver).output == {"x": 1, "y": 2}


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_answer_guardrail_sees_the_validated_output(driver: str) -> None:
    """An "answer" guardrail is checked after the output check, on the validated value (view.output)."""

    def far(view: Any) -> bool:
        return view.output.x > 100

    guard = StopCondition("too_far", "answer", far)
    model = FakeModel(reply('{"x": 101, "y": 0}'))
    result = stopped(Agent(model, ToolRegistry(), output_type=PointModel, stop_conditions=[guard]), driver)
    assert edges(result)[-1] == "Dispatch->Failed[too_far]"
    assert result.output is None


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_invalid_finalize_answer_cannot_be_retried_and_the_stop_that_asked_for_it_stands(driver: str) -> None:
    """A finalize answer that is not valid takes Failed[output_invalid]; the run's reason stays max_steps."""
    model = FakeModel(tool_turn(tool_call("echo", text="a")), reply("no json"), reply("unused"))
    agent = Agent(model, demo_registry(), output_type=POINT, max_steps=1, on_stop={"max_steps": "finalize"})
    result = stopped(agent, driver)
    assert result.reason == "max_steps"
    assert result.evidence["finalize"]["outcome"] == "output_invalid"
    assert result.evidence["finalize"]["blocked_by"] == "max_steps"
    assert len(model.seen) == 2


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_resumed_run_keeps_the_retries_it_already_took(driver: str) -> None:
    """Cut after the retry edge and resumed from its snapshot, the run does not get its retries again."""
    script = [reply("{}"), reply("[]"), reply('{"x": 1, "y": 2}')]
    model = FakeModel(script)
    agent = Agent(model, ToolRegistry(), output_type=POINT)
    run = agent.start("where?")
    while not run.trace or run.trace[-1].guard != "output_invalid":
        run.advance()
    again = Agent(FakeModel(script[1:]), ToolRegistry(), output_type=POINT).resume(run.snapshot())
    with pytest.raises(AgentLoopError) as caught:
        again.finish() if driver == "sync" else asyncio.run(again.afinish())
    result = caught.value.result
    assert (result.reason, result.evidence["retries"]) == ("output_invalid", 1)
    assert len(model.seen) == 1


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"output_type": int}, TypeError, "output_type must be a pydantic model, a dataclass"),
        ({"output_type": POINT, "output_retries": -1}, ValueError, "output_retries must be an integer >= 0"),
        ({"output_type": POINT, "output_retries": True}, ValueError, "output_retries must be an integer >= 0"),
        ({"output_validators": [str.strip]}, ValueError, "output_validators need an output_type"),
        ({"output_type": str, "output_validators": ["upper"]}, TypeError, "output_validators must hold callables"),
        ({"output_type": {"type": "object", "properties": 3}}, ValueError, "output_type is not a valid JSON Schema"),
        ({"output_type": {"type": "array"}}, ValueError, "must describe an object"),
    ],
    ids=["int", "negative_retries", "bool_retries", "validators_alone", "not_callable", "bad_schema", "array"],
)
def test_bad_output_settings_are_refused_when_the_agent_is_built(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    """Each mistake in the output settings is a clear error at Agent(...), before any run."""
    with pytest.raises(error, match=message):
        Agent(FakeModel(), ToolRegistry(), **options)


def test_the_agent_keeps_its_own_copy_of_a_json_schema() -> None:
    """Changing the caller's schema dict afterwards changes neither the schema sent nor the check."""
    schema = json.loads(json.dumps(POINT))
    agent = Agent(FakeModel(reply('{"x": 1, "y": 2}')), ToolRegistry(), output_type=schema)
    schema["required"] = ["z"]
    assert agent.output is not None
    assert agent.output.request is not None
    assert agent.output.request.schema["required"] == ["x", "y"]
    assert agent.run("q").output == {"x": 1, "y": 2}


@pytest.mark.subprocess
def test_importing_fsm_agent_loads_neither_pydantic_nor_jsonschema() -> None:
    """The output extra is imported only by an agent whose output_type needs it."""
    code = "import sys, fsm_agent; print(sorted(m for m in ('pydantic', 'jsonschema') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_viewer_shows_the_answer_sent_back_on_its_own_edge(tmp_path: Path) -> None:
    """In the replay, the output_invalid edge brings the retry message and its step's counters."""
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")
    from fsm_agent.ui import moments

    model = FakeModel(reply("{}"), reply('{"x": 1, "y": 2}'))
    with SqliteStore(tmp_path / "runs.db") as store:
        Agent(model, ToolRegistry(), output_type=POINT).run("where?", store=store, run_id="typed")
        data = store.load("typed")
    (back,) = [m for m in moments(data) if m["guard"] == "output_invalid"]
    start, end = back["messages"]
    assert [message["role"] for message in data["messages"][start:end]] == ["user"]
    assert data["messages"][start]["content"].startswith("Your final answer was not accepted")
    assert back["counted_from"] == "after the answer was sent back"
    ranges = [m["messages"] for m in moments(data)]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("edge", ["Dispatch->AwaitModel[output_invalid]", "Dispatch->Failed[output_invalid]"])
def test_each_output_check_edge_is_taken_alike_by_both_drivers(edge: str, driver: str) -> None:
    """The same script takes the same edge out of Dispatch on the sync and on the async driver."""
    retries = 1 if "AwaitModel" in edge else 0
    model = FakeModel(reply("{}"), reply('{"x": 1, "y": 2}'))
    agent = Agent(
        model, ToolRegistry(), output_type=POINT, output_retries=retries, on_stop={"output_invalid": "return"}
    )
    result = finish(agent, driver)
    assert edges(result)[2] == edge
    assert len(model.seen) == retries + 1
