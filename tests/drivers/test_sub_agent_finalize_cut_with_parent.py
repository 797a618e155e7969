"""A sub-agent's finalize call cut by its parent's task cancel or deadline is made again when the parent resumes.

The child stops ``max_steps`` with the ``finalize`` policy; its one last
model call hangs, and the parent's task is cancelled there (or the parent's
``timeout`` passes).  The child is stored ``Failed`` with the stop that asked
for the finalize; the cut is on its last edge.  Before, the parent's resume
read it back as finished, so the parent was told the child's stop with no
answer, although a Ctrl-C, the sync driver's deadline and a store-less run all
made the call again.  Now the child is taken back and its resume takes
``Failed->AwaitModel[resumes_finalize]``: the finalize call is made once more,
and its answer reaches the parent.  Every tool and model call is counted, on
both drivers resuming and both stores.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from support.exactly_once import LEASE, resumed_by_new_owner

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, ToolRegistry, Transition
from fsm_agent.persist import open_store
from fsm_agent.testing import edge_id, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

DRIVERS = ["sync", "async"]


class Counted:
    """The models of parent and child and a ``work`` tool, each call counted; the child's first finalize hangs."""

    def __init__(self) -> None:
        self.models: Counter[str] = Counter()
        self.tools: Counter[str] = Counter()
        self.hang = True
        self.hanging = asyncio.Event()

    def registry(self, level: str) -> ToolRegistry:
        tools = ToolRegistry()

        def work(label: str) -> str:
            """Do one piece of work."""
            self.tools[f"{level}:{label}"] += 1
            return f"{label} ok"

        tools.register(work)
        return tools


class ChildModel:
    """Asks for one piece of work, then (stopped at ``max_steps=1``) answers the finalize call without tools."""

    def __init__(self, counted: Counted) -> None:
        self.counted = counted

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.counted.models["child" if tools else "child finalize"] += 1
        if tools:
            return tool_turn(tool_call("work", id="cw", label="c"))
        return reply("what the child found")

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if not tools and self.counted.hang:
            self.counted.hang = False
            self.counted.models["child finalize"] += 1
            self.counted.hanging.set()
            await asyncio.sleep(3600)  # cut here, by the parent's task cancel or deadline
        return self.complete(messages, tools)


class ParentModel:
    """Asks for work and the sub-agent in one turn, then answers with every tool result it was given."""

    def __init__(self, counted: Counted) -> None:
        self.counted = counted

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.counted.models["parent"] += 1
        if not any(message.role == "assistant" for message in messages):
            return tool_turn(tool_call("work", id="pw", label="p"), tool_call("ask", id="sub", input="find out"))
        return reply(" | ".join(message.content or "" for message in messages if message.role == "tool"))

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return self.complete(messages, tools)


def parent_of(counted: Counted, **options: Any) -> Agent:
    child = Agent(ChildModel(counted), counted.registry("child"), max_steps=1, on_stop={"max_steps": "finalize"})
    tools = counted.registry("parent")
    tools.register(child.as_tool("ask", "Finds something out."))
    return Agent(ParentModel(counted), tools, **options)


def cut(counted: Counted, target: str, how: str) -> None:
    """Run the parent on the async driver until the child's finalize call hangs, and cut it there."""

    async def go() -> None:
        with open_store(target, lease=LEASE) as store:
            if how == "deadline":
                with pytest.raises(AgentLoopError) as stop:
                    await parent_of(counted, timeout=1.0).arun("go", store=store, run_id="p")
                assert stop.value.reason == "timeout"
                return
            task = asyncio.create_task(parent_of(counted).arun("go", store=store, run_id="p"))
            await counted.hanging.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())


@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("how", ["task", "deadline"])
def test_the_childs_cut_finalize_call_is_made_again_and_its_answer_reaches_the_parent(
    store_target: str, how: str, resumer: str
) -> None:
    counted = Counted()
    cut(counted, store_target, how)
    assert (dict(counted.models), dict(counted.tools)) == (
        {"parent": 1, "child": 1, "child finalize": 1},
        {"parent:p": 1, "child:c": 1},
    )
    with open_store(store_target) as store:
        child = store.load("p/sub")
    assert (child["state"], child["reason"], child["evidence"]["finalize"]["outcome"]) == (
        "Failed",
        "max_steps",
        "cancelled",
    )

    result = resumed_by_new_owner(store_target, "p", resumer, parent_of(counted), timeout=60)

    assert (dict(counted.models), dict(counted.tools)) == (
        {"parent": 2, "child": 1, "child finalize": 2},
        {"parent:p": 1, "child:c": 1},
    )
    assert result.reason == "done"
    told = [message.content for message in result.messages if message.tool_call_id == "sub"]
    assert len(told) == 1, told
    assert "what the child found" in (told[0] or "")
    with open_store(store_target) as store:
        child = store.load("p/sub")
    assert (child["state"], child["reason"], child["evidence"]["finalize"]) == (
        "Done",
        "max_steps",
        {"outcome": "answered"},
    )
    assert "Failed->AwaitModel[resumes_finalize]" in [edge_id(Transition(**entry)) for entry in child["trace"]]
