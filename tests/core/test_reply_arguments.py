"""Tool arguments a model hands over that are not JSON are refused as the reply arrives, naming the part at fault."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, RunResult, ToolCall, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply


class Opaque:
    """Something no JSON encoder knows."""


NOT_JSON: dict[str, tuple[Any, str]] = {
    "bytes": ({"data": b"\x00\x01"}, "arguments['data'] is of type bytes"),
    "an object": ({"data": [1, {"deep": Opaque()}]}, "arguments['data'][1]['deep'] is of type Opaque"),
    "a set": ({"data": {1, 2}}, "arguments['data'] is of type set"),
    "a bytes key": ({"data": {b"k": "one"}}, "arguments['data'] has a key JSON cannot encode: b'k'"),
    "an object instead of a dict": (Opaque(), "arguments is of type Opaque"),
}


def _registry(ran: list[Any]) -> ToolRegistry:
    registry = ToolRegistry()

    def keep(data: Any = None) -> str:
        """Keep what it was given."""
        ran.append(data)
        return "kept"

    registry.register(keep)
    return registry


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize(("arguments", "where"), NOT_JSON.values(), ids=NOT_JSON)
def test_arguments_that_are_not_json_are_a_model_error_naming_the_part_and_the_run_is_stored(
    store_target: str, driver: str, arguments: Any, where: str
) -> None:
    """bytes, an object, a set, a bytes key: model_error naming it; no tool runs; store and to_json work."""
    call = ToolCall("c1", "keep", arguments)
    model = FakeModel(ModelResponse(Message("assistant", "", (call,)), "tool_use"), reply("done"))
    ran: list[Any] = []
    agent = Agent(model, _registry(ran))
    with open_store(store_target) as store, pytest.raises(AgentLoopError) as info:
        agent.run("go", store=store, run_id="r") if driver == "sync" else asyncio.run(
            agent.arun("go", store=store, run_id="r")
        )
    stop = info.value
    assert stop.reason == "model_error"
    assert f"tool call 'keep' (c1) has arguments that are not JSON: {where}" in stop.evidence["error"]
    assert ran == []
    assert RunResult.from_json(stop.result.to_json()).reason == "model_error"
    with open_store(store_target) as store:
        assert (store.load("r")["state"], store.load("r")["reason"]) == ("Failed", "model_error")


def test_json_arguments_of_every_kind_are_kept_as_they_were(store_target: str) -> None:
    """Strings, numbers, booleans, null, lists, tuples and nested objects are a normal call, stored as given."""
    arguments = {"data": {"text": "x", "n": 1, "f": 1.5, "yes": True, "none": None, "list": [1, "a"], "pair": (1, 2)}}
    model = FakeModel(
        ModelResponse(Message("assistant", "", (ToolCall("c1", "keep", arguments),)), "tool_use"), reply("ok")
    )
    ran: list[Any] = []
    with open_store(store_target) as store:
        result = Agent(model, _registry(ran)).run("go", store=store, run_id="r")
        stored = store.load("r")["messages"][1]["tool_calls"][0]["arguments"]
    assert result.final == "ok"
    assert ran == [arguments["data"]]
    assert stored == {"data": {**arguments["data"], "pair": [1, 2]}}
