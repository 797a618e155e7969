"""A finished typed run read back has the output its run returned, its validators not run again.

conversations.md: the same request again "takes no turn and calls
nothing: it gets that turn's result, as it was given"; batch.md: a run
that had ended is returned as stored; typed-answers.md: a validator may be
a paid model call of its own.  The snapshot keeps the accepted value in
JSON form (its ``output`` field) and a read back parses it with the output
type, without the validators.  Each validator here counts its calls and
gives another verdict the second time, as a second opinion may.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import Counter
from typing import Any

import pydantic
import pytest

from fsm_agent import Agent, Message, ModelResponse, Retry, Session, ToolRegistry
from fsm_agent.batch import run_batch
from fsm_agent.drivers.read_back import stored_result
from fsm_agent.persist import open_store
from fsm_agent.testing import reply


class Answer(pydantic.BaseModel):
    n: int
    label: str = ""


@dataclasses.dataclass
class Pair:
    n: int
    label: str = ""


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "label": {"type": "string"}}, "required": ["n"]}


class Model:
    def __init__(self, text: str, counts: Counter[str]) -> None:
        self.text, self.counts = text, counts

    def complete(self, messages: list[Message], tools: Any) -> ModelResponse:
        self.counts["model"] += 1
        return reply(self.text)


def labelled(output_type: Any, counts: Counter[str]) -> Any:
    """A validator that labels the answer the first time and disagrees after: it must run once per answer."""

    def second_opinion(value: Any) -> Any:
        counts["validator"] += 1
        if counts["validator"] > 1:
            raise Retry("the second opinion disagrees")
        if output_type is str:
            return value + "!"
        if isinstance(value, dict):
            return {**value, "label": "checked"}
        return (
            dataclasses.replace(value, label="checked")
            if dataclasses.is_dataclass(value)
            else value.model_copy(update={"label": "checked"})
        )

    return second_opinion


KINDS = {
    "str": (str, "7", "7!"),
    "pydantic model": (Answer, '{"n": 7}', Answer(n=7, label="checked")),
    "dataclass": (Pair, '{"n": 7}', Pair(n=7, label="checked")),
    "JSON Schema": (SCHEMA, '{"n": 7}', {"n": 7, "label": "checked"}),
}


def typed_agent(kind: str, counts: Counter[str]) -> Agent:
    output_type, text, _ = KINDS[kind]
    return Agent(
        Model(text, counts), ToolRegistry(), output_type=output_type, output_validators=[labelled(output_type, counts)]
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_stored_finished_run_read_back_has_its_output_with_no_validator_run_again(
    store_target: str, kind: str
) -> None:
    counts: Counter[str] = Counter()
    agent = typed_agent(kind, counts)
    with open_store(store_target) as store:
        first = agent.run("q", store=store, run_id="r")
        again = stored_result(typed_agent(kind, counts), store.load("r"))
    assert first.output == again.output == KINDS[kind][2]
    assert counts == {"model": 1, "validator": 1}


class Aliased(pydantic.BaseModel):
    n: int = pydantic.Field(alias="N")
    label: str = ""


def test_a_field_read_by_its_alias_is_kept_by_its_alias_and_read_back_with_no_validator_run_again(
    store_target: str,
) -> None:
    counts: Counter[str] = Counter()

    def agent() -> Agent:
        validator = labelled(Aliased, counts)
        return Agent(Model('{"N": 7}', counts), ToolRegistry(), output_type=Aliased, output_validators=[validator])

    with open_store(store_target) as store:
        first = agent().run("q", store=store, run_id="r")
        again = stored_result(agent(), store.load("r"))
    assert first.output == again.output == Aliased(N=7, label="checked")
    assert counts == {"model": 1, "validator": 1}


class Doubling(pydantic.BaseModel):
    """A type whose own validator changes what it reads: read again, 14 would become 28."""

    n: int

    @pydantic.field_validator("n")
    @classmethod
    def doubled(cls, n: int) -> int:
        return n * 2


class Secret(pydantic.BaseModel):
    token: pydantic.SecretStr


class Ratio(pydantic.BaseModel):
    ratio: float | None = None


CLOSED = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}

UNKEPT = {
    # output type, the answer, what the (deterministic) validator makes of the value
    "a type's own validator": (Doubling, '{"n": 7}', lambda value: value),
    "a secret": (Secret, '{"token": "hunter2"}', lambda value: value),
    "NaN": (Ratio, '{"ratio": 0.5}', lambda value: value.model_copy(update={"ratio": float("nan")})),
    "a key the schema forbids": (CLOSED, '{"n": 7}', lambda value: {**value, "label": "x"}),
}


@pytest.mark.parametrize("kind", list(UNKEPT))
def test_a_value_its_type_would_not_read_back_as_it_was_is_kept_as_null_and_read_back_by_checking_the_text(
    tmp_path: Any, kind: str
) -> None:
    """snapshots.md: such a value is kept as null, and a read back checks the answer's text again: the output is
    what the run returned (a deterministic validator gives it again), never a value read back changed (28 for 14,
    a masked secret, a dropped key)."""
    output_type, text, validate = UNKEPT[kind]

    def agent() -> Agent:
        return Agent(Model(text, Counter()), ToolRegistry(), output_type=output_type, output_validators=[validate])

    with open_store(str(tmp_path / "runs.db")) as store:
        first = agent().run("q", store=store, run_id="r")
        data = store.load("r")
    assert data["output"] is None
    again = stored_result(agent(), data).output
    if kind == "NaN":  # NaN equals nothing, itself included
        assert math.isnan(again.ratio)
    else:
        assert again == first.output


def test_a_snapshot_kept_without_the_value_has_its_answer_checked_again(tmp_path: Any) -> None:
    """A snapshot written before the field existed (no ``output``): the answer's text is checked, as it was."""
    counts: Counter[str] = Counter()
    with open_store(str(tmp_path / "runs.db")) as store:
        typed_agent("str", counts).run("q", store=store, run_id="r")
        data = store.load("r")
    del data["output"]
    assert stored_result(typed_agent("str", Counter()), data).output == "7!"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_sessions_repeated_request_gets_the_turns_typed_output_and_runs_no_validator(
    store_target: str, driver: str
) -> None:
    counts: Counter[str] = Counter()
    with open_store(store_target) as store:

        def turn() -> Any:
            chat = Session(typed_agent("pydantic model", counts), store=store, session_id="s")
            if driver == "sync":
                return chat.run("q", request_id="req-1")
            return asyncio.run(chat.arun("q", request_id="req-1"))

        first, again = turn(), turn()
    assert first.output == again.output == Answer(n=7, label="checked")
    assert again.reason == "done"
    assert counts == {"model": 1, "validator": 1}


def test_a_batch_run_again_returns_its_finished_runs_typed_outputs_and_runs_no_validator(store_target: str) -> None:
    counts: Counter[str] = Counter()

    def batch() -> Any:
        return run_batch(
            lambda: typed_agent("str", counts), ["q"], store=store_target, executor="local", progress=False
        )

    first, again = batch(), batch()
    assert first[0].output == again[0].output == "7!"
    assert counts == {"model": 1, "validator": 1}
