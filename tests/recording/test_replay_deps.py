"""Replaying with live tools that read ``RunContext.deps``: ``replay(..., deps=)`` hands them over, past a resume too.

The source's ``add`` writes each call to the application's ledger (its
deps); it stops on ``max_steps``, is resumed under a higher limit and
finishes, in a real store.  A replay with ``tools="live"`` and a new
ledger makes each recorded call once, into that ledger, on both drivers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, Message, ModelResponse, RunContext, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.testing.replay import ReplayDivergence, areplay, replay
from fsm_agent.tools import JSONSchema

SCRIPT = [tool_turn(tool_call("add", id=f"a{n}", a=n, b=1)) for n in range(4)] + [reply("done")]


class Ledger:
    """The application's object the tool writes to: each call's id, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []


class ByTurn:
    """The n-th reply of ``SCRIPT`` when sent n assistant messages, so a replay asks for what the source asked."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return SCRIPT[sum(1 for m in messages if m.role == "assistant")]


def make_agent() -> Agent:
    registry = ToolRegistry()

    def add(ctx: RunContext[Ledger], a: int, b: int) -> int:
        """Add two numbers, writing the call to the ledger."""
        ctx.deps.calls.append((a, b))
        return a + b

    registry.register(add)
    return Agent(ByTurn(), registry, max_steps=2, on_stop={"max_steps": "return"})


def recorded(tmp_path: Path) -> dict[str, Any]:
    """The source, stopped on ``max_steps`` after two turns, resumed under 10 and finished, exported."""
    agent, ledger = make_agent(), Ledger()
    with open_store(str(tmp_path / "runs.db")) as store:
        result = agent.start("go", store=store, run_id="src", deps=ledger).finish()
        assert result.reason == "max_steps"
        result = agent.resume(result, store=store, max_steps=10, deps=ledger).finish()
        assert result.reason == "done"
        assert len(ledger.calls) == 4
        return store.export("src")


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_live_replay_hands_its_deps_to_each_call_past_the_resume(tmp_path: Path, driver: str) -> None:
    """Each of the four recorded calls is made once, into the replay's own ledger; the trace is the recorded one."""
    recording, ledger = recorded(tmp_path), Ledger()
    agent = make_agent()
    if driver == "sync":
        result = replay(agent, recording, tools="live", deps=ledger)
    else:
        result = asyncio.run(areplay(agent, recording, tools="live", deps=ledger))
    assert (result.reason, result.final) == ("done", "done")
    assert [t["trigger"] for t in recording["trace"]].count("resume") == 1
    assert ledger.calls == [(0, 1), (1, 1), (2, 1), (3, 1)]


def test_a_live_replay_without_the_deps_its_tools_read_departs(tmp_path: Path) -> None:
    """Without ``deps=`` the first call fails (its tool reads none), so the next model call is sent another result."""
    recording = recorded(tmp_path)
    with pytest.raises(ReplayDivergence):
        replay(make_agent(), recording, tools="live")
