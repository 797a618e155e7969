"""A stored parent, its ``helper`` sub-agent and that one's ``deep`` sub-agent, cut by a Ctrl-C inside ``deep``.

The parent asks ``helper`` once (call id ``c1``), then answers; the helper
works through ``CHILD_SCRIPT`` and the deep run through ``DEEP_SCRIPT``, one
tool call per reply (``support.storeless_grandchildren.Worker``).  Every tool
execution is counted by ``(item, step)``, which names the same call across a
cut run and the new one a fork starts for it; every model call by who made
it.  ``Counts.cut`` names the ``(item, step)`` whose first execution raises
``KeyboardInterrupt`` before its side effect is counted as done (a Ctrl-C in
the middle of the grandchild's call): with the store writing every
transition, the calls before it are durable when it runs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from fsm_agent import Agent, RunResult, ToolRegistry
from support.storeless_children import Counts as BaseCounts
from support.storeless_grandchildren import CHILD_SCRIPT, DEEP_SCRIPT, ParentModel, Worker

__all__ = ["CHILD_SCRIPT", "DEEP_SCRIPT", "Counts", "cut_run", "fork_run", "nested"]


class Counts(BaseCounts):
    """``BaseCounts`` with ``done`` (each side effect made) and ``cut``: the call a Ctrl-C lands in, once."""

    def __init__(self, cut: tuple[str, int] | None = None) -> None:
        super().__init__()
        self.cut = cut
        self.done: Counter[tuple[str, int]] = Counter()

    def effect(self, item: str, step: int) -> str:
        """A tool's call: count the try, raise the Ctrl-C if it is the ``cut`` one (once), then count the effect."""
        with self.lock:
            self.tools[(item, step)] += 1
            cut = self.cut == (item, step)
            self.cut = None if cut else self.cut
        if cut:
            raise KeyboardInterrupt
        with self.lock:
            self.done[(item, step)] += 1
        return f"did {item} ({step})"


def _tools(counts: Counts) -> ToolRegistry:
    """``work`` and ``wait`` (the same here): ``Counts.effect``."""
    tools = ToolRegistry()

    def work(item: str, step: int) -> str:
        """Work on the item."""
        return counts.effect(item, step)

    def wait(item: str, step: int) -> str:
        """Wait for the item."""
        return counts.effect(item, step)

    tools.register(work)
    tools.register(wait)
    return tools


def nested(counts: Counts) -> Agent:
    """The parent, its ``helper`` sub-agent, and the helper's ``deep`` sub-agent, all counted in ``counts``."""
    deep = Agent(Worker(counts, DEEP_SCRIPT), _tools(counts))
    helper_tools = _tools(counts)
    helper_tools.register(deep.as_tool("deep", "Looks deeper."))
    helper = Agent(Worker(counts, CHILD_SCRIPT), helper_tools)
    tools = ToolRegistry()
    tools.register(helper.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts, ("c1",), again=False), tools)


def cut_run(agent: Agent, driver: str, store: Any, run_id: str) -> None:
    """Run ``agent`` as ``run_id`` on ``driver`` until the Ctrl-C armed in its counts cuts it."""
    try:
        if driver == "sync":
            agent.run("go", store=store, run_id=run_id)
        else:
            asyncio.run(agent.arun("go", store=store, run_id=run_id))
    except KeyboardInterrupt:
        return
    raise AssertionError("the run was never cut")


def fork_run(agent: Agent, source: str, at: int, driver: str, store: Any, run_id: str) -> RunResult | None:
    """A fork of the stored run ``source`` at transition ``at``, as ``run_id``, finished on ``driver``; None if a
    Ctrl-C armed in the agent's counts cut it."""
    try:
        if driver == "sync":
            return agent.fork(source, at, store=store, run_id=run_id).finish()

        async def go() -> RunResult:
            return await (await agent.afork(source, at, store=store, run_id=run_id)).afinish()

        return asyncio.run(go())
    except KeyboardInterrupt:
        return None
