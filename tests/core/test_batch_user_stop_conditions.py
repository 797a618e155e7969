"""A user's ``Dispatch`` stop condition stops the run before the next call of a parallel batch, on both drivers.

The async driver plans which calls of a turn run together by walking
``Dispatch`` on a copy of the run that has only each earlier call counted;
a user's check there, which reads the run's messages, saw none of the first
call's result, cleared the second call, and it ran in parallel.  The replay
then stopped before it, so the trace showed no ``Dispatch->ExecuteTool`` for
a call that ran.  With an opaque guard on ``Dispatch`` a batch is its first
call alone, and the check is asked before each call with the real run, as
on the sync driver; the built-in declared guards keep their parallel plan.
"""

from __future__ import annotations

import asyncio

import pytest

from fsm_agent import Agent, AgentLoopError, RunView, StopCondition, ToolRegistry
from fsm_agent.records import RunResult
from fsm_agent.testing import FakeModel, edge_id, reply, tool_call, tool_turn


def _refunds(ran: list[str], *, stop: bool = True) -> Agent:
    """A lookup then a refund in one reply; a Dispatch check stops after a tool reported a locked account."""
    tools = ToolRegistry()

    def lookup(account: str) -> str:
        """Look an account up."""
        ran.append("lookup")
        return "account locked"

    def refund(account: str, amount: float) -> str:
        """Refund an amount."""
        ran.append("refund")
        return "refunded"

    tools.register(lookup)
    tools.register(refund)

    def locked(view: RunView) -> bool:
        """A tool reported a locked account: no call after that."""
        return any(m.role == "tool" and "locked" in m.content for m in view.messages)

    model = FakeModel(
        tool_turn(tool_call("lookup", account="A"), tool_call("refund", account="A", amount=5.0)), reply("ok")
    )
    conditions = [StopCondition("account_locked", "Dispatch", locked)] if stop else []
    return Agent(model, tools, stop_conditions=conditions)


def _ended(agent: Agent, driver: str) -> RunResult:
    try:
        return agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    except AgentLoopError as stop:
        return stop.result


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_dispatch_to_failed_on_a_user_condition_stops_before_the_batchs_second_call(driver: str) -> None:
    """Dispatch->Failed[account_locked]: the check reads the first call's result and the second call never runs;
    every tool execution has its Dispatch->ExecuteTool edge in the trace."""
    ran: list[str] = []
    result = _ended(_refunds(ran), driver)
    trace = [edge_id(edge) for edge in result.trace]
    assert trace[-1] == "Dispatch->Failed[account_locked]"
    assert ran == ["lookup"], f"the run stopped before 'refund' ({trace}), yet {ran} ran"
    assert trace.count("Dispatch->ExecuteTool") == len(ran) == 1


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_without_a_user_condition_both_calls_of_the_batch_run(driver: str) -> None:
    """Dispatch->ExecuteTool twice: with only built-in guards on Dispatch, the batch's calls all run and the run
    answers."""
    ran: list[str] = []
    result = _ended(_refunds(ran, stop=False), driver)
    assert result.final == "ok"
    assert sorted(ran) == ["lookup", "refund"]
    assert [edge_id(edge) for edge in result.trace].count("Dispatch->ExecuteTool") == 2


def _peak_in_flight(conditions: list[StopCondition]) -> int:
    """How many of a reply's three async tool calls were in flight at once on the async driver."""
    tools = ToolRegistry()
    in_flight = peak = 0

    async def wait(n: int) -> str:
        """Waits a moment."""
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return f"waited {n}"

    tools.register(wait)
    model = FakeModel(tool_turn(*[tool_call("wait", n=n) for n in range(3)]), reply("ok"))
    agent = Agent(model, tools, stop_conditions=conditions)
    assert asyncio.run(agent.arun("q")).final == "ok"
    return peak


def never(view: RunView) -> bool:
    """A user's check that never stops the run."""
    return False


def test_a_user_check_on_dispatch_runs_the_batch_one_call_at_a_time_and_built_in_guards_in_parallel() -> None:
    """Only the real run can answer a user's check, so each call waits for the one before; the plan over the
    built-in declared guards is kept, the three calls run together."""
    assert _peak_in_flight([]) == 3
    assert _peak_in_flight([StopCondition("never", "Dispatch", never)]) == 1
    assert _peak_in_flight([StopCondition("never", "ExecuteTool", never)]) == 3
