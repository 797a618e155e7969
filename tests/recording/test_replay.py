"""Replaying stored runs: an unchanged agent replays without a model or tool call, a changed one fails where it departs.

Every recording here is exported from a real store (SQLite, then
PostgreSQL), written by the sync or the async driver, with a sub-agent in
the run.  The agents count their model and tool calls, so "nothing was
called" is measured, not assumed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import attrs
import pytest

from fsm_agent import (
    Agent,
    AgentLoopError,
    ContextOverflowError,
    Message,
    ModelResponse,
    RunResult,
    ToolRegistry,
    Transition,
)
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn
from fsm_agent.testing.replay import ReplayDivergence, areplay, replay

ANSWER_SCHEMA = {"type": "object", "properties": {"sum": {"type": "number"}}, "required": ["sum"]}


class Counted:
    """The tools of the test agents, each counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def registry(self, *, add_doc: str = "Add two numbers.") -> ToolRegistry:
        registry = ToolRegistry()

        def add(a: float, b: float) -> float:
            self.calls += 1
            return a + b

        add.__doc__ = add_doc
        registry.register(add)
        return registry


def parent_agent(
    script: list[Any], child_script: list[Any], tools: Counted, **options: Any
) -> tuple[Agent, FakeModel, FakeModel]:
    """A parent agent with ``add`` and a ``research`` sub-agent; its model and the child's, to count their calls."""
    child_model = FakeModel(child_script)
    child = Agent(child_model, tools.registry(), system="You research.")
    registry = tools.registry(add_doc=options.pop("add_doc", "Add two numbers."))
    registry.register(child.as_tool("research", "Answers one research question."))
    options.setdefault("system", "You add.")
    model = FakeModel(script)
    return Agent(model, registry, **options), model, child_model


SCRIPT = [
    tool_turn(tool_call("research", id="r1", input="what is 1+2?")),
    tool_turn(tool_call("add", id="a1", a=1, b=2)),
    reply("3"),
]
CHILD_SCRIPT = [tool_turn(tool_call("add", id="c1", a=1, b=2)), reply("it is 3")]


def recorded(store_target: str, driver: str, **options: Any) -> tuple[dict[str, Any], RunResult]:
    """Run the parent agent (sub-agent included) into the store with ``driver``; its recording and result."""
    agent, _, _ = parent_agent(SCRIPT, CHILD_SCRIPT, Counted(), **options)
    with open_store(store_target) as store:
        if driver == "sync":
            result = agent.run("what is 1+2?", store=store, run_id="p1")
        else:
            result = asyncio.run(agent.arun("what is 1+2?", store=store, run_id="p1"))
        return store.export("p1"), result


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_unchanged_agent_replays_with_no_model_or_tool_call(store_target: str, driver: str) -> None:
    """Recorded by either driver in either store, the run replays on both drivers with zero calls made."""
    recording, original = recorded(store_target, driver)
    assert list(recording["children"]) == ["r1"]  # the sub-agent's run is nested under its call
    assert len(recording["children"]["r1"]["model_calls"]) == 2
    tools = Counted()
    agent, model, child_model = parent_agent([], [], tools)
    replayed = replay(agent, recording)
    again = asyncio.run(areplay(agent, recording))
    assert (len(model.seen), len(child_model.seen), tools.calls) == (0, 0, 0)
    for result in (replayed, again):
        assert (result.final, result.messages, edges(result)) == (original.final, original.messages, edges(original))


def test_each_request_carries_its_canonical_hash(tmp_path: Path) -> None:
    """Equal requests hash equal, and the hash is that of the request written beside it."""
    from fsm_agent.persist.recording import request_hash

    recording, _ = recorded(str(tmp_path / "runs.db"), "sync")
    calls = recording["model_calls"]
    assert [c["hash"] for c in calls] == [request_hash(c["request"]) for c in calls]
    assert len({c["hash"] for c in calls}) == 3
    assert calls[0]["request"]["tools"][0]["name"] == "add"


CHANGES: dict[str, tuple[dict[str, Any], int, str, str]] = {
    # what changed: the agent's options, the transition it departs at, the edge replayed there, a line of the diff
    "system prompt": ({"system": "You add with care."}, 0, "model_error", '+      "content": "You add with care."'),
    "tool schema": ({"add_doc": "Add two floats."}, 0, "model_error", '+      "description": "Add two floats."'),
    # the first turn is transitions 0-3; the second turn's tool call (7) is where a limit of 2 turns stops
    "max_steps": ({"max_steps": 2}, 7, "max_steps", '+  "max_steps": 2,'),
    "output type": ({"output_type": ANSWER_SCHEMA}, 0, "model_error", '+  "output": {'),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_fails_at_the_exact_transition_with_the_diff(tmp_path: Path, change: str) -> None:
    """A new system prompt, tool schema, limit or output type departs where it first acts, and says how."""
    recording, _ = recorded(str(tmp_path / "runs.db"), "sync")
    options, index, reason, line = CHANGES[change]
    agent, model, _ = parent_agent([], [], Counted(), **options)
    with pytest.raises(ReplayDivergence) as caught:
        replay(agent, recording)
    found = caught.value
    assert found.index == index
    assert found.expected == Transition(**recording["trace"][index])
    assert found.actual is not None
    assert (found.actual.dest, found.actual.reason) == ("Failed", reason)
    assert line in found.diff, found.diff
    assert line in str(found)
    assert model.seen == []


def test_a_history_processor_is_recorded_and_a_changed_one_departs(tmp_path: Path) -> None:
    """The messages a processor sent are what is recorded, so replay sees a processor that changed."""

    def shout(messages: list[Message]) -> list[Message]:
        return [attrs.evolve(m, content=m.content.upper()) if m.role == "user" else m for m in messages]

    def whisper(messages: list[Message]) -> list[Message]:
        return [attrs.evolve(m, content=m.content.lower()) if m.role == "user" else m for m in messages]

    target = str(tmp_path / "runs.db")
    script = [tool_turn(tool_call("add", id="a1", a=1, b=2)), reply("3")]
    agent = Agent(FakeModel(script), Counted().registry(), system="s", history_processors=[shout])
    with open_store(target) as store:
        agent.run("What is 1+2?", store=store, run_id="h1")
        recording = store.export("h1")
    assert recording["model_calls"][1]["request"]["messages"][1]["content"] == "WHAT IS 1+2?"  # what was sent
    assert recording["messages"][1]["content"] == "What is 1+2?"  # the run's own history is unchanged
    same = Agent(FakeModel(), Counted().registry(), system="s", history_processors=[shout])
    assert replay(same, recording).final == "3"
    changed = Agent(FakeModel(), Counted().registry(), system="s", history_processors=[whisper])
    with pytest.raises(ReplayDivergence) as caught:
        replay(changed, recording)
    assert caught.value.index == 0
    assert '+      "content": "what is 1+2?",' in caught.value.diff


def test_not_strict_goes_on_with_the_live_model_and_returns_the_new_recording(tmp_path: Path) -> None:
    """Past a divergence the live model answers; the new recording then replays the changed agent."""
    recording, _ = recorded(str(tmp_path / "runs.db"), "sync")
    live = FakeModel(tool_turn(tool_call("add", id="n1", a=2, b=2)), reply("4"))
    tools = Counted()
    agent, model, _ = parent_agent([], [], tools, system="You add twice.")
    fresh = replay(agent, recording, strict=False, model=live)
    assert len(live.seen) == 2
    assert tools.calls == 1
    assert fresh["final"] == "4"
    assert len(fresh["model_calls"]) == 2
    assert fresh["model_calls"][0]["request"]["messages"][0]["content"] == "You add twice."
    assert replay(agent, fresh).final == "4"
    assert (len(model.seen), tools.calls) == (0, 1)


def test_a_recorded_stop_replays_as_that_stop(tmp_path: Path) -> None:
    """A run that stopped on a limit replays to the same stop, with no exception of its own."""
    agent, _, _ = parent_agent(SCRIPT, CHILD_SCRIPT, Counted(), max_steps=1)
    with open_store(str(tmp_path / "runs.db")) as store, pytest.raises(AgentLoopError):
        agent.run("what is 1+2?", store=store, run_id="s1")
    with open_store(str(tmp_path / "runs.db")) as store:
        recording = store.export("s1")
    again, _, _ = parent_agent([], [], Counted(), max_steps=1)
    assert replay(again, recording).reason == "max_steps"


def test_not_strict_needs_a_live_model() -> None:
    """strict=False without model= is refused before anything runs."""
    agent, _, _ = parent_agent([], [], Counted())
    with pytest.raises(TypeError, match="needs model="):
        replay(agent, {}, strict=False)  # type: ignore[call-overload]


def test_a_compacted_history_is_recorded_as_sent_and_replays(tmp_path: Path) -> None:
    """After a context overflow, the compacted messages are the request recorded; the overflow replays as one."""

    def keep_last(messages: list[Message]) -> list[Message]:
        return [messages[0], Message("user", "so far: add(1, 2) gave 3")]

    def agent(model: FakeModel) -> Agent:
        return Agent(
            model, Counted().registry(), system="s", compact=keep_last, on_stop={"context_overflow": "compact"}
        )

    script: list[ModelResponse | BaseException] = [
        tool_turn(tool_call("add", id="a1", a=1, b=2)),
        ContextOverflowError("the input is too long"),
        reply("3"),
    ]
    with open_store(str(tmp_path / "runs.db")) as store:
        agent(FakeModel(script)).run("q", store=store, run_id="k1")
        recording = store.export("k1")
    calls = recording["model_calls"]
    assert calls[1]["error"] == "ContextOverflowError: the input is too long"
    assert [m["content"] for m in calls[2]["request"]["messages"]] == ["s", "so far: add(1, 2) gave 3"]
    unused = FakeModel()
    result = replay(agent(unused), recording)
    assert "AwaitModel->AwaitModel[compacts_history]" in edges(result)
    assert (result.final, unused.seen) == ("3", [])


def test_live_tools_are_called_while_the_model_answers_from_the_recording(tmp_path: Path) -> None:
    """``tools="live"`` runs the agent's own tools (and sub-agents); the model still makes no call."""
    recording, _ = recorded(str(tmp_path / "runs.db"), "sync")
    tools = Counted()
    agent, model, child_model = parent_agent([], list(CHILD_SCRIPT), tools)
    assert replay(agent, recording, tools="live").final == "3"
    assert (len(model.seen), len(child_model.seen), tools.calls) == (0, 2, 2)  # the sub-agent ran, live


def test_a_run_paused_and_decided_replays_with_the_recorded_decisions(store_target: str) -> None:
    """A run paused twice (one call approved, one rejected) replays to the same trace with no call made."""
    tools = Counted()
    script = [
        tool_turn(tool_call("add", id="a1", a=1, b=2)),
        tool_turn(tool_call("add", id="a2", a=5, b=5)),
        reply("3, and I was not allowed 5+5"),
    ]
    agent = Agent(FakeModel(script), tools.registry(), approve={"add"})
    with open_store(store_target) as store:
        result = agent.run("add", store=store, run_id="p1")
        result = agent.resume(result, approvals={"a1": True}, store=store).finish()
        result = agent.resume(result, approvals={"a2": "too big"}, store=store).finish()
        recording = store.export("p1")
    assert result.reason == "done"
    assert tools.calls == 1
    unused = FakeModel([])
    replayed = replay(Agent(unused, tools.registry(), approve={"add"}), recording)
    assert replayed.trace == result.trace
    assert [m.content for m in replayed.messages] == [m.content for m in result.messages]
    again = asyncio.run(areplay(Agent(unused, tools.registry(), approve={"add"}), recording))
    assert again.trace == result.trace
    assert tools.calls == 1
    assert unused.seen == []
