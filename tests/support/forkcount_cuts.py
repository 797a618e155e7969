"""Forks of runs whose ``helper`` sub-agent call was cut by a cancel: taken, driven, cut again, read back.

The tree is ``support.prepaid_cuts``'s: the parent asks ``helper`` for
``c1``; the helper does ``work`` (1), asks ``deep`` (2), ``wait`` (3) and
``work`` (4); the deep run ``work`` (1), ``wait`` (2) and ``work`` (3).  A
fork is driven here on either driver, to its end, or until a cancel (from
``support.cancelled_with_parent.Canceller``) cuts it while a held ``wait``
is in flight.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fsm_agent import AgentLoopError, AgentRun, CancelToken, RunResult
from support.cancelled_with_parent import Canceller
from support.prepaid_cuts import HELPER_SCRIPT, parent_agent
from support.storeless_children import Counts


def as_json(data: Any) -> dict[str, Any]:
    """``data`` through a JSON round trip, as a store or a file would hand it back."""
    return json.loads(json.dumps(data))


def tool_calls(data: Any) -> int:
    """A run's ``tool_calls`` as its snapshot says, through JSON."""
    return int(as_json(data)["counters"]["tool_calls"])


def answered_at(data: dict[str, Any]) -> int:
    """The transition just after the source's first recorded tool outcome (its ``helper`` call answered)."""
    return next(i for i, entry in enumerate(data["trace"]) if entry["trigger"] == "tool_done")


def fork_driven(
    counts: Counts,
    driver: str,
    source: Any,
    at: int,
    *,
    store: Any = None,
    script: Any = HELPER_SCRIPT,
    cut: bool = False,
) -> tuple[RunResult, int]:
    """A fork of ``source`` after ``at`` (stored as ``f`` when ``store``), driven to its end, or cut when ``cut``.

    Returns its result and the ``tool_calls`` its rebuilt run held before it
    went on (what the fork counted of the source's history).  When ``cut``,
    a cancel comes while the next held ``wait`` is in flight.
    """
    agent, token = parent_agent(counts, driver, script), CancelToken()
    run_id = None if store is None else "f"

    def drive(run: AgentRun) -> RunResult:
        try:
            return run.finish()
        except AgentLoopError as stop:
            return stop.result

    async def adrive() -> tuple[RunResult, int]:
        run = await agent.afork(source, at, store=store, run_id=run_id, cancel=token)
        rebuilt = tool_calls(run.snapshot())
        try:
            return await run.afinish(), rebuilt
        except AgentLoopError as stop:
            return stop.result, rebuilt

    def go() -> tuple[RunResult, int]:
        if driver == "async":
            return asyncio.run(adrive())
        run = agent.fork(source, at, store=store, run_id=run_id, cancel=token)
        rebuilt = tool_calls(run.snapshot())
        return drive(run), rebuilt

    if not cut:
        counts.hold = False
        return go()
    counts.arm()
    with Canceller(counts, token, 1) as canceller:
        result, rebuilt = go()
    assert canceller.done.is_set(), "the cancel came while the held wait was in flight"
    assert result.reason == "cancelled"
    return result, rebuilt
