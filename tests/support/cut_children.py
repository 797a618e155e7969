"""A parent whose deadline cuts its sub-agent call in flight, with every model call it and its child make on record.

docs/how-to/sub-agents.md "What bounds the child", Tokens: the child's spend
before the cut is the parent's, and a later resume that takes the child's
run back counts only what it spends beyond that.  ``Calls`` writes each
model call as it is made and each reply's usage as it returns, to a file, so
a run killed in one process and resumed in another is counted alike; the
parent's usage must equal the sum of every reply that was made, each once.

The parent (its clock frozen, a ``timeout`` of ``DEADLINE`` real seconds)
asks the ``helper`` sub-agent once, then answers.  The child asks for its
``wait`` tool, then answers.  ``block`` picks what hangs the first time it
is called, so the parent's deadline cuts it: the child's tool, after the
child's first reply (``"tool"``), or the child's first model call, before
any reply (``"model"``).  The parent's first model call takes ``MARGIN``
seconds: the sync driver's child stops at its own deadline, which is the
time the parent had left when the child started, and the parent's frozen
clock makes that a full ``DEADLINE`` from the child's start, so the parent's
deadline comes first by the margin.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from fsm_agent import Agent, Message, ModelResponse, Price, ToolRegistry, Usage
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

PRICE = Price(input_per_mtok=1, output_per_mtok=1)
DEADLINE = 0.5
"""Real seconds.  The child must reply and reach its tool within ``DEADLINE - MARGIN`` of the parent's start: measured
5 ms (median, 15 ms at most) idle and 13 ms (35 ms) beside three CPU hogs, so 0.4 s is ten times the worst seen (0.15 s
was too little beside a whole suite running twice over)."""
MARGIN = 0.1
WAIT = 30.0
"""How long a hung call waits for the test to let it go; the test always does, well before."""
LEASE = 0.5
"""A dead owner's lease: short, so the resumed parent takes its child over soon."""

Block = Literal["tool", "model"] | None


class Calls:
    """Every model call made (``<who> made``) and every reply's usage (``<who> <in> <out>``), one line each."""

    def __init__(self, log: Path, block: Block = None) -> None:
        self.log = log
        self.block = block
        self.release = threading.Event()
        self.stopped = threading.Event()  # a helper run stopped (cancelled, or at a deadline)
        self.lock = threading.RLock()  # first_tool_call writes while holding it
        self.tools = 0

    def let_go(self) -> None:
        """Let the hung call go, once the cut child's run has stopped: its thread then runs nothing more.

        The sync driver's child goes on in its thread after the parent's cut
        until its own deadline stops it; let go before that, it would make
        its next model call, which nobody counts.
        """
        self.stopped.wait(WAIT)
        self.release.set()

    def write(self, line: str) -> None:
        with self.lock, self.log.open("a", encoding="utf-8") as file:
            file.write(line + "\n")

    def lines(self) -> list[str]:
        return self.log.read_text(encoding="utf-8").splitlines() if self.log.exists() else []

    def made(self, who: str) -> int:
        """Count a model call of ``who`` as it starts; return how many ``who`` made, this one included."""
        self.write(f"{who} made")
        return self.count(who)

    def count(self, who: str) -> int:
        return sum(1 for line in self.lines() if line == f"{who} made")

    def replies(self, who: str | None = None) -> list[Usage]:
        """The usage of each reply ``who``'s model gave (None: every model's), in order."""
        found = [line.split() for line in self.lines()]
        return [
            Usage(int(parts[1]), int(parts[2]))
            for parts in found
            if len(parts) == 3 and (who is None or parts[0] == who)  # who, input tokens, output tokens
        ]

    def total(self) -> Usage:
        """Every reply's tokens, each once, and their cost at ``PRICE``."""
        usages = self.replies()
        spent_in, spent_out = sum(u.input_tokens for u in usages), sum(u.output_tokens for u in usages)
        return Usage(spent_in, spent_out, cost=(spent_in + spent_out) * 1e-6)

    def answered(self, who: str, response: ModelResponse) -> ModelResponse:
        usage = response.usage or Usage()
        self.write(f"{who} {usage.input_tokens} {usage.output_tokens}")
        return response

    def first_tool_call(self) -> bool:
        with self.lock:
            self.tools += 1
            self.write("tool")
            return self.tools == 1 and self.block == "tool"


class ParentModel:
    """Asks its sub-agents in one reply (taking ``MARGIN`` seconds), then answers; by its history, so any owner goes on.

    ``asks`` names each sub-agent tool and the id of its call: the ``helper`` as ``c1`` unless told otherwise.
    """

    def __init__(self, calls: Calls, asks: Sequence[tuple[str, str]] = (("helper", "c1"),)) -> None:
        self.calls, self.asks = calls, asks

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.calls.made("parent")
        if not any(m.role == "assistant" for m in messages):
            time.sleep(MARGIN)
            asked = [tool_call(name, id=call_id, input="look it up") for name, call_id in self.asks]
            return self.calls.answered("parent", tool_turn(*asked, usage=Usage(10, 1)))
        return self.calls.answered("parent", reply("done", usage=Usage(2, 2)))


class QuickModel:
    """A sub-agent's model that answers at once (7 + 3 tokens), on record as ``quick``."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.calls.made("quick")
        return self.calls.answered("quick", reply("quick answer", usage=Usage(7, 3)))


class ChildModel:
    """Asks for ``wait`` (500 + 50 tokens), then answers (1 + 1); with ``block="model"`` its first call hangs."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def _answer(self, messages: Sequence[Message]) -> ModelResponse:
        if any(m.role == "tool" for m in messages):
            return self.calls.answered("child", reply("found", usage=Usage(1, 1)))
        return self.calls.answered("child", tool_turn(tool_call("wait", id="s1"), usage=Usage(500, 50)))

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if self.calls.made("child") == 1 and self.calls.block == "model":
            self.calls.release.wait(WAIT)
            raise ConnectionError("let go after the cut: this reply never came")
        return self._answer(messages)

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if self.calls.made("child") == 1 and self.calls.block == "model":
            await asyncio.Event().wait()  # cancelled by the parent's deadline
        return self._answer(messages)


def child_tools(calls: Calls, driver: str) -> ToolRegistry:
    """The child's ``wait``: hangs the first time if ``block="tool"`` (until cancelled, or let go), else answers."""
    tools = ToolRegistry()
    if driver == "sync":

        def wait() -> str:
            """Wait for the thing to arrive."""
            if calls.first_tool_call():
                calls.release.wait(WAIT)
            return "arrived"

    else:

        async def wait() -> str:
            """Wait for the thing to arrive."""
            if calls.first_tool_call():
                await asyncio.Event().wait()  # cancelled by the parent's deadline
            return "arrived"

    tools.register(wait)
    return tools


def parent_agent(
    calls: Calls, driver: str, asks: Sequence[tuple[str, str]] = (("helper", "c1"),), **options: Any
) -> Agent:
    """The parent, with the ``helper`` and ``quick`` sub-agents; a helper run that stops sets ``calls.stopped``."""
    child = Agent(ChildModel(calls), child_tools(calls, driver), prices=PRICE, clock=ManualClock())
    child.on("failed", lambda event: calls.stopped.set())
    quick = Agent(QuickModel(calls), ToolRegistry(), prices=PRICE, clock=ManualClock())
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    tools.register(quick.as_tool("quick", "Answers at once."))
    return Agent(ParentModel(calls, asks), tools, timeout=DEADLINE, prices=PRICE, clock=ManualClock(), **options)
