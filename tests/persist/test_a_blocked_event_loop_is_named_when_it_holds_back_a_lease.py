"""An async tool that blocks the event loop past a run's lease is named in a warning: it held back the renewals.

The async driver renews a stored run's lease from a task on the run's
loop, so an ``async def`` tool that blocks the loop (``time.sleep``, a
blocking client) holds back the renewal of every run on it; past the
lease, another owner may take a run over and make its call in flight
again.  Nothing else would say why, so the late renewal is logged.  A
plain ``def`` tool runs on a thread and holds nothing back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from fsm_agent import Agent, SqliteStore, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


def _agent(blocking: bool, seconds: float) -> Agent:
    tools = ToolRegistry()
    if blocking:

        @tools.register
        async def pay(amount: int) -> str:
            """Pay, the wrong way for async code: the loop is blocked meanwhile."""
            time.sleep(seconds)
            return "paid"

    else:

        @tools.register
        def pay(amount: int) -> str:
            """Pay, on a thread of its own."""
            time.sleep(seconds)
            return "paid"

    return Agent(FakeModel(tool_turn(tool_call("pay", id="p1", amount=5)), reply("done")), tools)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if "event loop was blocked" in record.getMessage()]


def test_an_async_tool_blocking_the_loop_past_the_lease_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fsm_agent")
    with SqliteStore(tmp_path / "runs.db", lease=0.6) as store:
        result = asyncio.run(_agent(blocking=True, seconds=1.5).arun("go", store=store, run_id="r1"))
    assert result.final == "done"  # nobody took the run over here: it still ends
    (warning,) = _warnings(caplog)
    assert "'r1'" in warning
    assert "asyncio.to_thread" in warning


def test_a_plain_tool_as_long_holds_back_no_renewal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fsm_agent")
    with SqliteStore(tmp_path / "runs.db", lease=1.5) as store:
        result = asyncio.run(_agent(blocking=False, seconds=1.2).arun("go", store=store, run_id="r1"))
    assert result.final == "done"
    assert _warnings(caplog) == []
