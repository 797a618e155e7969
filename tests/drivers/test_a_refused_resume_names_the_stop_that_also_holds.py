"""A resume refused because another stop holds beside the run's own names that stop and its limit to raise.

A batch cut by Ctrl-C on a run's last allowed turn stores it ``cancelled``
while ``max_steps`` holds too (only the first stop is recorded).  A fresh
token lifts the cancel, not the step limit, and the refusal said only
"which these limits do not lift", leaving the reader to find the limit in
the counters.
"""

from __future__ import annotations

import pytest

from fsm_agent import Agent, AgentLoopError, CancelToken, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


def test_a_run_cancelled_on_its_last_allowed_turn_is_refused_naming_max_steps_and_resumes_with_more_steps() -> None:
    token = CancelToken()
    calls: list[str] = []
    tools = ToolRegistry()

    @tools.register
    def work(x: str) -> str:
        """Work, and the user presses Ctrl-C meanwhile."""
        calls.append(x)
        token.cancel("Ctrl-C")
        return "worked"

    agent = Agent(FakeModel(tool_turn(tool_call("work", id="a", x="1")), reply("done")), tools, max_steps=1)
    with pytest.raises(AgentLoopError) as stop:
        agent.run("q", cancel=token)
    assert stop.value.reason == "cancelled"
    with pytest.raises(ValueError, match="'max_steps' holds as well and forbids the next call, so raise its limit"):
        agent.resume(stop.value.result, cancel=CancelToken())
    assert agent.resume(stop.value.result, cancel=CancelToken(), max_steps=2).finish().final == "done"
    assert calls == ["1"]


def test_a_resume_that_lifts_nothing_names_no_other_stop() -> None:
    agent = Agent(FakeModel(tool_turn(tool_call("echo", id="a", text="1")), reply("done")), _echo(), max_steps=1)
    with pytest.raises(AgentLoopError) as stop:
        agent.run("q")
    assert stop.value.reason == "max_steps"
    with pytest.raises(ValueError, match="which these limits do not lift \\(counters"):
        agent.resume(stop.value.result)


def _echo() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.register
    def echo(text: str) -> str:
        """Echo."""
        return text

    return tools
