"""A sub-agent's share of the parent's ``max_tool_calls`` when ordinary calls run in the same reply.

docs/how-to/sub-agents.md, "What bounds the child": the child's tool calls
count against the parent's total, its own total is its share of what is left,
and "the parent never passes its total".  Every tool counts its executions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import Agent, Message, ModelResponse, RunResult, ToolRegistry, Usage
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class _Looker:
    """A child model that asks for one more lookup every turn and never answers."""

    def complete(self, messages: Sequence[Message], tools: list[Any]) -> ModelResponse:
        asked = sum(1 for m in messages if m.role == "assistant")
        return tool_turn(tool_call("look", id=f"l{asked}", n=asked), usage=Usage(3, 1))


def _parent(done: list[str], calls: list[Any], cap: int) -> Agent:
    child_tools = ToolRegistry()

    @child_tools.register
    def look(n: int) -> str:
        """Look one thing up, counted."""
        done.append(f"look {n}")
        return f"found {n}"

    tools = ToolRegistry()

    @tools.register
    def work(label: str) -> str:
        """Do one piece of work, counted."""
        done.append(label)
        return f"{label} ok"

    tools.register(Agent(_Looker(), child_tools, max_steps=50).as_tool("helper", "Looks things up."))
    return Agent(
        FakeModel(tool_turn(*calls), reply("done")),
        tools,
        max_tool_calls=cap,
        max_concurrency=4,
        max_consecutive_failures=9,
        on_stop={"max_tool_calls": "return"},
    )


def _finish(agent: Agent, driver: str) -> RunResult:
    if driver == "sync":
        return agent.run("go")
    return asyncio.run(agent.arun("go"))


def _made(result: RunResult) -> int:
    return int(result.steps[-1].counters["tool_calls"][0])


@pytest.mark.parametrize("driver", DRIVERS)
def test_sub_agents_alone_in_a_reply_never_take_the_parent_past_its_total(driver: str) -> None:
    """Two sub-agent calls, cap 6: each child may make (6 - 2) / 2 = 2 calls; the parent counts 6, never more."""
    done: list[str] = []
    calls = [tool_call("helper", id=f"h{i}", input=f"task {i}") for i in range(2)]
    result = _finish(_parent(done, calls, 6), driver)
    assert len(done) == 4
    assert _made(result) == 6


def test_a_sub_agent_before_an_ordinary_call_on_the_sync_driver_leaves_the_parent_at_its_total() -> None:
    """Sync, cap 3, [helper, work]: the child takes (3 - 0 - 1) = 2 calls, then ``work`` would pass the cap and
    is left pending; the parent counts exactly 3."""
    done: list[str] = []
    calls = [tool_call("helper", id="h", input="task"), tool_call("work", id="w", label="w")]
    result = _finish(_parent(done, calls, 3), "sync")
    assert done == ["look 0", "look 1"]
    assert result.reason == "max_tool_calls"
    assert [call.id for call in result.pending] == ["w"]
    assert _made(result) == 3


@pytest.mark.parametrize("first", ["helper", "work"])
def test_a_sub_agent_beside_an_ordinary_call_in_one_async_batch_never_takes_the_parent_past_its_total(
    first: str,
) -> None:
    """Async, cap 3, one reply asks for ``helper`` and ``work`` together: both run in one batch.  The parent's
    total is 3, so helper + work + the child's own calls must be at most 3 (at most one call for the child)."""
    done: list[str] = []
    helper = tool_call("helper", id="h", input="task")
    work = tool_call("work", id="w", label="w")
    calls = [helper, work] if first == "helper" else [work, helper]
    result = _finish(_parent(done, calls, 3), "async")
    assert "w" in done
    assert _made(result) <= 3, (result.reason, done)
    assert len(done) <= 2  # work and at most one lookup of the child: its share is 3 - 1 (work) - 1 (itself)
