"""A fork's hooks: a call it takes from its source is no tool execution, and is heard as none.

watching-runs.md: "Each tool execution is heard once: one ``before_tool``
as it starts and, if it ran to its end, one ``after_tool``"; fork-a-run.md:
"hooks and observers hear only of the fork's own transitions", and a call
the source completed is "not made again".  The OpenTelemetry instrument
opens no ``execute_tool`` span for such a call; a hook that counts tool
executions (billing, an audit log) must not count it either, nor hear an
``after_tool`` that no ``before_tool`` opened.  Every tool counts its
executions; the hooks are compared with that count.  The transition that
takes a reused call in says so (``TransitionEvent.reused_from``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from support.by_turn import ByTurn

from fsm_agent import Agent, RunResult, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn

BATCH = [
    tool_turn(
        tool_call("send", id="s1", to="ada"), tool_call("send", id="s2", to="bob"), tool_call("send", id="s3", to="cy")
    ),
    reply("all sent"),
]


def counted(made: Counter[str]) -> ToolRegistry:
    tools = ToolRegistry()

    def send(to: str, call_id: str) -> str:
        """Send a message: an effect in the world."""
        made[call_id] += 1
        return f"sent {to}"

    tools.register(send)
    return tools


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_s_hooks_hear_only_the_calls_it_makes_each_once(driver: str) -> None:
    """Forked before a batch of three with ``rerun={"s2"}``: s2 is made and heard once; s1 and s3 are not heard."""
    source = Agent(ByTurn(BATCH), counted(Counter())).run("go")
    made: Counter[str] = Counter()
    agent = Agent(ByTurn(BATCH), counted(made))
    heard: dict[str, Counter[str]] = {"before_tool": Counter(), "after_tool": Counter()}
    for name, calls in heard.items():
        agent.on(name, lambda event, calls=calls: calls.update([event.tool_call.id]))
    taken: list[str | None] = []
    agent.on("transition", lambda event: taken.append(event.reused_from) if event.source == "ExecuteTool" else None)
    run = agent.fork(source, 1, rerun={"s2"})
    result: RunResult = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert result.final == "all sent"
    assert [s.reused_from for s in result.steps if s.kind == "tool_call"] == ["s1", None, "s3"]
    assert dict(made) == {"s2": 1}
    assert taken == ["s1", None, "s3"]  # the transitions that take the calls in say which were reused
    expected: dict[str, Any] = {"before_tool": {"s2": 1}, "after_tool": {"s2": 1}}
    assert {name: dict(calls) for name, calls in heard.items()} == expected
