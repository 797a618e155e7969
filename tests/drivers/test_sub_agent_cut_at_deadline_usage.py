"""A child cut by its parent's deadline: what it spent before the cut still reaches the parent.

docs/how-to/sub-agents.md "What bounds the child": the child's tokens count
against the parent; "on the async driver the parent's deadline cancels the
child in flight; on the sync driver the child stops at its own, equal,
deadline".  docs/how-to/cost-budget.md: "``result.usage.cost`` is the run's
cost, its sub-agents' included".  The child's first model call spends 500 +
50 tokens, then its tool blocks until released.

Both clocks are frozen, and the parent's first reply takes ``MARGIN`` real
seconds: the sync child's own deadline (what the parent had left when the
child started, by the frozen clock a whole ``DEADLINE``) then falls that
long after the parent's, so the parent's deadline is what cuts the call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import (
    Agent,
    AgentLoopError,
    Message,
    ModelResponse,
    Price,
    RunResult,
    SqliteStore,
    ToolRegistry,
    Usage,
)
from fsm_agent.testing import FakeModel, ManualClock, reply, tool_call, tool_turn

PRICE = Price(input_per_mtok=1, output_per_mtok=1)
DEADLINE = 0.2
MARGIN = 0.05


class _Counts:
    def __init__(self) -> None:
        self.child_model = 0
        self.blocked = 0
        self.release = threading.Event()


class _Child:
    def __init__(self, counts: _Counts, tool: str) -> None:
        self.counts, self.tool = counts, tool

    def complete(self, messages: Sequence[Message], tools: list[Any]) -> ModelResponse:
        self.counts.child_model += 1
        if any(m.role == "tool" for m in messages):
            return reply("found", usage=Usage(1, 1))
        return tool_turn(tool_call(self.tool, id="s1"), usage=Usage(500, 50))


class _SlowFirst(FakeModel):
    """The parent's model: its first reply takes ``MARGIN`` real seconds, which its frozen clock does not count."""

    def complete(self, messages: Sequence[Message], tools: list[Any], **keywords: Any) -> ModelResponse:
        if not any(m.role == "assistant" for m in messages):
            time.sleep(MARGIN)
        return super().complete(messages, tools, **keywords)


def _parent(counts: _Counts, tool: str) -> Agent:
    child_tools = ToolRegistry()

    @child_tools.register
    async def wait_async() -> str:
        """Block until cancelled."""
        counts.blocked += 1
        await asyncio.Event().wait()
        return "never"

    @child_tools.register
    def wait_sync() -> str:
        """Block until the test releases it."""
        counts.blocked += 1
        counts.release.wait(30)
        return "late"

    child = Agent(_Child(counts, tool), child_tools, prices=PRICE, clock=ManualClock())
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    script = [tool_turn(tool_call("helper", id="c1", input="look"), usage=Usage(10, 1)), reply("done")]
    return Agent(_SlowFirst(script), tools, timeout=DEADLINE, prices=PRICE, clock=ManualClock())


def _stopped(run: Any) -> RunResult:
    with pytest.raises(AgentLoopError) as stop:
        run()
    assert stop.value.reason == "timeout"
    return stop.value.result


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_child_cut_at_the_parents_deadline_still_brings_its_tokens_and_cost(driver: str, tmp_path: Path) -> None:
    """The parent's deadline (not the child's own, ``MARGIN`` later) cuts the call; the child's reply is counted."""
    counts = _Counts()
    agent = _parent(counts, "wait_sync" if driver == "sync" else "wait_async")
    try:
        with SqliteStore(tmp_path / "runs.db") as store:
            if driver == "sync":
                result = _stopped(lambda: agent.run("go", store=store, run_id="p"))
            else:
                result = _stopped(lambda: asyncio.run(agent.arun("go", store=store, run_id="p")))
            child = store.load("p/c1")
    finally:
        counts.release.set()
    assert result.evidence["unfinished"] == "c1"  # the parent's deadline cut the sub-agent call in flight
    assert (counts.child_model, counts.blocked) == (1, 1)
    assert child["counters"]["input_tokens"] == 500  # the child's own run holds what it spent
    # The child spent 550 tokens before the cut: the parent's usage must count them (sub-agents.md, cost-budget.md).
    assert result.usage.input_tokens == 510
    assert result.usage.output_tokens == 51
    assert result.usage.cost == pytest.approx(561e-6)
