"""A conversation whose request handler died mid-turn, taken over by the next request with that request's deps.

deps.md: "a resumed run (or one another process takes over) is given them
again by its new owner"; conversations.md: the next turn asked for, once
the dead owner's lease lapsed, finishes the unfinished turn first.  The
tool counts its executions on the deps it was given.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from fsm_agent import Agent, Message, ModelResponse, RunContext, Session, SqliteStore
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

LEASE = 0.3


class Request:
    """One request's deps: who asked, and what its tool calls looked up."""

    def __init__(self, user: str, cut_at: str | None = None) -> None:
        self.user = user
        self.looked: list[str] = []
        self.cut_at = cut_at


def weather(city: str, ctx: RunContext[Request]) -> str:
    """The weather in a city; the first request's handler dies (a Ctrl-C) as it looks up ``cut_at``."""
    ctx.deps.looked.append(city)
    if city == ctx.deps.cut_at:
        raise KeyboardInterrupt
    return f"sunny in {city} for {ctx.deps.user}"


class Trip:
    """Paris then Rome, one call each, for the question about the weather; any other question is answered."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        last = max(i for i, m in enumerate(messages) if m.role == "user")
        answers = [json.loads(m.content) for m in messages[last:] if m.role == "tool"]
        if messages[last].content.startswith("Weather") and len(answers) < 2:
            city = ["Paris", "Rome"][len(answers)]
            return tool_turn(tool_call("weather", id=f"c{len(answers) + 1}", city=city))
        return reply(" / ".join(answers) if answers else "You are welcome.")


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_next_request_finishes_a_dead_handlers_turn_with_its_own_deps_and_repeats_only_the_cut_call(
    driver: str, tmp_path: Path
) -> None:
    """Turn 1 dies looking up Rome; after the lease, request 2 finishes it on its deps (Rome again), then its own."""
    path = tmp_path / "chat.db"
    first, second = Request("first", cut_at="Rome"), Request("second")
    session = Session(Agent(Trip(), [weather]), SqliteStore(path, lease=LEASE), "trip", deps=first)
    with pytest.raises(KeyboardInterrupt):
        session.run("Weather in Paris, then Rome?")
    time.sleep(LEASE + 0.1)  # the dead handler's lease lapses
    store = SqliteStore(path, lease=LEASE)
    again = Session(Agent(Trip(), [weather]), store, "trip")
    result = again.run("Thanks!", deps=second) if driver == "sync" else asyncio.run(again.arun("Thanks!", deps=second))
    assert result.final == "You are welcome."
    assert (first.looked, second.looked) == (["Paris", "Rome"], ["Rome"])
    assert store.load("trip/1")["final"] == "sunny in Paris for first / sunny in Rome for second"
    assert again.turns == 2
