"""Two identical sub-agent calls in one parallel batch, whose children did different work before a cancel cut them.

The parent asks its ``helper`` sub-agent twice in one reply, calls ``a``
and ``b``, with the same input ``x``: the same tool and arguments (with a
``note`` call ``n`` between them, as the same call twice in a row stops the
run on ``repeated_action``; the async driver runs the three as one batch).  Each
child works through ``SCRIPT`` (the same calls, the same arguments, one per
reply), then answers with the runs whose outcomes its history holds.  Told
apart by their run ids (``p/a``, ``p/b``: ``run_context()``, which the model
and the tools read), the two stop at different steps while the cut is made:
``wait`` holds ``a``'s child in step 2 and ``b``'s in step 4, so ``a``'s
completed 2 calls and ``b``'s 4.  ``b``'s wait is let go first and ``a``'s
only once the parent holds what ``b``'s child completed, so the parent
keeps ``b``'s entry first.  Counted: each tool execution by (run id, step),
each child model call by run id, the parent's model calls.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, AgentRun, CancelToken, Message, ModelResponse, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from fsm_agent.tools.context import run_context
from support.polling import held_within

WAIT = 30.0
"""Seconds any wait here lasts at most; each is ended by an event (or a condition polled every millisecond) within
milliseconds of work, a factor over 1000 even beside two CPU hogs."""
SCRIPT = (("work", 1), ("wait", 2), ("work", 3), ("wait", 4), ("work", 5))
"""Each child's tool calls in order, as (tool, step), all with ``item="x"``."""
HOLD = {"p/a": 2, "p/b": 4}
"""The step whose ``wait`` holds each child while the cut is made (the first time only)."""


class Counts:
    """Tool executions by (run id, step), model calls by who made them, and the cut's events."""

    def __init__(self) -> None:
        self.tools: Counter[tuple[str, int]] = Counter()
        self.models: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.hold = True
        self.started = threading.Semaphore(0)
        self.go = {run_id: threading.Event() for run_id in HOLD}


class ParentModel:
    """Asks ``helper`` twice (calls ``a`` and ``b``, input ``x``, ``note`` between) in one reply; then ``done``."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.counts.lock:
            self.counts.models["parent"] += 1
        if not any(m.role == "assistant" for m in messages):
            twice = (tool_call("helper", id="a", input="x"), tool_call("helper", id="b", input="x"))
            return tool_turn(twice[0], tool_call("note", id="n"), twice[1])
        return reply("done")


class TwinModel:
    """The next call of ``SCRIPT`` (by the tool messages it has), then the runs its outcomes came from."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        run_id = run_context().run_id
        with self.counts.lock:
            self.counts.models[run_id] += 1
            made = self.counts.models[run_id]
        told = [m.content for m in messages if m.role == "tool"]
        if len(told) >= len(SCRIPT):
            return reply("by " + ",".join(sorted({text.split(" in ")[-1].strip('"') for text in told})))
        name, step = SCRIPT[len(told)]
        return tool_turn(tool_call(name, id=f"{run_id}-{step}-{made}", item="x", step=step))


def _ran(counts: Counts, step: int) -> tuple[str, bool]:
    """Count the execution: the run id, and whether it is to hold (its lane's step, the first time, while held)."""
    run_id = run_context().run_id
    with counts.lock:
        counts.tools[(run_id, step)] += 1
        return run_id, counts.hold and HOLD.get(run_id) == step and counts.tools[(run_id, step)] == 1


def twin_tools(counts: Counts) -> ToolRegistry:
    """``work`` and ``wait`` (coroutines), each answering with the run it ran in."""
    tools = ToolRegistry()

    async def work(item: str, step: int) -> str:
        """Work on the item."""
        run_id, _ = _ran(counts, step)
        return f"worked on {item} ({step}) in {run_id}"

    async def wait(item: str, step: int) -> str:
        """Wait for the item."""
        run_id, held = _ran(counts, step)
        if held:
            go = counts.go[run_id]
            counts.started.release()
            assert await asyncio.to_thread(go.wait, WAIT)
        return f"waited for {item} ({step}) in {run_id}"

    tools.register(work)
    tools.register(wait)
    return tools


def parent_agent(counts: Counts) -> Agent:
    """The parent, with the ``helper`` sub-agent."""
    helper = Agent(TwinModel(counts), twin_tools(counts))
    tools = ToolRegistry()
    tools.register(helper.as_tool("helper", "Looks things up."))

    def note() -> str:
        """Take a note."""
        with counts.lock:
            counts.tools[("p", 0)] += 1
        return "noted"

    tools.register(note)
    return Agent(ParentModel(counts), tools)


def cut_twins(counts: Counts) -> dict[str, Any]:
    """The parent run (async, no store), its token cancelled from another thread once both waits hold: its snapshot.

    ``b``'s wait goes first; ``a``'s once the parent holds ``b``'s entry (``carried_down``), so it is kept first.
    """
    agent, token = parent_agent(counts), CancelToken()
    ready = threading.Event()
    holder: list[AgentRun] = []

    def cancel() -> None:
        try:
            for _ in HOLD:
                assert counts.started.acquire(timeout=WAIT)
            assert ready.wait(WAIT)
            token.cancel("the user pressed stop")
            counts.go["p/b"].set()
            assert held_within(lambda: len(holder[0].position.calls.carried_down) == 1, WAIT)
        finally:
            for go in counts.go.values():
                go.set()

    async def run() -> dict[str, Any]:
        started = await agent.astart("go", cancel=token, run_id="p")
        holder.append(started)
        ready.set()
        with pytest.raises(AgentLoopError):
            await started.afinish()
        assert started.reason == "cancelled"
        return started.snapshot()

    thread = threading.Thread(target=cancel, daemon=True)
    thread.start()
    try:
        return asyncio.run(run())
    finally:
        thread.join(WAIT)
        counts.hold = False


def resume_twins(counts: Counts, source: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """``source`` resumed (async, a fresh token) and driven to its end: its snapshot and result."""

    async def go() -> tuple[dict[str, Any], Any]:
        run = await parent_agent(counts).aresume(source, cancel=CancelToken())
        result = await run.afinish()
        return run.snapshot(), result

    return asyncio.run(go())
