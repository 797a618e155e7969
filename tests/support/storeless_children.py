"""A parent and a sub-agent that makes several tool calls, cut together by a cancel, with every call counted.

The parent asks its ``helper`` sub-agent once per call id in ``asks`` (one
reply: the async driver runs them as one parallel batch), then answers
``done``.  Each child works through ``SCRIPT``, one tool call per reply, by
how many tool messages its history holds, then answers ``found <input>``:
``work`` calls, and ``wait`` calls that the first time they run (while
``Counts.hold`` is set) signal ``started`` and wait for ``go``, so a cancel
lands while one is in flight, for real, from another thread
(``Canceller``) or from the task that runs the parent.  Counted: the
parent's and each child's model calls, and each tool execution by
``(input, step)``, which names the same call across a child run and the
fresh one a resume starts for it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry, Usage
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.cancelled_with_parent import ParentModel  # reads only the counts' lock and parent

WAIT = 30.0
"""Seconds a held tool or the canceller waits at most; each wait is ended by an event within milliseconds, a
factor over 1000 even beside two CPU hogs."""

SCRIPT = (("work", 1), ("work", 2), ("wait", 3), ("work", 4), ("wait", 5))
"""A child's tool calls in order, as (tool, step): the first cut lands in step 3, a second one in step 5."""


class Counts:
    """The model calls of the parent and of the children (by input), each tool execution by (input, step)."""

    def __init__(self) -> None:
        self.parent = 0
        self.child: Counter[str] = Counter()
        self.tools: Counter[tuple[str, int]] = Counter()
        self.lock = threading.Lock()
        self.hold = True
        """Whether a ``wait`` running for the first time waits for ``go`` (set while a cut is being made)."""
        self.started = threading.Semaphore(0)
        self.go = threading.Event()

    def asked(self, messages: Sequence[Message]) -> tuple[str, int]:
        """Count a child model's call on ``messages``: its input, and the calls that input has had, this one in."""
        asked = next(m.content for m in messages if m.role == "user")
        with self.lock:
            self.child[asked] += 1
            return asked, self.child[asked]

    def arm(self) -> None:
        """Hold the next first-time ``wait`` calls again, with fresh events: for a second cut."""
        self.hold, self.started, self.go = True, threading.Semaphore(0), threading.Event()


class ChildModel:
    """Asks for the next call of ``SCRIPT`` (by the tool messages it has), then answers ``found <input>``."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        asked, made = self.counts.asked(messages)
        done = sum(1 for m in messages if m.role == "tool")
        if done >= len(SCRIPT):
            return reply(f"found {asked}")
        name, step = SCRIPT[done]
        # A call id unique to this child run's reply: the resumed child's ids need not be the cut one's.
        return tool_turn(tool_call(name, id=f"{asked}-{step}-{made}", item=asked, step=step))


def _count(counts: Counts, item: str, step: int) -> bool:
    """Count the execution; whether it is to wait for ``go`` (a ``wait`` run for the first time, while held)."""
    with counts.lock:
        counts.tools[(item, step)] += 1
        return counts.hold and counts.tools[(item, step)] == 1


def child_tools(counts: Counts, driver: str) -> ToolRegistry:
    """``work`` and ``wait``: plain functions on the sync driver, coroutines on the async one."""
    tools = ToolRegistry()
    if driver == "sync":

        def work(item: str, step: int) -> str:
            """Work on the item."""
            _count(counts, item, step)
            return f"worked on {item} ({step})"

        def wait(item: str, step: int) -> str:
            """Wait for the item."""
            if _count(counts, item, step):
                go = counts.go
                counts.started.release()
                assert go.wait(WAIT)
            return f"waited for {item} ({step})"

    else:

        async def work(item: str, step: int) -> str:
            """Work on the item."""
            _count(counts, item, step)
            return f"worked on {item} ({step})"

        async def wait(item: str, step: int) -> str:
            """Wait for the item."""
            if _count(counts, item, step):
                go = counts.go
                counts.started.release()
                assert await asyncio.to_thread(go.wait, WAIT)
            return f"waited for {item} ({step})"

    tools.register(work)
    tools.register(wait)
    return tools


def parent_agent(counts: Counts, driver: str, asks: Sequence[str] = ("c1",)) -> Agent:
    """The parent, with the ``helper`` sub-agent."""
    child = Agent(ChildModel(counts), child_tools(counts, driver))
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts, asks), tools)


USAGE = {"parent": Usage(1, 1), "child": Usage(5, 1), "deep": Usage(100, 10)}
"""What each model's every reply reports: the parent's usage must count each reply made once."""


class NestedModel:
    """A ``helper`` whose own ``deep`` sub-agent is asked first (step 1), then ``wait`` (step 2), then the answer."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        asked, _ = self.counts.asked(messages)
        done = sum(1 for m in messages if m.role == "tool")
        if done == 0:
            return tool_turn(tool_call("deep", input=f"deep {asked}"), usage=USAGE["child"])
        if done == 1:
            return tool_turn(tool_call("wait", item=asked, step=2), usage=USAGE["child"])
        return reply(f"found {asked}", usage=USAGE["child"])


class DeepModel:
    """The ``deep`` sub-agent's model: answers at once, counted as ``deep``."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.counts.lock:
            self.counts.child["deep"] += 1
        return reply("deep answer", usage=USAGE["deep"])


class PricedParentModel(ParentModel):
    """``ParentModel``, each reply reporting ``USAGE["parent"]``."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        response = super().complete(messages, tools)
        return ModelResponse(response.message, response.stop_reason, USAGE["parent"])


def nested_parent_agent(counts: Counts, driver: str) -> Agent:
    """The parent, its ``helper`` sub-agent having a ``deep`` sub-agent of its own besides ``wait``."""
    deep = Agent(DeepModel(counts), ToolRegistry())
    child_registry = child_tools(counts, driver)
    child_registry.register(deep.as_tool("deep", "Looks deeper."))
    child = Agent(NestedModel(counts), child_registry)
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    return Agent(PricedParentModel(counts, ("c1",)), tools)


def task_cut(agent: Agent, counts: Counts, source: Any = None) -> dict[str, Any]:
    """Async: ``agent``'s run (started, or ``source`` resumed) whose task is cancelled while a held ``wait`` is in
    flight.

    The cancel cuts the ``wait`` itself (it never comes back); the stopped run's snapshot is returned.
    """

    async def cut() -> dict[str, Any]:
        run = await (agent.astart("go", run_id="p") if source is None else agent.aresume(source))
        task = asyncio.create_task(run.afinish())
        assert await asyncio.to_thread(counts.started.acquire, True, WAIT)
        task.cancel()
        counts.go.set()  # the held wait's thread ends (asyncio.run waits for it); its coroutine is cancelled
        with pytest.raises(asyncio.CancelledError):
            await task
        assert run.reason == "cancelled"
        return run.snapshot()

    try:
        return asyncio.run(cut())
    finally:
        counts.go.set()
        counts.hold = False
