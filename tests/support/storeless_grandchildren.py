"""A parent, its store-less ``helper`` sub-agent and that one's own ``deep`` sub-agent, cut together by a cancel.

The parent asks ``helper`` once per call id in ``asks`` (one reply: the
async driver runs them as one parallel batch); with ``again`` it then asks
``note`` and ``helper`` once more for the first input, under a new call id
(``note`` between them, so the call repeats none just made), before it
answers ``done``.  Each ``helper`` run works through ``CHILD_SCRIPT`` and
each ``deep`` run through ``DEEP_SCRIPT``, one tool call per reply, by how
many tool messages their history holds, then answer.  The ``wait`` of
``deep`` (step 2) is the one the cut lands in: the first time it runs
(while ``Counts.hold`` is set) it signals ``started`` and waits for ``go``
(``support.storeless_children.child_tools``).  Counted: every model call,
by who made it (``parent``, a helper by its input ``c1``, a deep run by its
input ``deep c1``), and each tool execution by ``(item, step)``, which
names the same call across a cut run and the fresh one a resume starts.
Every reply reports ``USAGE``, so a resume's token budget can be set to
what the cut spent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from fsm_agent import Agent, AgentLoopError, CancelToken, Message, ModelResponse, RunResult, ToolRegistry, Usage
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.cancelled_with_parent import Canceller  # reads only the counts' started, go and hold
from support.storeless_children import Counts, child_tools

CHILD_SCRIPT = (("work", 1), ("deep", 2), ("work", 3))
"""The helper's tool calls in order, as (tool, step): step 2 asks its ``deep`` sub-agent."""
DEEP_SCRIPT = (("work", 1), ("wait", 2), ("work", 3))
"""The deep run's tool calls in order, as (tool, step): the cut lands in step 2."""
USAGE = Usage(1, 1)
"""What every reply of every level reports."""
Told = Callable[[str, int], object]
"""Told of each model call of a sub-agent: its input, and the calls made for that input so far."""


class ParentModel:
    """Asks ``helper`` once per id of ``asks`` in one reply; with ``again``, once more for ``asks[0]``; ``done``."""

    def __init__(self, counts: Counts, asks: Sequence[str], again: bool) -> None:
        self.counts, self.asks, self.again = counts, asks, again

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.counts.lock:
            self.counts.child["parent"] += 1
        replies = sum(1 for m in messages if m.role == "assistant")
        if replies == 0:
            calls = (tool_call("helper", id=call_id, input=call_id) for call_id in self.asks)
            return tool_turn(*calls, usage=USAGE)
        if self.again and replies == 1:
            again = tool_call("helper", id=f"{self.asks[0]}-again", input=self.asks[0])
            return tool_turn(tool_call("note", id="note", text="again"), again, usage=USAGE)
        return reply("done", usage=USAGE)


class Worker:
    """A sub-agent's model: the next call of ``script`` (by the tool messages it has), then ``found <input>``.

    ``told`` is called with the input and how many calls were made for it, after each call is counted.
    """

    def __init__(self, counts: Counts, script: Sequence[tuple[str, int]], told: Told | None = None) -> None:
        self.counts, self.script, self.told = counts, script, told

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        asked, made = self.counts.asked(messages)
        if self.told is not None:
            self.told(asked, made)
        done = sum(1 for m in messages if m.role == "tool")
        if done >= len(self.script):
            return reply(f"found {asked}", usage=USAGE)
        name, step = self.script[done]
        # A call id unique to this run's reply: a fresh run's ids need not be the cut one's.
        call_id = f"{asked}-{step}-{made}"
        if name == "deep":
            return tool_turn(tool_call("deep", id=call_id, input=f"deep {asked}"), usage=USAGE)
        return tool_turn(tool_call(name, id=call_id, item=asked, step=step), usage=USAGE)


def parent_agent(
    counts: Counts,
    driver: str,
    asks: Sequence[str] = ("c1",),
    *,
    again: bool = False,
    told: Told | None = None,
    **settings: Any,
) -> Agent:
    """The parent (built with ``settings``), its ``helper`` sub-agent, and the helper's ``deep`` sub-agent."""
    deep = Agent(Worker(counts, DEEP_SCRIPT, told), child_tools(counts, driver))
    helper_tools = child_tools(counts, driver)
    helper_tools.register(deep.as_tool("deep", "Looks deeper."))
    helper = Agent(Worker(counts, CHILD_SCRIPT, told), helper_tools)
    tools = ToolRegistry()
    tools.register(helper.as_tool("helper", "Looks things up."))

    def note(text: str) -> str:
        """Take a note."""
        with counts.lock:
            counts.tools[("note", 0)] += 1
        return f"noted {text}"

    tools.register(note)
    return Agent(ParentModel(counts, asks, again), tools, **settings)


def cut_together(
    counts: Counts, driver: str, asks: Sequence[str] = ("c1",), store: Any = None, **settings: Any
) -> RunResult:
    """The parent, its token cancelled from another thread once each started deep run's ``wait`` is in flight.

    The sync driver never starts a second helper call of the reply: one wait is awaited there.
    """
    agent, token = parent_agent(counts, driver, asks, **settings), CancelToken()
    expected = len(asks) if driver == "async" else 1

    def run() -> RunResult:
        if driver == "sync":
            return agent.run("go", cancel=token, store=store, run_id="p")
        return asyncio.run(agent.arun("go", cancel=token, store=store, run_id="p"))

    with Canceller(counts, token, expected) as canceller:
        try:
            run()
        except AgentLoopError as stop:
            assert canceller.done.is_set()  # the cancel came while the deep runs' waits were in flight
            return stop.result
    raise AssertionError("the run was not cut")


def resumed(agent: Agent, driver: str, source: Any, **given: Any) -> tuple[dict[str, Any], RunResult]:
    """``source`` resumed by ``agent`` with ``given`` (a fresh token unless one is), driven to its end or stop."""
    given.setdefault("cancel", CancelToken())
    if driver == "sync":
        run = agent.resume(source, **given)
        try:
            result = run.finish()
        except AgentLoopError as stop:
            result = stop.result
        return run.snapshot(), result

    async def go() -> tuple[dict[str, Any], RunResult]:
        run = await agent.aresume(source, **given)
        try:
            result = await run.afinish()
        except AgentLoopError as stop:
            result = stop.result
        return run.snapshot(), result

    return asyncio.run(go())
