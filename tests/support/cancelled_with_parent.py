"""A parent whose cancel token is cancelled, from another thread, while its sub-agents' tools run.

The parent asks its ``helper`` sub-agent once per call id in ``asks`` (one
reply: the async driver runs them as one parallel batch), then answers.
Each child asks for ``work`` with its input (the call id ``w-<input>``),
then answers.  The first time each ``work`` runs it signals ``started`` and
waits for ``go``; ``Canceller`` waits until the expected number of them
started, cancels the parent's token and lets them go, so the cancel lands
while the children's tools are in flight, for real, from another thread.
Every model call and tool execution is counted: the parent's and the
children's model calls, each ``work`` by call id.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence

from fsm_agent import Agent, CancelToken, Message, ModelResponse, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

WAIT = 30.0
"""Seconds a waiting tool or the canceller waits at most; each wait is ended by an event in milliseconds, so the
factor is over 1000 even with two CPU hogs beside the suite."""


class Counts:
    """Every model call (parent, child) and every ``work`` execution by call id; the cut's events."""

    def __init__(self) -> None:
        self.parent = 0
        self.child = 0
        self.work: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.started = threading.Semaphore(0)
        self.go = threading.Event()
        self.hold = True
        """Whether a ``work`` call waits for ``go`` (the run that is cut); a resume's calls run through."""


class ParentModel:
    """Asks ``helper`` once per id of ``asks`` in one reply; once answered, says ``done``."""

    def __init__(self, counts: Counts, asks: Sequence[str]) -> None:
        self.counts, self.asks = counts, asks

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.counts.lock:
            self.counts.parent += 1
        if not any(m.role == "assistant" for m in messages):
            return tool_turn(*(tool_call("helper", id=call_id, input=call_id) for call_id in self.asks))
        return reply("done")


class ChildModel:
    """Asks for ``work`` on its input, then answers ``found <input>``."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.counts.lock:
            self.counts.child += 1
        asked = next(m.content for m in messages if m.role == "user")
        if any(m.role == "tool" for m in messages):
            return reply(f"found {asked}")
        return tool_turn(tool_call("work", id=f"w-{asked}", item=asked))


def _held(counts: Counts) -> bool:
    return counts.hold


def child_tools(counts: Counts, driver: str) -> ToolRegistry:
    """``work``, a plain function on the sync driver and a coroutine on the async one."""
    tools = ToolRegistry()
    if driver == "sync":

        def work(item: str, call_id: str) -> str:
            """Work on the item."""
            with counts.lock:
                counts.work[call_id] += 1
            if _held(counts):
                counts.started.release()
                assert counts.go.wait(WAIT)
            return f"worked on {item}"

    else:

        async def work(item: str, call_id: str) -> str:
            """Work on the item."""
            with counts.lock:
                counts.work[call_id] += 1
            if _held(counts):
                counts.started.release()
                assert await asyncio.to_thread(counts.go.wait, WAIT)
            return f"worked on {item}"

    tools.register(work)
    return tools


def parent_agent(counts: Counts, driver: str, asks: Sequence[str] = ("c1",)) -> Agent:
    """The parent, with the ``helper`` sub-agent."""
    child = Agent(ChildModel(counts), child_tools(counts, driver))
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts, asks), tools)


class Canceller:
    """A thread that cancels ``token`` once ``expected`` held ``work`` calls started, then lets them go."""

    def __init__(self, counts: Counts, token: CancelToken, expected: int) -> None:
        self.counts, self.token, self.expected = counts, token, expected
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for _ in range(self.expected):
                if not self.counts.started.acquire(timeout=WAIT):
                    return
            self.token.cancel("the user pressed stop")
            self.done.set()
        finally:
            self.counts.go.set()

    def __enter__(self) -> Canceller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.counts.go.set()
        self.thread.join(WAIT)
        self.counts.hold = False
