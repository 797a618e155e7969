"""What the watching audit's tests share: a log file that fails mid-run, a hook slow past the deadline, batches.

Why shared: the audit checks the same runs through several watchers (the
JSON Lines log, hooks, OpenTelemetry, the AG-UI relay), each against what
the tools really ran (``support.counted_calls.Counted``).
"""

from __future__ import annotations

import asyncio
import io
import time
from collections import Counter
from typing import Any

from fsm_agent import Agent, ToolCall, ToolRegistry
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn


class FailingLog(io.StringIO):
    """A text file open for writing whose ``failing_at``-th write fails as a full disk does; the others are kept."""

    def __init__(self, failing_at: int) -> None:
        super().__init__()
        self.failing_at = failing_at
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        if self.writes == self.failing_at:
            raise OSError(28, "No space left on device")
        return super().write(text)


def three_sends() -> tuple[ToolCall, ...]:
    """One turn's three calls of ``Counted``'s ``send``, each with a side effect counted by its call id."""
    return (
        tool_call("send", id="s1", to="a"),
        tool_call("send", id="s2", to="b"),
        tool_call("send", id="s3", to="c"),
    )


def sends_then_answer() -> FakeModel:
    """A model asking for ``three_sends`` in one turn, then answering ``sent``."""
    return FakeModel(tool_turn(*three_sends()), reply("sent"))


class SlowPastTheDeadline:
    """A hook that returns only once ``after`` seconds have passed since it was made (a run's deadline, say).

    Time is read, never asserted on: the hook only makes sure the deadline
    has passed by the time it returns, however busy the machine is.
    """

    def __init__(self, after: float) -> None:
        self.until = time.monotonic() + after
        self.called = 0

    def __call__(self, event: Any) -> None:
        self.called += 1
        while time.monotonic() < self.until:
            time.sleep(0.02)


def sends_taking_a_while(ran: Counter[str], seconds: float) -> ToolRegistry:
    """A registry whose ``send`` takes ``seconds`` after it has sent (its answer on the way back, as a real one's).

    Each execution is counted in ``ran`` by call id as it starts: a send
    that started has happened, whatever cuts the run meanwhile.
    """
    registry = ToolRegistry()

    @registry.register
    async def send(to: str, call_id: str) -> str:
        """Send a report to ``to``."""
        ran[call_id] += 1
        await asyncio.sleep(seconds)
        return f"sent to {to}"

    return registry


def batch_stopped_beside_a_sub_agent(registry: Any) -> Agent:
    """Four calls in one turn on ``Counted``'s registry: two failures stop the run; a sub-agent and ``quick`` beside.

    On the async driver the four run at once; the run stops ``tool_failures``
    at the second failure's transition, and the sub-agent's call (``h3``) and
    ``quick`` (``q4``) are kept as ``also_ran``: they ran to their end.
    """
    child = Agent(FakeModel(reply("child says hi")), demo_registry())
    registry.register(child.as_tool("helper", "Helps."))
    calls = (
        tool_call("fail", id="f1", reason="a"),
        tool_call("fail", id="f2", reason="b"),
        tool_call("helper", id="h3", input="go"),
        tool_call("quick", id="q4", n=4),
    )
    return Agent(
        FakeModel(tool_turn(*calls), reply("x")),
        registry,
        max_consecutive_failures=2,
        on_stop={"tool_failures": "return"},
    )
