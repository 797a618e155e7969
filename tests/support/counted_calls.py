"""Tools that count each execution by call id, and a run driven to its end on either driver, stopped or not.

Why shared: the watching tests (hooks, the JSON Lines log, OpenTelemetry)
compare the events heard with what really ran, on both drivers alike.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from fsm_agent import Agent, AgentLoopError, RunResult, ToolRegistry


class Counted:
    """Tools that count each execution by call id; ``slow`` hangs for the ids in ``hang``; ``ctrl_c`` is a Ctrl-C."""

    def __init__(self) -> None:
        self.ran: Counter[str] = Counter()
        self.hang: set[str] = set()
        """Call ids of ``slow`` that hang this time (then run through on a later execution)."""
        self.registry = ToolRegistry()
        ran, hang = self.ran, self.hang

        @self.registry.register
        async def quick(n: int, call_id: str) -> int:
            """Return n at once."""
            ran[call_id] += 1
            return n

        @self.registry.register
        async def slow(call_id: str) -> str:
            """Hang while the call id is in ``hang``."""
            ran[call_id] += 1
            if call_id in hang:
                await asyncio.Event().wait()
            return "late"

        @self.registry.register
        def fail(reason: str, call_id: str) -> str:
            """Always fail, for ``reason``."""
            ran[call_id] += 1
            raise ValueError(reason)

        @self.registry.register
        def ctrl_c(call_id: str) -> str:
            """A Ctrl-C while the tool runs."""
            ran[call_id] += 1
            raise KeyboardInterrupt

        @self.registry.register
        def send(to: str, call_id: str) -> str:
            """Send a report."""
            ran[call_id] += 1
            return f"sent to {to}"


def drive(agent: Agent, driver: str, **keywords: Any) -> RunResult:
    """The run of ``agent`` on ``driver``, to its end: its result, or the stopped one ``AgentLoopError`` carries."""
    try:
        return agent.run("q", **keywords) if driver == "sync" else asyncio.run(agent.arun("q", **keywords))
    except AgentLoopError as stop:
        return stop.result


def finish(run: Any, driver: str) -> RunResult:
    """``run`` finished on ``driver``: its result, or the stopped one ``AgentLoopError`` carries."""
    try:
        return run.finish() if driver == "sync" else asyncio.run(run.afinish())
    except AgentLoopError as stop:
        return stop.result
