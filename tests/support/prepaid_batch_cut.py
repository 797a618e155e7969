"""A stored helper whose batch holds a sub-agent call that came back and a ``wait`` in flight when the parent's task
is cancelled: the cut counts the come-back outcome, which the helper's stored run keeps outside its counters.

The parent asks ``helper`` once (call ``c1``), then answers ``done``.  The
helper's first reply asks, in one batch (the async driver), its ``deep``
sub-agent (which answers at once, its reply reporting ``DEEP_USAGE``) and
``wait`` (step 2), held the first time it runs (``support.storeless_children.child_tools``);
once both tool messages are in, it answers.  Every other reply reports
``USAGE``.  The cut is the parent's task cancelled while ``wait`` is held:
the deep outcome has come back (kept in the helper's ``ran``, written to its
store), ``wait`` never does.  Counted: every model call by who made it, each
tool execution by ``(item, step)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, RunResult, ToolRegistry, Usage
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.polling import held_within
from support.storeless_children import WAIT, Counts, child_tools
from support.storeless_grandchildren import ParentModel

USAGE = Usage(1, 1)
"""What the parent's and the helper's every reply reports."""
DEEP_USAGE = Usage(100, 10)
"""What the deep run's reply reports: the tokens a share that leaves them out comes short by."""


class HelperModel:
    """``deep`` and ``wait`` in one reply; with both answered, ``found <input>``."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        asked, _ = self.counts.asked(messages)
        if sum(1 for m in messages if m.role == "tool") >= 2:
            return reply(f"found {asked}", usage=USAGE)
        calls = (tool_call("deep", id="d1", input=f"deep {asked}"), tool_call("wait", id="w2", item=asked, step=2))
        return tool_turn(*calls, usage=USAGE)


class DeepModel:
    """Answers at once, reporting ``DEEP_USAGE``."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.counts.asked(messages)
        return reply("deep answer", usage=DEEP_USAGE)


def parent_agent(counts: Counts, **settings: Any) -> Agent:
    """The parent (built with ``settings``), its ``helper`` sub-agent and the helper's ``deep`` sub-agent."""
    deep = Agent(DeepModel(counts), ToolRegistry())
    helper_tools = child_tools(counts, "async")
    helper_tools.register(deep.as_tool("deep", "Looks deeper."))
    helper = Agent(HelperModel(counts), helper_tools)
    tools = ToolRegistry()
    tools.register(helper.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts, ("c1",), False), tools, **settings)


def task_cut(counts: Counts, store: Any) -> dict[str, Any]:
    """The parent's run ``p`` with ``store``, its task cancelled while the held ``wait`` is in flight.

    Returned: the helper's run as its store held it just before the cut, the
    deep outcome come back and kept (its ``ran``), not recorded yet: what a
    process that died at the cut would have left.
    """
    held: list[dict[str, Any]] = []

    def come_back() -> bool:
        stored = dict(store.load("p/c1"))
        held[:] = [stored]
        return "d1" in stored.get("ran", {})

    async def cut() -> None:
        run = await parent_agent(counts).astart("go", store=store, run_id="p")
        task = asyncio.create_task(run.afinish())
        assert await asyncio.to_thread(counts.started.acquire, True, WAIT)
        assert await asyncio.to_thread(held_within, come_back, WAIT)
        task.cancel()
        counts.go.set()  # the held wait's thread ends (asyncio.run waits for it); its coroutine is cancelled
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(cut())
    finally:
        counts.go.set()
        counts.hold = False
    return held[0]


def resumed(counts: Counts, source: Any, store: Any, **given: Any) -> RunResult:
    """``source`` resumed with ``store`` and ``given`` and driven to its end or stop."""

    async def go() -> RunResult:
        run = await parent_agent(counts).aresume(source, store=store, **given)
        try:
            return await run.afinish()
        except AgentLoopError as stop:
            return stop.result

    return asyncio.run(go())
