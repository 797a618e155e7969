"""A turn's run as AG-UI events: a step per state, tool calls and results, streamed text, sub-agents, counters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient
from support.agui_apps import STREAMED, outline, post, run_input, scenario_app

from fsm_agent import Agent
from fsm_agent.testing import FakeModel, demo_registry, reply


@pytest.fixture
def client() -> Iterator[TestClient]:
    """A client of the app serving every scenario."""
    served, _ = scenario_app()
    with TestClient(served) as test_client:
        yield test_client


def test_a_tool_run_shows_each_state_as_a_step_and_the_call_between_ask_and_result(client: TestClient) -> None:
    """The model's call is announced in AwaitModel, its result in ExecuteTool, the answer last; steps pair up."""
    events = post(client, run_input("t-tool", "tool"))
    assert outline(events) == [
        "RUN_STARTED",
        "STEP_STARTED AwaitModel",
        "TOOL_CALL_START add",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "STEP_FINISHED AwaitModel",
        "STEP_STARTED CheckTruncation",
        "STEP_FINISHED CheckTruncation",
        "STEP_STARTED Dispatch",
        "STEP_FINISHED Dispatch",
        "STEP_STARTED ExecuteTool",
        "TOOL_CALL_RESULT",
        "STEP_FINISHED ExecuteTool",
        "STEP_STARTED AwaitModel",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED AwaitModel",
        "STEP_STARTED CheckTruncation",
        "STEP_FINISHED CheckTruncation",
        "STEP_STARTED Dispatch",
        "STEP_FINISHED Dispatch",
        "STEP_STARTED Done",
        "STEP_FINISHED Done",
        "RUN_FINISHED",
    ]
    by_type = {e["type"]: e for e in events}
    assert by_type["RUN_STARTED"] == {
        "type": "RUN_STARTED",
        "threadId": "t-tool",
        "runId": "r1",
        "protocolVersion": "1.0",
    }
    start, args = by_type["TOOL_CALL_START"], by_type["TOOL_CALL_ARGS"]
    assert (start["toolCallId"], args["delta"]) == ("c1", '{"a": 2, "b": 3}')
    assert by_type["TOOL_CALL_RESULT"]["content"] == "5"
    assert by_type["TOOL_CALL_RESULT"]["toolCallId"] == "c1"
    assert by_type["TEXT_MESSAGE_CONTENT"]["delta"] == "2 + 3 = 5"
    assert by_type["TEXT_MESSAGE_START"]["messageId"] != start["parentMessageId"]  # two replies, two messages
    finished = by_type["RUN_FINISHED"]
    assert finished["outcome"] == {"type": "success"}
    assert finished["result"] == "2 + 3 = 5"
    assert finished["usage"] == [{"inputTokens": 30, "outputTokens": 5, "totalTokens": 35}]


def test_the_counters_arrive_as_state_after_every_transition(client: TestClient) -> None:
    """Each transition is followed by a STATE_SNAPSHOT of the run's counters; the last says Done, 2 steps, 1 call."""
    events = post(client, run_input("t-state", "tool"))
    snapshots = [e["snapshot"] for e in events if e["type"] == "STATE_SNAPSHOT"]
    assert [s["state"] for s in snapshots] == [
        "CheckTruncation", "Dispatch", "ExecuteTool", "AwaitModel", "CheckTruncation", "Dispatch", "Done",
    ]  # fmt: skip
    last = snapshots[-1]
    assert last["run_id"] == "t-state/1"  # the session's first turn
    assert last["counters"]["steps"] == [2, 8]
    assert last["counters"]["tool_calls"][0] == 1
    assert last["counters"]["tokens"][0] == 35


def test_a_streamed_answer_arrives_in_pieces_inside_its_step_and_is_not_sent_twice(client: TestClient) -> None:
    """The reply's text streams as several CONTENT events in AwaitModel, closed before the step ends; once only."""
    events = post(client, run_input("t-stream", "stream"))
    kinds = outline(events)
    contents = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert len(contents) > 3
    assert "".join(contents) == STREAMED
    assert kinds.count("TEXT_MESSAGE_START") == 1
    assert kinds.count("TEXT_MESSAGE_END") == 1
    first, end = kinds.index("TEXT_MESSAGE_START"), kinds.index("TEXT_MESSAGE_END")
    assert kinds[first - 1] == "STEP_STARTED AwaitModel"
    assert kinds[end + 1] == "STEP_FINISHED AwaitModel"
    ids = {e["messageId"] for e in events if e["type"].startswith("TEXT_MESSAGE")}
    assert len(ids) == 1
    assert events[-1]["result"] == STREAMED


def test_a_sub_agent_runs_between_its_start_and_finish_with_its_steps_attributed_to_it(client: TestClient) -> None:
    """SUBAGENT_STARTED names the tool and call; the child's steps and calls carry its run id; it finishes first."""
    events = post(client, run_input("t-sub", "subagent"))
    started = next(e for e in events if e["type"] == "SUBAGENT_STARTED")
    child = "t-sub/1/h1"
    assert started == {
        "type": "SUBAGENT_STARTED",
        "subagentRunId": child,
        "name": "helper",
        "description": "Asks the helper agent.",
        "parentToolCallId": "h1",
        "parentMessageId": "r1:reply-1",
    }
    first = events.index(started)
    finished = next(i for i, e in enumerate(events) if e["type"] == "SUBAGENT_FINISHED")
    inside = events[first + 1 : finished]
    assert {e.get("subagentRunId") for e in inside} == {child}
    assert [e["stepName"] for e in inside if e["type"] == "STEP_STARTED"] == [
        "AwaitModel", "CheckTruncation", "Dispatch", "ExecuteTool", "AwaitModel", "CheckTruncation", "Dispatch", "Done",
    ]  # fmt: skip
    assert [e["toolCallName"] for e in inside if e["type"] == "TOOL_CALL_START"] == ["echo"]
    assert events[finished]["result"] == '"inner done"'
    result = events[finished + 1]
    assert (result["type"], result["toolCallId"], result.get("subagentRunId")) == ("TOOL_CALL_RESULT", "h1", None)
    assert not any(e["type"] == "STATE_SNAPSHOT" and e.get("subagentRunId") for e in events)
    assert events[-1]["result"] == "the helper said so"


def test_an_agent_that_served_an_earlier_request_is_refused() -> None:
    """A factory handing out one agent for every request gets RUN_ERROR on the second: its hooks cannot come off."""
    shared = Agent(FakeModel(reply("one"), reply("two")), demo_registry())
    served, _ = scenario_app()
    served.agent_factory = lambda _: shared
    with TestClient(served) as test_client:
        assert post(test_client, run_input("t-a", "tool"))[-1]["type"] == "RUN_FINISHED"
        again = post(test_client, run_input("t-b", "tool"))
    assert [e["type"] for e in again] == ["RUN_STARTED", "RUN_ERROR"]
    assert again[-1]["code"] == "ValueError"
    assert "build a fresh Agent" in again[-1]["message"]
