"""A tool call's arguments are encoded once: the reply's check, the ``repeated_action`` guard and the ledger share it.

``ToolCall.canonical_arguments`` keeps the sorted-key JSON text on the call
(docs/speed.md): the check that they are JSON at all, the guard comparing a
call with the one before, and the ledger recording the executed call's
signature read it.  The identity a call had before is kept: key order does
not matter, and arguments whose keys do not sort still have one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import fsm_agent.records
from fsm_agent import Agent, AgentLoopError, ToolCall, ToolRegistry
from fsm_agent.records import plain
from fsm_agent.testing import FakeModel, reply, tool_turn


def _counting_registry(ran: list[dict[Any, Any]]) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    def note(data: dict[str, Any]) -> str:
        """Note what it was given."""
        ran.append(data)
        return "noted"

    return registry


def _drive(agent: Agent, driver: str) -> Any:
    return agent.run("go") if driver == "sync" else asyncio.run(agent.arun("go"))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_each_calls_arguments_are_encoded_once_in_a_run(driver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight tool turns, one encoding each (the check, the guard and the ledger each encoded them before)."""
    encoded: list[object] = []
    encode = fsm_agent.records._canonical

    def counting(value: object) -> str:
        encoded.append(value)
        return encode(value)

    monkeypatch.setattr(fsm_agent.records, "_canonical", counting)
    ran: list[dict[Any, Any]] = []
    turns = [tool_turn(ToolCall(f"c{i}", "note", {"data": {"n": i, "a": "x"}})) for i in range(8)]
    result = _drive(Agent(FakeModel(*turns, reply("done")), _counting_registry(ran), max_steps=9), driver)
    assert result.final == "done"
    assert ran == [{"n": i, "a": "x"} for i in range(8)]
    assert encoded == [{"data": {"n": i, "a": "x"}} for i in range(8)]


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize(
    ("first", "again"),
    [({"a": 1, "b": 2}, {"b": 2, "a": 1}), ({"a": 1, 2: "b"}, {"a": 1, 2: "b"})],
    ids=["keys in another order", "keys that do not sort (identified by repr)"],
)
def test_dispatch_failed_repeated_action_still_knows_the_same_call(
    driver: str, first: dict[Any, Any], again: dict[Any, Any]
) -> None:
    """``Dispatch->Failed[repeated_action]``: the second call is not made; the tool ran once."""
    ran: list[dict[Any, Any]] = []
    calls = ToolCall("c1", "note", {"data": first}), ToolCall("c2", "note", {"data": again})
    model = FakeModel(tool_turn(calls[0]), tool_turn(calls[1]), reply("x"))
    with pytest.raises(AgentLoopError) as info:
        _drive(Agent(model, _counting_registry(ran)), driver)
    assert info.value.reason == "repeated_action"
    assert info.value.evidence["tool_call_id"] == "c2"
    assert len(ran) == 1


def test_the_kept_encoding_is_no_part_of_the_record() -> None:
    """Read or not, the call compares, prints and turns into data as its four fields."""
    read, unread = ToolCall("c1", "note", {"b": 1, "a": 2}), ToolCall("c1", "note", {"b": 1, "a": 2})
    assert read.canonical_arguments == '{"a": 2, "b": 1}'
    assert read == unread
    assert repr(read) == repr(unread)
    assert (
        plain(read)
        == plain(unread)
        == {"id": "c1", "name": "note", "arguments": {"b": 1, "a": 2}, "raw_arguments": None}
    )
