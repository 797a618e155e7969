"""A child whose stop policy is ``finalize``: its last answer must reach the parent.

docs/how-to/sub-agents.md: "its answer (its typed ``output``, or its final
text) is the tool's result"; a stopped child is "a tool error carrying the
child's reason and evidence".  docs/how-to/limits-and-policies.md: a
finalize makes "one last model call ... The call's text becomes ``final``".
The parent pays for that call (its tokens are counted), so the text it
produced must not vanish between the child and the parent.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from fsm_agent import Agent, AgentLoopError, RunResult, Usage
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
ANSWER = "Best guess: Paris."


def _parent(on_child_stop: str) -> tuple[Agent, FakeModel]:
    child_model = FakeModel(
        tool_turn(tool_call("echo", id="e1", text="a"), usage=Usage(10, 1)), reply(ANSWER, usage=Usage(20, 2))
    )
    child = Agent(child_model, demo_registry(), max_steps=1, on_stop={"max_steps": "finalize"})
    tools = demo_registry()
    tools.register(child.as_tool("research", "Researches.", on_child_stop=on_child_stop))  # type: ignore[arg-type]
    return Agent(FakeModel(tool_turn(tool_call("research", id="c1", input="where?")), reply("ok")), tools), child_model


def _finish(agent: Agent, driver: str) -> RunResult:
    try:
        if driver == "sync":
            return agent.run("go")
        return asyncio.run(agent.arun("go"))
    except AgentLoopError as stop:
        return stop.result


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_finalized_childs_stop_and_tokens_reach_the_parent(driver: str) -> None:
    parent, child_model = _parent("error")
    result = _finish(parent, driver)
    told = json.loads(result.messages[2].content)
    assert (told["reason"], told["evidence"]["finalize"]) == ("max_steps", {"outcome": "answered"})
    assert len(child_model.seen) == 2  # the child's turn and its finalize call
    assert (result.usage.input_tokens, result.usage.output_tokens) == (30, 3)
    assert result.final == "ok"


@pytest.mark.parametrize("on_child_stop", ["error", "raise"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_finalized_childs_answer_reaches_the_parent(driver: str, on_child_stop: str) -> None:
    parent, _ = _parent(on_child_stop)
    result = _finish(parent, driver)
    told = result.messages[2].content if on_child_stop == "error" else json.dumps(result.evidence)
    assert ANSWER in told
