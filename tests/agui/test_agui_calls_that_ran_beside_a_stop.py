"""AG-UI: the calls of a parallel batch that ran beside a mid-batch stop reach the client with their outcome.

docs/how-to/ag-ui.md maps "a tool's outcome" to ``TOOL_CALL_RESULT`` and a
sub-agent's run to ``SUBAGENT_STARTED`` ... ``SUBAGENT_FINISHED``.  The turn
is served on the async driver, so a batch's calls run at once: here two
failures stop the run (``tool_failures``) while a sub-agent's call and a
plain call beside them ran to their end (evidence ``also_ran``, heard by
``after_tool``).  The client must hear of each call that ran, once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from starlette.testclient import TestClient
from support.agui_apps import post, run_input
from support.counted_calls import Counted
from support.watch_audit import batch_stopped_beside_a_sub_agent

from fsm_agent import Agent
from fsm_agent.agui import app
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


@pytest.fixture(scope="module")
def served() -> tuple[list[dict[str, Any]], Counted]:
    """The events of one turn whose batch stopped beside a sub-agent's call, and what the tools ran."""
    tools = Counted()
    with TestClient(app(lambda _: batch_stopped_beside_a_sub_agent(tools.registry))) as client:
        return post(client, run_input("beside", "beside", text="q")), tools


def own(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind and "subagentRunId" not in e]


def test_the_turn_stops_with_the_calls_that_ran_beside_named(served: tuple[list[dict[str, Any]], Counted]) -> None:
    events, tools = served
    assert events[-1]["type"] == "RUN_FINISHED"
    stop = events[-1]["metadata"]["fsm_agent"]
    assert stop["reason"] == "tool_failures"
    assert stop["evidence"]["also_ran"] == ["h3", "q4"]
    assert tools.ran == Counter({"f1": 1, "f2": 1, "q4": 1})
    assert [e["toolCallId"] for e in own(events, "TOOL_CALL_START")] == ["f1", "f2", "h3", "q4"]


def test_each_recorded_call_has_one_result(served: tuple[list[dict[str, Any]], Counted]) -> None:
    """The calls the transitions recorded (the two failures) each reach the client once."""
    events, _ = served
    results = Counter(e["toolCallId"] for e in own(events, "TOOL_CALL_RESULT"))
    assert results["f1"] == results["f2"] == 1


def test_each_call_that_ran_beside_the_stop_reaches_the_client_finished_once(
    served: tuple[list[dict[str, Any]], Counted],
) -> None:
    events, _ = served
    results = Counter(e["toolCallId"] for e in own(events, "TOOL_CALL_RESULT"))
    assert results == Counter({"f1": 1, "f2": 1, "h3": 1, "q4": 1})
    ends = [(e["type"], e["subagentRunId"]) for e in events if e["type"] in {"SUBAGENT_FINISHED", "SUBAGENT_ERROR"}]
    assert ends == [("SUBAGENT_FINISHED", "beside/1/h3")]


def cut_beside_a_quick_call(tools: Counted) -> Agent:
    """Two calls in one turn: a sub-agent whose own call hangs, and ``quick``; the run's deadline cuts the batch."""
    tools.hang.add("s1")
    child = Agent(FakeModel(tool_turn(tool_call("slow", id="s1")), reply("never")), tools.registry)
    parent_tools = Counted()
    parent_tools.registry.register(child.as_tool("helper", "Helps."))
    calls = (tool_call("helper", id="h1", input="go"), tool_call("quick", id="q2", n=2))
    return Agent(
        FakeModel(tool_turn(*calls), reply("x")), parent_tools.registry, timeout=0.5, on_stop={"timeout": "return"}
    )


@pytest.mark.slow
def test_a_sub_agent_cut_beside_a_call_that_came_back_is_an_error_and_the_call_is_sent_once() -> None:
    """The call that came back before the cut reaches the client once; the sub-agent really cut is still an error."""
    tools = Counted()
    with TestClient(app(lambda _: cut_beside_a_quick_call(tools))) as client:
        events = post(client, run_input("cut", "cut", text="q"))
    assert events[-1]["metadata"]["fsm_agent"]["reason"] == "timeout"
    assert tools.ran == Counter({"s1": 1})
    results = Counter(e["toolCallId"] for e in own(events, "TOOL_CALL_RESULT"))
    assert results == Counter({"q2": 1})
    ends = [(e["type"], e["subagentRunId"]) for e in events if e["type"] in {"SUBAGENT_FINISHED", "SUBAGENT_ERROR"}]
    assert ends == [("SUBAGENT_ERROR", "cut/1/h1")]
