"""Watching costs nothing unless something watches: a run without hooks, observers or a log builds no event.

Counted, not timed: the event classes the drivers build are replaced by
counting ones, and a model that can stream records whether it was asked to.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, RunResult
from fsm_agent.drivers import watched
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn


class Streamer(FakeModel):
    """A scripted model that can stream, and counts how it was called."""

    streamed = 0

    def complete_stream(self, messages: Any, tools: Any, on_text: Any) -> Any:
        self.streamed += 1
        response = self.complete(messages, tools)
        on_text(response.message.content)
        return response

    async def acomplete_stream(self, messages: Any, tools: Any, on_text: Any) -> Any:
        return self.complete_stream(messages, tools, on_text)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many events of each kind the drivers built."""
    counts: Counter[str] = Counter()
    for name in ("TransitionEvent", "CallEvent", "TextDelta"):
        real = getattr(watched, name)

        def counting(*args: Any, real: Any = real, name: str = name, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(watched, name, counting)
    return counts


def script() -> Streamer:
    return Streamer(
        tool_turn(tool_call("echo", id="e1", text="a"), tool_call("add", id="a1", a=1, b=2), content="calling"),
        reply("done"),
    )


def drive(agent: Agent, driver: str, **keywords: Any) -> RunResult:
    try:
        return agent.run("q", **keywords) if driver == "sync" else asyncio.run(agent.arun("q", **keywords))
    except AgentLoopError as stop:
        return stop.result


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_run_nobody_watches_builds_no_event_and_does_not_stream(built: Counter[str], driver: str) -> None:
    model = script()
    result = drive(Agent(model, demo_registry()), driver)
    assert result.final == "done"
    assert built == Counter()
    assert model.streamed == 0


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stopped_run_nobody_watches_builds_no_event(built: Counter[str], driver: str) -> None:
    result = drive(Agent(FakeModel(reply("cut", stop_reason="max_tokens")), demo_registry()), driver)
    assert result.reason == "max_tokens"
    assert built == Counter()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_watched_run_builds_one_event_per_transition_and_call(built: Counter[str], driver: str) -> None:
    """The counting classes do count: a hook on the agent makes the run build each event once."""
    model = script()
    agent = Agent(model, demo_registry())
    transitions: list[Any] = []
    agent.on("transition", transitions.append)
    result = drive(agent, driver)
    assert built["TransitionEvent"] == len(result.trace) == len(transitions)
    # before and after each of the 2 model calls and each of the 2 tool calls
    assert built["CallEvent"] == 8
    assert built["TextDelta"] == 0  # no text hook: the model is not asked to stream
    assert model.streamed == 0


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_text_hook_alone_streams_and_builds_one_delta_per_piece(built: Counter[str], driver: str) -> None:
    model = script()
    agent = Agent(model, demo_registry())
    pieces: list[Any] = []
    agent.on("text", pieces.append)
    result = drive(agent, driver)
    assert result.final == "done"
    assert model.streamed == 2
    assert built["TextDelta"] == len(pieces) == 2
