"""A stored parent whose fork hands its ``helper`` sub-agent call down, cut by a Ctrl-C inside the new helper run.

The parent asks ``helper`` once per ``(call id, input)`` of ``asks``, in one
reply with a ``note`` call between each two (counted as ``("note", i)``),
then answers ``done``.  The runs that are cut make those calls one at a time
(``max_concurrency=1``: the async driver makes them in the order asked, as
the sync driver does); a resume on the async driver may make them all at once.
Each helper run works through ``SCRIPT`` (``support.storeless_grandchildren.Worker``):
``work`` steps 1 and 2, then step 1 again, a new request with the same tool
and arguments as the first, which must really run.  Every tool execution is
counted by ``(item, step)`` (the item is the helper's input) as it is tried
(``Counts.tools``) and once its side effect is made (``Counts.done``); the
first try of ``Counts.cut`` raises ``KeyboardInterrupt`` before its side
effect (a Ctrl-C in the middle of the call).  Every model call is counted by
who made it (``parent``, or a helper by its input).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from fsm_agent import Agent, AgentRun, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.exactly_once import ataken_over, taken_over
from support.fork_grandchildren import Counts
from support.storeless_children import WAIT
from support.storeless_grandchildren import USAGE, Worker

__all__ = ["LEASE", "SCRIPT", "Counts", "agent", "cut", "forked_and_cut", "resumed"]

SCRIPT = (("work", 1), ("work", 2), ("work", 1))
"""A helper run's tool calls in order, as (tool, step): the third repeats the first's tool and arguments."""
LEASE = 0.5
"""Seconds a cut owner's lease lasts: a second owner waits it out (``support.exactly_once.taken_over``)."""


class Parent:
    """Asks ``helper`` once per ``(call id, input)`` of ``asks`` in its first reply, then answers ``done``."""

    def __init__(self, counts: Counts, asks: Sequence[tuple[str, str]]) -> None:
        self.counts, self.asks = counts, asks

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.counts.lock:
            self.counts.child["parent"] += 1
        if any(m.role == "assistant" for m in messages):
            return reply("done", usage=USAGE)
        calls = [tool_call("helper", id=call_id, input=text) for call_id, text in self.asks]
        # A note between two helper calls: the same call right after itself would stop the run (repeated_action).
        notes = [tool_call("note", id=f"note{i}", text=str(i)) for i in range(len(calls))]
        return tool_turn(*[c for pair in zip(calls, notes, strict=True) for c in pair][:-1], usage=USAGE)


def agent(
    counts: Counts, asks: Sequence[tuple[str, str]] = (("c1", "c1"),), *, one_at_a_time: bool = True, held: bool = False
) -> Agent:
    """The parent and its ``helper`` sub-agent, every call counted in ``counts``.

    ``one_at_a_time``: the async driver makes the parent's calls in the order
    asked (``max_concurrency=1``); else all at once, as it does by default.
    ``held``: ``work`` step 2 waits (on its worker thread) until a helper's
    model is asked; resumed, the helper run cut in step 2 asks its model only
    after it, so the one asked is another's: a call made at once with it
    starts while it is in flight, for certain.
    """
    tools, asked = ToolRegistry(), threading.Event()

    def work(item: str, step: int) -> str:
        """Work on the item."""
        if held and step == 2 and not asked.is_set():
            assert asked.wait(WAIT), "no other helper run started while step 2 was in flight"
        return counts.effect(item, step)

    tools.register(work)
    helper = Agent(Worker(counts, SCRIPT, lambda _input, _made: asked.set()), tools)
    parent_tools = ToolRegistry()
    parent_tools.register(helper.as_tool("helper", "Looks things up."))

    def note(text: str) -> str:
        """Take a note."""
        with counts.lock:
            counts.tools[("note", int(text))] += 1
            counts.done[("note", int(text))] += 1
        return f"noted {text}"

    parent_tools.register(note)
    return Agent(Parent(counts, asks), parent_tools, max_concurrency=1 if one_at_a_time else None)


def cut(driver: str, go: Any) -> None:
    """``go()`` (a run on ``driver``: a result, or a coroutine giving one) until the Ctrl-C armed in it cuts it."""
    try:
        if driver == "sync":
            go()
        else:
            asyncio.run(go())
    except KeyboardInterrupt:
        return
    raise AssertionError("the run was never cut")


def forked_and_cut(
    target: str, store: Any, driver: str, asks: Sequence[tuple[str, str]], counts: tuple[Counts, Counts]
) -> None:
    """At ``target``: ``p`` run until a Ctrl-C in its first helper's step 2, then its fork ``f``, cut there again.

    The fork makes the helper call cut in flight again, handing the new
    helper run what the cut one completed (``carried_down``); its Ctrl-C
    comes before the fork's next write, so ``f`` as stored still holds that
    entry, which its helper run took.  The source is run and cut by an owner
    of its own (a store object opened and closed here); the fork by ``store``,
    a store object of ``target``.
    """
    source, fork = counts
    first, again = agent(source, asks), agent(fork, asks)
    with open_store(target, lease=LEASE) as own:
        if driver == "sync":
            cut(driver, lambda: first.run("go", store=own, run_id="p"))
        else:
            cut(driver, lambda: first.arun("go", store=own, run_id="p"))
    last = len(store.load("p")["trace"]) - 1
    if driver == "sync":
        cut(driver, lambda: again.fork("p", last, store=store, run_id="f").finish())
    else:

        async def go() -> RunResult:
            return await (await again.afork("p", last, store=store, run_id="f")).afinish()

        cut(driver, go)


def resumed(store: Any, driver: str, agent: Agent) -> RunResult:
    """The stored ``f`` resumed in ``store`` on ``driver`` and finished, once the cut owner's lease lapsed.

    A Ctrl-C leaves the cut run leased to the run it cut (each run is an
    owner of its own), so even a resume on the same store object waits it out.
    """
    if driver == "sync":
        return taken_over(lambda: agent.resume(store.load("f"), store=store)).finish()

    async def go() -> RunResult:
        async def claim() -> AgentRun:
            return await agent.aresume(await store.aload("f"), store=store)

        return await (await ataken_over(claim)).afinish()

    return asyncio.run(go())


class LookedUpFirst:
    """``inner``, a store, whose read of run ``later`` waits until run ``first`` was read: two lookups in that order.

    Why: a parent's calls made at once look their children up concurrently;
    which read the store answers first is the event loop's and the store's
    business, so the order that matters is forced here, for certain.  Every
    other method is ``inner``'s own.
    """

    def __init__(self, inner: Any, first: str, later: str) -> None:
        self._inner, self._first, self._later = inner, first, later
        self._read = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def aload(self, run_id: str) -> Any:
        if run_id == self._later and not self._read.is_set():
            assert await asyncio.to_thread(self._read.wait, WAIT), f"{self._first!r} was never read"
        try:
            return await self._inner.aload(run_id)
        finally:
            if run_id == self._first:
                self._read.set()
