"""A parallel batch's outcomes are each written as they return, even one that returns while a sibling's is written.

The async driver writes a call's outcome the moment it returns, so a crash
before the batch's transitions makes no finished call again.  A write is in
flight for a while (a real store, on another thread or connection); a call
that returns meanwhile must get a write of its own.  Here the first outcome's
write is held until the second call has returned, then the run is cut (as a
crash would cut it) just before the batch's transitions are written, and a
new owner finishes it: every tool runs exactly once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from support.exactly_once import LEASE, ataken_over, taken_over
from support.store_cases import durable_calls

from fsm_agent import Agent, AgentRun, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Crash(BaseException):
    """The process dying between two writes: nothing of the run's code catches it."""


class TwoCalls:
    """Asks for ``quick`` and ``slow`` in one reply, then answers with what they returned."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        results = sorted(m.content for m in messages if m.role == "tool")
        if not results:
            return tool_turn(tool_call("quick", id="q"), tool_call("slow", id="s"))
        return reply("done: " + ", ".join(results))


def _agent(effects: Counter[str], quick_written: asyncio.Event | None) -> Agent:
    tools = ToolRegistry()

    @tools.register
    async def quick() -> str:
        """Count a side effect and return at once."""
        effects["quick"] += 1
        return "quick ok"

    @tools.register
    async def slow() -> str:
        """Count a side effect once ``quick``'s outcome is being written."""
        if quick_written is not None:
            await quick_written.wait()
        effects["slow"] += 1
        return "slow ok"

    return Agent(TwoCalls(), tools, max_concurrency=2)


def _held_and_cut(store: Any, run: dict[str, AgentRun], quick_written: asyncio.Event) -> list[set[str]]:
    """Hold the write of ``quick``'s outcome until ``slow`` returned; crash at the batch's first transition's write.

    Returns, for each write made while the batch was in flight, the calls whose outcomes the store held after it.
    """
    append = store.aappend
    durable: list[set[str]] = []

    async def held(entry: Any, **options: Any) -> Any:
        position = run["run"].position
        if any(edge.source == "ExecuteTool" for edge in position.at.trace):
            raise Crash  # the batch is over: the first write since (before the next model call) never happens
        ran = position.calls.ran
        if "q" in ran and "s" not in ran:  # quick's outcome: slow returns while it is being written
            quick_written.set()
            while "s" not in ran:
                await asyncio.sleep(0.001)
        written = await append(entry, **options)
        if ran:
            durable.append(durable_calls(await store.aload(run["id"])))
        return written

    store.aappend = held
    return durable


@pytest.mark.slow
@pytest.mark.parametrize("resumer", ["sync", "async"])
def test_a_call_that_returns_while_a_siblings_outcome_is_written_gets_its_own_write_and_never_runs_again(
    store_target: str, resumer: str
) -> None:
    """Both outcomes are in the store before the batch's transitions; the new owner runs neither tool again."""
    effects: Counter[str] = Counter()

    async def cut(store: Any) -> list[set[str]]:
        quick_written = asyncio.Event()
        run: dict[str, Any] = {"id": "batch"}
        durable = _held_and_cut(store, run, quick_written)
        run["run"] = await _agent(effects, quick_written).astart("go", store=store, run_id="batch")
        with pytest.raises(Crash):
            await run["run"].afinish()
        return durable

    store = open_store(store_target, lease=LEASE)
    durable = asyncio.run(cut(store))
    store.close()
    assert effects == {"quick": 1, "slow": 1}

    with open_store(store_target, lease=LEASE) as store:
        agent = _agent(effects, None)
        if resumer == "sync":
            result = taken_over(lambda: agent.resume(store.load("batch"), store=store)).finish()
        else:

            async def go() -> RunResult:
                async def claim() -> AgentRun:
                    return await agent.aresume(await store.aload("batch"), store=store)

                return await (await ataken_over(claim)).afinish()

            result = asyncio.run(go())
    assert result.final == 'done: "quick ok", "slow ok"'
    assert effects == {"quick": 1, "slow": 1}  # the new owner ran neither again
    assert durable[-1] == {"q", "s"}  # each outcome was written before the batch ended
