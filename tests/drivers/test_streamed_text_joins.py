"""Streamed text pieces, joined per turn, are exactly that turn's reply text, on every way of running an agent.

A scripted streaming model hands each reply on in uneven pieces (empty ones
included) with astral characters and lone surrogates in them; the pieces
seen by a ``text`` hook (``run``/``arun``) or yielded as ``TextDelta``s
(``stream``/``astream``) must join, turn by turn, to the reply the
``after_model`` event and the result hold: for a reply cut by max_tokens,
a reply sent back for a retry, a finalize call, a model error mid-stream,
and a run resumed after that error.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from typing_extensions import TypedDict

from fsm_agent import Agent, AgentLoopError, RunResult, TextDelta, TransitionEvent
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

ODD = "a😀b\ud83dc\ude00 d𝄞é"
"""Astral characters, a lone high and a lone low surrogate, and a combining-free accent."""


def pieces(text: str) -> list[str]:
    """``text`` cut into pieces of 0, 1, 3, 2, 0, 1, ... characters: empty pieces and splits anywhere."""
    out, start = [], 0
    for size in itertools.cycle((0, 1, 3, 2)):
        if start >= len(text):
            break
        out.append(text[start : start + size])
        start += size
    return out


class Chunky(FakeModel):
    """Streams each reply in ``pieces``; a script entry ``Broken(text)`` streams ``text`` and then fails."""

    def complete_stream(self, messages: Any, tools: Any, on_text: Callable[[str], object], **keywords: Any) -> Any:
        index = len(self.seen)
        item = self.responses[index] if index < len(self.responses) else None
        if isinstance(item, Broken):
            for piece in pieces(item.streamed):
                on_text(piece)
        response = self.complete(messages, tools, **keywords)
        for piece in pieces(response.message.content):
            on_text(piece)
        return response

    async def acomplete_stream(self, messages: Any, tools: Any, on_text: Any, **keywords: Any) -> Any:
        return self.complete_stream(messages, tools, on_text, **keywords)


class Broken(ConnectionError):
    """A stream that breaks after some text."""

    def __init__(self, streamed: str) -> None:
        super().__init__("stream reset")
        self.streamed = streamed


class Point(TypedDict):
    x: int


SCENARIOS: dict[str, Callable[[], Agent]] = {
    "tool_then_answer": lambda: Agent(
        Chunky(tool_turn(tool_call("echo", text="x"), content=f"Let me {ODD}"), reply(f"The answer: {ODD}")),
        demo_registry(),
    ),
    "max_tokens": lambda: Agent(Chunky(reply(f"It is about {ODD}", stop_reason="max_tokens")), demo_registry()),
    "empty_reply": lambda: Agent(Chunky(reply("")), demo_registry()),
    "retried_reply": lambda: Agent(
        Chunky(reply(f"not json {ODD}"), reply('{"x": 1}')), demo_registry(), output_type=Point
    ),
    "finalize": lambda: Agent(
        Chunky(tool_turn(tool_call("echo", id="c1", text="a"), content=ODD), reply(f"From what I have: {ODD}")),
        demo_registry(),
        max_steps=1,
        on_stop={"max_steps": "finalize"},
    ),
    "model_error_mid_stream": lambda: Agent(Chunky(Broken(f"half {ODD}")), demo_registry()),
}


def watch(agent: Agent, way: str) -> tuple[RunResult, list[Any], list[Any]]:
    """Run ``agent`` one ``way``; return the result, the streamed/hooked events in order, and the after_model events."""
    seen: list[Any] = []
    calls: list[Any] = []
    agent.on("after_model", calls.append)
    if way in ("run", "arun"):
        agent.on("text", seen.append)
        agent.on("transition", seen.append)
    try:
        if way == "run":
            result = agent.run("q")
        elif way == "arun":
            result = asyncio.run(agent.arun("q"))
        elif way == "stream":
            seen.extend(agent.stream("q"))
            result = seen[-1].result
        else:

            async def collect() -> None:
                async for event in agent.astream("q"):
                    seen.append(event)

            asyncio.run(collect())
            result = seen[-1].result
    except AgentLoopError as stop:
        result = stop.result
    return result, seen, calls


def by_turn(seen: list[Any]) -> dict[int, str]:
    joined: dict[int, str] = {}
    for event in seen:
        if isinstance(event, TextDelta):
            joined[event.turn] = joined.get(event.turn, "") + event.text
    return joined


WAYS = ["run", "arun", "stream", "astream"]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_pieces_of_each_turn_join_to_its_reply(name: str, way: str) -> None:
    agent = SCENARIOS[name]()
    result, seen, calls = watch(agent, way)
    joined = by_turn(seen)
    expected: dict[int, str] = {}
    for call in calls:
        if call.response is not None:
            expected[call.turn] = call.response.message.content
        else:  # the call failed after streaming some text: what it streamed is what the pieces hold
            expected[call.turn] = f"half {ODD}"
    assert {turn: text for turn, text in expected.items() if text} == joined
    replies = [c.response.message.content for c in calls if c.response is not None]
    assert replies == [m.content for m in result.messages if m.role == "assistant"]
    if result.final:
        assert joined[max(joined)] == result.final
    run_ids = {event.run_id for event in seen}
    assert len(run_ids) == 1


@pytest.mark.parametrize("way", ["stream", "astream", "run", "arun"])
def test_the_pieces_of_a_turn_come_between_the_edge_before_it_and_its_replied_edge(way: str) -> None:
    """A turn's text comes after the edge that asked for the call and before the edge leaving AwaitModel."""
    result, seen, _ = watch(SCENARIOS["tool_then_answer"](), way)
    assert result.ok
    turn = 0
    in_call = True  # a run begins in AwaitModel
    for event in seen:
        if isinstance(event, TransitionEvent):
            if event.source == "AwaitModel":
                in_call = False
            if event.dest == "AwaitModel":
                in_call = True
            continue
        assert in_call, f"text {event.text!r} outside a model call"
        assert event.turn >= turn
        turn = event.turn


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_retried_model_call_streams_again_under_its_new_turn(driver: str) -> None:
    """A run stopped by a model error mid-stream and resumed with retry: the retry's pieces join to the answer."""
    agent = Agent(Chunky(Broken(f"half {ODD}"), reply(f"whole {ODD}")), demo_registry())
    pieces_seen: list[TextDelta] = []
    agent.on("text", pieces_seen.append)
    with pytest.raises(AgentLoopError) as info:
        agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    assert info.value.reason == "model_error"
    run = agent.resume(info.value.result, retry=True)
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert result.final == f"whole {ODD}"
    assert by_turn(pieces_seen) == {1: f"half {ODD}", 2: f"whole {ODD}"}
