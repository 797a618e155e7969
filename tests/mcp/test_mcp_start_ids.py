"""A server keying its effect by run, start and call (``fsm-agent/start_id``) makes a resumed call once and a new run's.

The server is real (``tests/support/mcp_audit_server.py``'s ``once`` tools,
on the SDK): it counts each request it was sent and each effect it made.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.sdk import skip_unless_installed

from fsm_agent import Agent, AgentLoopError, ForkEdit, Message, ModelResponse, ToolCall, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

skip_unless_installed("mcp", reason="the mcp extra is not installed: pip install -e '.[mcp]'")

SERVER = Path(__file__).parent.parent / "support" / "mcp_audit_server.py"
DRIVERS = ["sync", "async"]

CUT_AFTER = 2.0
"""The sync driver's cut of ``once_then_hang``, which never answers its first request: its run timeout.  From a run's
start to such a call in flight took at most 0.25 s in 20 cuts under ``.ci/under-load`` (the same server and tools,
``test_mcp_cut_calls_and_changing_servers.SYNC_TIMEOUT``), so 2 s leaves eight times the worst seen."""

LIFTED = 3600.0
"""The timeout a resume gives a run cut at its own, so the stop is lifted."""


def _tools(counts: Path) -> Any:
    from fsm_agent.mcp import stdio_tools

    return stdio_tools(sys.executable, [str(SERVER)], {"FSM_AGENT_TEST_COUNTS": str(counts)})


def _counted(counts: Path) -> dict[str, int]:
    return json.loads(counts.read_text()) if counts.exists() else {}


def _model(tool: str) -> FakeModel:
    return FakeModel(tool_turn(tool_call(tool, id="o1", label="o")), reply("ok"))


def _run(agent: Agent, driver: str, **how: Any) -> Any:
    if driver == "sync":
        return agent.run("go", **how)
    return asyncio.run(agent.arun("go", **how))


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_started_again_under_its_id_makes_its_call_whose_id_the_old_run_used(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """overwrite=True is a new start: the same run id and call id, and still a new effect on a keying server."""
    counts = tmp_path / "counts.json"
    with _tools(counts) as tools, open_store(store_target) as store:
        first = _run(Agent(_model("once"), tools), driver, store=store, run_id="r")
        again = _run(Agent(_model("once"), tools), driver, store=store, run_id="r", overwrite=True)
        stored = store.load("r")
    assert first.final == again.final == "ok"
    assert _counted(counts) == {"o:sent": 2, "o": 2}
    assert [m.content for m in again.messages if m.role == "tool"] == ["made"]
    assert stored["start_id"] not in ("", None)


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_without_a_store_started_twice_under_one_id_makes_both_effects(tmp_path: Path, driver: str) -> None:
    counts = tmp_path / "counts.json"
    with _tools(counts) as tools:
        for _ in range(2):
            _run(Agent(_model("once"), tools), driver, run_id="r")
    assert _counted(counts) == {"o:sent": 2, "o": 2}


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_call_cut_after_the_servers_effect_and_resumed_from_its_store_is_made_once(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """The resumed run sends the call under the start its first owner sent it under: the server makes nothing new."""
    counts = tmp_path / "counts.json"
    with _tools(counts) as tools:
        agent = Agent(_model("once_then_hang"), tools, timeout=CUT_AFTER if driver == "sync" else None)
        with open_store(store_target) as store:
            _cut(agent, driver, counts, store=store, run_id="r")
            stored = store.load("r")
        assert (stored["state"], stored["unfinished"]) == ("Failed", "o1")
        assert _counted(counts) == {"o:sent": 1, "o": 1, "o:started": 1}
        with open_store(store_target) as store:
            result = _resume(Agent(FakeModel(reply("ok")), tools), driver, stored, store=store)
    assert result.final == "ok"
    assert [m.content for m in result.messages if m.role == "tool"] == ["made before"]
    assert _counted(counts) == {"o:sent": 2, "o": 1, "o:started": 2}


@pytest.mark.subprocess
def test_a_call_cut_after_the_servers_effect_and_resumed_from_its_snapshot_is_made_once(tmp_path: Path) -> None:
    """Without a store the snapshot carries the start: a resume in another process names it as the first run did."""
    counts = tmp_path / "counts.json"
    with _tools(counts) as tools:
        with pytest.raises(AgentLoopError) as cut:
            Agent(_model("once_then_hang"), tools, timeout=CUT_AFTER).run("go", run_id="r")
        snapshot = cut.value.result.snapshot
        assert snapshot is not None
        carried = json.loads(json.dumps(snapshot))
        result = Agent(FakeModel(reply("ok")), tools).resume(carried, timeout=LIFTED).finish()
    assert [m.content for m in result.messages if m.role == "tool"] == ["made before"]
    assert _counted(counts) == {"o:sent": 2, "o": 1, "o:started": 2}


class _UntilAnswered:
    """Asks for ``call`` until the conversation holds a tool message, then says ``answer``: alike for every start."""

    def __init__(self, call: ToolCall, answer: str) -> None:
        self.call, self.answer = call, answer

    def complete(self, messages: list[Message], tools: list[JSONSchema]) -> ModelResponse:
        return reply(self.answer) if any(m.role == "tool" for m in messages) else tool_turn(self.call)


def _parent(tools: Any, **limits: Any) -> Agent:
    """A parent whose sub-agent ``helper`` calls ``once_then_hang``."""
    child = Agent(_UntilAnswered(tool_call("once_then_hang", id="o1", label="o"), "child ok"), tools)
    registry = ToolRegistry()
    registry.register(child.as_tool("helper", "A helper agent."))
    return Agent(_UntilAnswered(tool_call("helper", id="h", input="x"), "ok"), registry, **limits)


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_sub_agent_started_again_by_its_parents_resume_sends_its_cut_call_under_the_same_start(
    tmp_path: Path, driver: str
) -> None:
    """Without a store a resumed parent starts its child again, whose start comes from the parent's and the call."""
    counts = tmp_path / "counts.json"
    with _tools(counts) as tools:
        with pytest.raises(AgentLoopError) as cut:
            _run(_parent(tools, timeout=CUT_AFTER), driver, run_id="P")
        assert _counted(counts) == {"o:sent": 1, "o": 1, "o:started": 1}
        carried = json.loads(json.dumps(cut.value.result.snapshot))
        result = _resume(_parent(tools), driver, carried)
        # A fork is a new start of the parent, so its child's is new too: the call is made again, on purpose.
        forked = _parent(tools).fork(carried, 2, edit=ForkEdit(limits={"timeout": LIFTED})).finish()
    assert result.final == forked.final == "ok"
    assert _counted(counts) == {"o:sent": 3, "o": 2, "o:started": 3}


def _cut(agent: Agent, driver: str, counts: Path, **how: Any) -> None:
    """Run ``agent`` until its call is in flight on the server, then cut it: at its timeout, or by cancelling it."""
    if driver == "sync":
        with pytest.raises(AgentLoopError):
            agent.run("go", **how)
        return

    async def go() -> None:
        task = asyncio.ensure_future(agent.arun("go", **how))
        while _counted(counts).get("o:started", 0) < 1:
            assert not task.done(), "the run ended before its call was in flight"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())


def _resume(agent: Agent, driver: str, stored: dict[str, Any], **how: Any) -> Any:
    if driver == "sync":
        return agent.resume(stored, retry=True, timeout=LIFTED, **how).finish()

    async def go() -> Any:
        run = await agent.aresume(stored, retry=True, timeout=LIFTED, **how)
        return await run.afinish()

    return asyncio.run(go())
