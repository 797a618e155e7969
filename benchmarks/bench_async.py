"""The async driver: per-step cost against the sync one, 10,000 concurrent runs, and a parallel tool turn.

Printed figures are medians or totals measured here, in this process; the
concurrency figures show that runs do not wait on each other (attaching a run
costs the same whatever the number of live runs) and that the calls of one
turn overlap.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence

from benchmarks.targets import record
from fsm_agent import Agent, Message, ModelResponse, ToolCall, ToolRegistry
from fsm_agent.testing import reply, tool_turn
from fsm_agent.tools import JSONSchema

TOOL_TURNS = 8


class SleepyModel:
    """Sleeps ``delay`` per call, then asks for the next echo; answers after ``turns`` tool turns."""

    def __init__(self, turns: int, delay: float) -> None:
        self.turns = turns
        self.delay = delay

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        raise NotImplementedError("async only")

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if self.delay:
            await asyncio.sleep(self.delay)
        done = sum(1 for m in messages if m.role == "assistant")
        if done < self.turns:
            return tool_turn(ToolCall(f"c{done}", "aecho", {"text": f"turn {done}"}))
        return reply("done")


class SyncScript:
    """The same workload for the sync driver."""

    def __init__(self, turns: int) -> None:
        self.turns = turns

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        done = sum(1 for m in messages if m.role == "assistant")
        if done < self.turns:
            return tool_turn(ToolCall(f"c{done}", "echo", {"text": f"turn {done}"}))
        return reply("done")


def registry() -> ToolRegistry:
    """``echo`` (sync) and ``aecho`` (async) tools, plus ``nap``: an async 50 ms wait."""
    tools = ToolRegistry()

    @tools.register
    def echo(text: str) -> str:
        """Return the text."""
        return text

    @tools.register
    async def aecho(text: str) -> str:
        """Return the text, asynchronously."""
        return text

    @tools.register
    async def nap(n: int) -> int:
        """Wait 50 ms."""
        await asyncio.sleep(0.05)
        return n

    return tools


def per_step(rounds: int = 15, runs: int = 300) -> tuple[float, float]:
    """Median µs per model turn of the sync and the async driver on the same instant workload."""
    tools = registry()
    sync_agent = Agent(SyncScript(TOOL_TURNS), tools, max_steps=TOOL_TURNS + 1)
    async_agent = Agent(SleepyModel(TOOL_TURNS, 0), tools, max_steps=TOOL_TURNS + 1)
    turns = TOOL_TURNS + 1

    async def async_batch() -> None:
        for _ in range(runs):
            await async_agent.arun("go")

    sync_times, async_times = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(runs):
            sync_agent.run("go")
        sync_times.append((time.perf_counter() - start) / runs / turns * 1e6)
        start = time.perf_counter()
        asyncio.run(async_batch())
        async_times.append((time.perf_counter() - start) / runs / turns * 1e6)
    return statistics.median(sync_times), statistics.median(async_times)


async def _many(count: int, delay: float) -> tuple[float, int]:
    agent = Agent(SleepyModel(TOOL_TURNS, delay), registry(), max_steps=TOOL_TURNS + 1)
    start = time.perf_counter()
    results = await asyncio.gather(*(agent.arun(f"run {i}") for i in range(count)))
    elapsed = time.perf_counter() - start
    return elapsed, sum(1 for r in results if r.final == "done")


def concurrent_runs(count: int = 10_000, delay: float = 0.01) -> tuple[float, int, float, float]:
    """(seconds, runs finished, peak RSS growth per run in KiB, peak traced Python memory per run in KiB)."""
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    elapsed, finished = asyncio.run(_many(count, delay))
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / count
    sample = 1_000
    tracemalloc.start()
    asyncio.run(_many(sample, delay))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return elapsed, finished, rss, peak / sample / 1024


def parallel_turn(rounds: int = 5) -> float:
    """Median ms for one turn of eight 50 ms async tool calls plus the final answer."""
    calls = [ToolCall(f"n{i}", "nap", {"n": i}) for i in range(8)]

    class OneTurn:
        def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
            raise NotImplementedError("async only")

        async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
            return reply("done") if any(m.role == "tool" for m in messages) else tool_turn(*calls)

    agent = Agent(OneTurn(), registry())
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        asyncio.run(agent.arun("go"))
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    """Print the async figures; exit 1 if a run did not finish or the parallel turn ran serially."""
    sync_us, async_us = per_step()
    print(
        f"per model turn ({TOOL_TURNS} tool turns + answer): sync {sync_us:.1f} µs, async {async_us:.1f} µs, "
        f"async/sync {async_us / sync_us:.2f}"
    )
    elapsed, finished, rss_kib, traced_kib = concurrent_runs()
    print(
        f"10,000 concurrent arun (10 ms per model call, {TOOL_TURNS} tool turns): {finished} finished in "
        f"{elapsed:.1f} s = {finished / elapsed:.0f} runs/s; peak memory per run: {traced_kib:.1f} KiB traced "
        f"(1,000-run sample), {rss_kib:.1f} KiB RSS growth"
    )
    record("async driver / sync driver, per model turn", async_us / sync_us, 1.3)
    turn_ms = parallel_turn()
    print(f"one turn of 8 async tool calls of 50 ms each: {turn_ms:.0f} ms (serial would be 400 ms)")
    return 0 if finished == 10_000 and turn_ms < 200 else 1


if __name__ == "__main__":
    sys.exit(main())
