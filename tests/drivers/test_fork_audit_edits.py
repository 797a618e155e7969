"""``ForkEdit``: what the fork goes on from is its edited position, with every side effect counted.

fork-a-run.md: "``edit=ForkEdit(...)`` changes the fork's position before
it goes on: ``results`` a tool result (by the source's call id),
``messages`` a message (by index, a ``Message`` or a new text) ...".  So
the fork must act on the edited history: the call an edited reply asks for
is the call made, the answer an edited reply gives is the answer, and a
failed result edited into a success counts as one.  Every tool counts its
executions, so a call made with the source's arguments instead of the
edited ones shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.by_turn import ByTurn

from fsm_agent import (
    Agent,
    AgentLoopError,
    AgentRun,
    ForkEdit,
    Message,
    ModelResponse,
    RunResult,
    RunView,
    SqliteStore,
    StopCondition,
    ToolCall,
    ToolRegistry,
)
from fsm_agent.testing import reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class Made:
    """Every tool execution, in order, as (tool, argument)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def registry(self) -> ToolRegistry:
        tools = ToolRegistry()

        def send(to: str) -> str:
            """Send a message: an effect in the world."""
            self.calls.append(("send", to))
            return f"sent {to}"

        def boom(x: str) -> str:
            """Always fails."""
            self.calls.append(("boom", x))
            raise RuntimeError(f"boom {x}")

        tools.register(send)
        tools.register(boom)
        return tools


def forked(agent: Agent, driver: str, source: Any, at: int, **keywords: Any) -> RunResult:
    """``agent.fork`` (or ``afork``) of ``source`` at ``at``, driven to its end: its result, a stopped one too."""

    async def aforked() -> RunResult:
        run: AgentRun = await agent.afork(source, at, **keywords)
        return await run.afinish()

    try:
        return agent.fork(source, at, **keywords).finish() if driver == "sync" else asyncio.run(aforked())
    except AgentLoopError as stop:
        return stop.result


TWO_SENDS: Sequence[ModelResponse] = [
    tool_turn(tool_call("send", id="s1", to="ada"), tool_call("send", id="s2", to="bob")),
    reply("both sent"),
]


@pytest.mark.parametrize("rerun", [None, {"s2"}], ids=["reused", "rerun"])
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("at", [1, 3], ids=["before-the-batch", "inside-the-batch"])
def test_an_edited_tool_call_still_to_be_made_is_the_call_the_fork_makes(
    tmp_path: Path, driver: str, at: int, rerun: set[str] | None
) -> None:
    """The reply's second call edited from send(bob) to send(zoe) while it is still pending: zoe is sent, once.

    At 1 (CheckTruncation->Dispatch) both calls are pending; at 3
    (ExecuteTool->Dispatch) s1 is done and s2 pending.  The source never
    sent to zoe, so nothing of the source's can be reused for it; with
    ``rerun={"s2"}`` the fork sends for real, and it must be to zoe.
    """
    with SqliteStore(tmp_path / "runs.db") as store:
        Agent(ByTurn(TWO_SENDS), Made().registry()).run("go", store=store, run_id="src")
        made = Made()
        edited = Message(
            "assistant", "", tool_calls=(ToolCall("s1", "send", {"to": "ada"}), ToolCall("s2", "send", {"to": "zoe"}))
        )
        result = forked(
            Agent(ByTurn(TWO_SENDS), made.registry()),
            driver,
            "src",
            at,
            store=store,
            run_id="f",
            edit=ForkEdit(messages={1: edited}),
            rerun=rerun,
        )
    assert [c.arguments for c in result.messages[1].tool_calls] == [{"to": "ada"}, {"to": "zoe"}]
    assert made.calls == [("send", "zoe")]
    assert [m.content for m in result.messages if m.role == "tool"] == ['"sent ada"', '"sent zoe"']


def _leaks(view: RunView) -> bool:
    return view.last_response is not None and "sk-" in view.last_response.message.content


LEAK_GUARD = [StopCondition("leaked_key", "answer", _leaks, "the answer holds an API key", policy="return")]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("at", [4, 5], ids=["after-the-reply", "at-dispatch"])
def test_an_edited_answer_is_the_answer_the_fork_checks_and_ends_with(driver: str, at: int) -> None:
    """The source's answer leaked a key and tripped the guardrail; the fork's edited answer has none: it is Done."""
    made = Made()
    script = [tool_turn(tool_call("send", id="s1", to="ada")), reply("your key is sk-123")]
    source = Agent(ByTurn(script), made.registry(), stop_conditions=LEAK_GUARD).run("go")
    assert source.reason == "leaked_key"
    made.calls.clear()
    agent = Agent(ByTurn(script), made.registry(), stop_conditions=LEAK_GUARD)
    result = forked(agent, driver, source, at, edit=ForkEdit(messages={3: "the key is in your vault"}))
    assert result.messages[3].content == "the key is in your vault"
    assert (result.reason, result.final) == ("done", "the key is in your vault")
    assert made.calls == []


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_failed_result_edited_into_a_success_no_longer_counts_as_a_failure(driver: str) -> None:
    """b1 and b2 failed, so the source stopped (2 in a row); b1 edited into a success leaves one failure: no stop."""
    made = Made()
    script = [tool_turn(tool_call("boom", id="b1", x="1")), tool_turn(tool_call("boom", id="b2", x="2")), reply("ok")]
    with pytest.raises(AgentLoopError) as stopped:
        Agent(ByTurn(script), made.registry(), max_consecutive_failures=2).run("go")
    source = stopped.value.result
    assert source.reason == "tool_failures"
    made.calls.clear()
    agent = Agent(ByTurn(script), made.registry(), max_consecutive_failures=2)
    result = forked(agent, driver, source.snapshot, 3, edit=ForkEdit(results={"b1": "fine"}))
    assert [m.content for m in result.messages if m.tool_call_id == "b1"] == ["fine"]
    assert made.calls == []  # b2's failure is the source's, reused
    assert (result.reason, result.final) == ("done", "ok")


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_after_a_rejected_call_keeps_the_rejection_whatever_the_fork_s_approve(
    tmp_path: Path, driver: str
) -> None:
    """fork-a-run.md: "A paused call is decided as the source's person decided it"; the fork's agent asks nobody."""
    script = [
        tool_turn(tool_call("send", id="s1", to="eve")),
        tool_turn(tool_call("send", id="s2", to="bob")),
        reply("ok"),
    ]
    with SqliteStore(tmp_path / "runs.db") as store:
        careful = Agent(ByTurn(script), Made().registry(), approve={"send"})
        careful.run("go", store=store, run_id="src")
        careful.resume(store.load("src"), store=store, approvals={"s1": "not eve"}).finish()
        source = careful.resume(store.load("src"), store=store, approvals={"s2": True}).finish()
        assert source.final == "ok"
        made = Made()
        result = forked(Agent(ByTurn(script), made.registry()), driver, "src", 3, store=store, run_id="f")
    assert made.calls == []
    assert result.final == "ok"
    assert [m.content for m in result.messages] == [m.content for m in source.messages]
