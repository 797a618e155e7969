"""A hook that raises: logged and passed over without strict_hooks, a hook_error stop with it; nothing else skipped.

For every hook name, on both drivers: the other hooks of the same name, the
other hook names, the run's log and its result are exactly what they are
without the raising hook (non-strict), and a strict run stops with the
documented reason, evidence and cause while its log still holds every
transition it made.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, ModelResponse, RunResult
from fsm_agent.observe.events import HOOK_NAMES, read_log
from fsm_agent.testing import FakeModel, ManualClock, demo_registry, edges, reply, tool_call, tool_turn


class Typist(FakeModel):
    """Streams each reply's text word by word, so ``text`` hooks fire too."""

    def complete_stream(self, messages: Any, tools: Any, on_text: Any) -> ModelResponse:
        response = self.complete(messages, tools)
        for word in re.findall(r"\S+\s*", response.message.content):
            on_text(word)
        return response

    async def acomplete_stream(self, messages: Any, tools: Any, on_text: Any) -> ModelResponse:
        return self.complete_stream(messages, tools, on_text)


def script() -> Typist:
    return Typist(
        tool_turn(tool_call("echo", id="c1", text="x"), tool_call("add", id="c2", a=1, b=2), content="Let me see."),
        reply("The answer is 3."),
    )


class AuditDown(ConnectionError):
    """What the raising hook raises."""


def audit_down(event: object) -> None:
    raise AuditDown("audit log is down")


def drive(agent: Agent, driver: str, log: Path) -> RunResult:
    if driver == "sync":
        return agent.run("q", log=log)
    return asyncio.run(agent.arun("q", log=log))


def record_everything(agent: Agent) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []
    for name in HOOK_NAMES:
        agent.on(name, lambda event, name=name: seen.append((name, _plain(event))))
    return seen


def _plain(event: Any) -> Any:
    """An event without its run id (each run has its own) and its final result's snapshot."""
    if hasattr(event, "to_dict"):
        return event.to_dict()
    return (event.kind, event.turn, event.tool_call, event.response, event.error, event.tool_result, event.tool_error)


ALL_HOOKS = [
    name
    for name in HOOK_NAMES
    if name not in ("leave:Done", "leave:Failed", "enter:Failed", "failed", "unfinished", "paused")
]
"""The hook names this script's run reaches (it ends in Done, so it is never left unfinished, and asks no approval)."""


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("name", ALL_HOOKS)
def test_without_strict_hooks_a_raising_hook_skips_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, driver: str
) -> None:
    """The same result, the same events to every other hook (the same name's included) and the same log."""
    # A clock that never moves: the counters' seconds are then equal in both runs.
    baseline = Agent(script(), demo_registry(), clock=ManualClock())
    expected = record_everything(baseline)
    plain = drive(baseline, driver, tmp_path / "plain.jsonl")

    agent = Agent(script(), demo_registry(), clock=ManualClock())
    agent.on(name, audit_down)  # registered first: the hooks after it must still be called
    seen = record_everything(agent)
    with caplog.at_level(logging.ERROR, logger="fsm_agent"):
        result = drive(agent, driver, tmp_path / "run.jsonl")

    assert result.final == plain.final == "The answer is 3."
    assert (result.trace, result.messages, result.steps) == (plain.trace, plain.messages, plain.steps)
    assert seen == expected
    assert read_log(tmp_path / "run.jsonl") == result.trace
    raised = [r for r in caplog.records if r.getMessage().startswith(f"fsm_agent hook {name!r}")]
    assert raised
    assert all(r.exc_info is not None and isinstance(r.exc_info[1], AuditDown) for r in raised)


STOPS_AT = {
    # hook name: the edge into Failed[hook_error] the run takes next (the script above, sync driver)
    "before_model": "AwaitModel->Failed[hook_error]",
    "after_model": "AwaitModel->Failed[hook_error]",
    "text": "AwaitModel->Failed[hook_error]",
    "leave:AwaitModel": "CheckTruncation->Failed[hook_error]",
    "enter:CheckTruncation": "CheckTruncation->Failed[hook_error]",
    "transition": "CheckTruncation->Failed[hook_error]",
    "leave:CheckTruncation": "Dispatch->Failed[hook_error]",
    "enter:Dispatch": "Dispatch->Failed[hook_error]",
    "enter:ExecuteTool": "ExecuteTool->Failed[hook_error]",
    "leave:Dispatch": "ExecuteTool->Failed[hook_error]",
    "before_tool": "ExecuteTool->Failed[hook_error]",
    "after_tool": "ExecuteTool->Failed[hook_error]",
    "leave:ExecuteTool": "Dispatch->Failed[hook_error]",
    "enter:AwaitModel": "AwaitModel->Failed[hook_error]",
}


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("name", sorted(STOPS_AT))
def test_with_strict_hooks_a_raising_hook_stops_the_run_with_its_evidence(
    tmp_path: Path, name: str, driver: str
) -> None:
    """Failed(hook_error), evidence type and error, the hook's exception as cause; the log has every edge."""
    agent = Agent(script(), demo_registry(), strict_hooks=True)
    agent.on(name, audit_down)
    transitions: list[Any] = []
    agent.on("transition", transitions.append)
    failed: list[Any] = []
    agent.on("failed", failed.append)
    log = tmp_path / "run.jsonl"
    with pytest.raises(AgentLoopError) as info:
        drive(agent, driver, log)
    stop = info.value
    assert stop.reason == "hook_error"
    assert isinstance(stop.__cause__, AuditDown)
    assert (stop.evidence["type"], stop.evidence["error"]) == ("AuditDown", "audit log is down")
    assert edges(stop.result)[-1] == STOPS_AT[name]
    assert read_log(log) == stop.result.trace
    assert [event.transition for event in transitions] == list(stop.result.trace)
    (into_failed,) = failed
    assert into_failed.reason == "hook_error"
    assert into_failed.evidence == stop.evidence


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("name", ["failed", "enter:Failed", "transition"])
def test_a_strict_hook_raising_on_the_last_edge_leaves_the_stop_as_it_was(
    tmp_path: Path, name: str, driver: str
) -> None:
    """A run already stopped (max_tokens) keeps its reason and cause; the hook's error is only logged."""
    agent = Agent(Typist(reply("It is about", stop_reason="max_tokens")), demo_registry(), strict_hooks=True)
    calls: list[Any] = []
    if name == "transition":
        agent.on(name, lambda event: (calls.append(event), event.result is not None and audit_down(event)))
    else:
        agent.on(name, lambda event: (calls.append(event), audit_down(event)))
    log = tmp_path / "run.jsonl"
    with pytest.raises(AgentLoopError) as info:
        drive(agent, driver, log)
    assert info.value.reason == "max_tokens"
    assert info.value.__cause__ is None
    assert info.value.result.final == "It is about"
    assert edges(info.value.result)[-1] == "CheckTruncation->Failed[max_tokens]"
    assert read_log(log) == info.value.result.trace
    assert calls


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_strict_hook_raising_as_the_answer_arrives_keeps_the_answer(tmp_path: Path, driver: str) -> None:
    """enter:Done raising cannot stop a run that has ended: the result stands."""
    agent = Agent(script(), demo_registry(), strict_hooks=True)
    agent.on("enter:Done", audit_down)
    result = drive(agent, driver, tmp_path / "run.jsonl")
    assert (result.reason, result.final) == ("done", "The answer is 3.")
    assert read_log(tmp_path / "run.jsonl") == result.trace
