"""An MCP call in flight when the agent's process is killed (SIGKILL): a new owner makes only that call again.

docs/how-to/mcp.md "Exactly once": a completed call is kept in the run by
its call id, so a resumed run never sends it to the server again;
docs/concepts/exactly-once.md: a process killed mid-batch makes only the
calls still in flight again.  The audit server (``tests/support/mcp_audit_server.py``)
counts each call on its side; the agent's process is killed for real while
``hang`` waits on the server and ``bump``'s outcome is stored.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from support.exactly_once import ataken_over, taken_over
from support.exactly_once_audit import LEASE, WAIT, McpBatch, keys_named, mcp_run_until_killed, mcp_tools
from support.sdk import skip_unless_installed
from support.store_cases import child_process, durable_calls

from fsm_agent import Agent, RunResult
from fsm_agent.persist import open_store

skip_unless_installed("mcp", reason="the mcp extra is not installed: pip install -e '.[mcp]'")


def _counted(counts: Path) -> dict[str, int]:
    return json.loads(counts.read_text()) if counts.exists() else {}


def _bump_durable_and_hang_started(target: str, counts: Path) -> bool:
    if _counted(counts).get("h:started", 0) < 1:
        return False
    with open_store(target) as store:
        try:
            return "b1" in durable_calls(store.load("r"))
        except KeyError:
            return False


def _resumed(target: str, driver: str, tools: Any) -> RunResult:
    agent = Agent(McpBatch(), tools, max_concurrency=2)
    with open_store(target, lease=LEASE) as store:
        if driver == "sync":
            return taken_over(lambda: agent.resume(store.load("r"), store=store)).finish()

        async def go() -> RunResult:
            async def claim() -> Any:
                return await agent.aresume(await store.aload("r"), store=store)

            run = await ataken_over(claim)
            result: RunResult = await run.afinish()
            return result

        return asyncio.run(go())


@pytest.mark.subprocess
@pytest.mark.parametrize("resumer", ["sync", "async"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_mcp_batch_whose_process_is_killed_mid_call_is_finished_by_a_new_owner_sending_bump_once(
    store_target: str, tmp_path: Path, driver: str, resumer: str
) -> None:
    counts = tmp_path / "counts.json"
    process = child_process(mcp_run_until_killed, store_target, driver, str(counts), "call")
    process.start()
    deadline = time.monotonic() + WAIT
    while not _bump_durable_and_hang_started(store_target, counts):
        assert process.is_alive(), "the agent's process ended before it was killed"
        assert time.monotonic() < deadline, f"bump never became durable: {_counted(counts)}"
        time.sleep(0.02)
    assert process.pid is not None
    process.kill()  # SIGKILL: no cleanup, no lease given up, hang still in flight on the server
    process.join(WAIT)
    assert process.exitcode == -signal.SIGKILL
    assert _counted(counts) == {"a": 1, "h:started": 1}

    with mcp_tools(str(counts)) as tools:
        result = _resumed(store_target, resumer, tools)
    assert result.final == "1 | h finished after 1"
    assert _counted(counts) == {"a": 1, "h:started": 2, "h": 1}  # bump never sent again; hang made again
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == ["b1", "h1"]
    # The killed process's request and the new owner's named the same run, start and call: a server can key its
    # effect by them.
    named, starts = keys_named(counts)
    assert named == {"a": ["r b1"], "h": ["r h1", "r h1"]}
    assert len(starts) == 1
    assert starts != {"None"}
