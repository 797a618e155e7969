"""A run whose finalize call was cut is read as cut, not as stopped, wherever a stored or returned run is judged.

Such a run keeps the stop that asked for the finalize as its reason; the
cut (``cancelled``, ``timeout``) is on its last edge (``ended_on``).  Before,
three readers looked at the reason only: a session took a request sent again
as answered by the stop, a batch run again returned the stop instead of
resuming the run (``tests/batch/test_batch_finalize_cut_run_again.py``), and a store-less parent
took a child that finished of itself (its finalize answered its ``timeout``)
for one cut with it, and ran the child again.  Every model and tool call is
counted.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, Session, ToolRegistry
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Counted:
    """A model and a ``work`` tool, every call counted; the first finalize call (no tools offered) hangs."""

    def __init__(self) -> None:
        self.models: list[str] = []
        self.tools: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.hang = True
        self.hanging = asyncio.Event()

    def registry(self) -> ToolRegistry:
        tools = ToolRegistry()

        def work(label: str) -> str:
            """Do one piece of work."""
            with self.lock:
                self.tools[label] += 1
            return f"{label} ok"

        tools.register(work)
        return tools

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.models.append("tools" if tools else "finalize")
        if tools:
            return tool_turn(tool_call("work", label=f"t{len(self.models)}"))
        return reply("final")

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if not tools and self.hang:
            self.hang = False
            self.models.append("finalize")
            self.hanging.set()
            await asyncio.sleep(3600)  # cut here
        return self.complete(messages, tools)


@pytest.mark.parametrize("stored", [True, False])
def test_a_request_sent_again_after_its_turns_finalize_was_cut_takes_a_new_turn(
    store_target: str, stored: bool
) -> None:
    """The turn's task was cancelled in its finalize call: it answered nobody, as a cancelled turn."""
    counted = Counted()
    agent = Agent(counted, counted.registry(), max_steps=1, on_stop={"max_steps": "finalize"})
    chat = Session(agent, store=store_target if stored else None, session_id="s")

    async def go() -> Any:
        task = asyncio.create_task(chat.arun("go", request_id="q1"))
        await counted.hanging.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await chat.arun("go", request_id="q1")  # the same request, sent again

    result = asyncio.run(go())
    assert counted.models == ["tools", "finalize", "tools", "finalize"]
    assert dict(counted.tools) == {"t1": 1, "t3": 1}
    assert (result.reason, result.evidence["finalize"], result.final) == ("max_steps", {"outcome": "answered"}, "final")
    assert chat.turns == 2


class Child:
    """Asks for ``slow`` (which takes the run past its deadline); its finalize call answers "child final"."""

    def __init__(self, models: Counter[str]) -> None:
        self.models = models

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.models["child" if tools else "child finalize"] += 1
        if not tools:
            return reply("child final")
        if not any(m.role == "tool" for m in messages):
            return tool_turn(tool_call("slow", id="cs"))
        return reply("child plain answer")


class Parent:
    """Asks the sub-agent once, then answers with what it was told."""

    def __init__(self, models: Counter[str]) -> None:
        self.models = models

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.models["parent"] += 1
        if not any(m.role == "tool" for m in messages):
            return tool_turn(tool_call("ask", id="sub", input="find out"))
        return reply("told: " + "".join(m.content or "" for m in messages if m.role == "tool"))


def _parent(models: Counter[str], tools_run: Counter[str], clock: ManualClock, **options: Any) -> Agent:
    child_tools = ToolRegistry()

    @child_tools.register
    def slow() -> str:
        """Slow work: takes the run past its deadline."""
        tools_run["slow"] += 1
        clock.advance(100)
        return "slow ok"

    child = Agent(Child(models), child_tools, on_stop={"timeout": "finalize"}, clock=clock)
    tools = ToolRegistry()
    tools.register(child.as_tool("ask", "Finds something out."))
    return Agent(Parent(models), tools, clock=clock, **options)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_storeless_parent_keeps_the_answer_of_a_child_whose_finalize_answered_its_timeout(driver: str) -> None:
    """The child's deadline is its parent's: it stops ``timeout``, its finalize answers, it ends ``Done``.

    The parent then stops ``timeout`` too, and is resumed with more time from
    its result: the child finished of itself, so its answer is the call's
    outcome, as a stored child is read back; it is not run again.
    """
    models: Counter[str] = Counter()
    tools_run: Counter[str] = Counter()
    clock = ManualClock()
    agent = _parent(models, tools_run, clock, timeout=60)
    with pytest.raises(AgentLoopError) as stop:
        agent.run("go") if driver == "sync" else asyncio.run(agent.arun("go"))
    assert stop.value.reason == "timeout"
    assert dict(models) == {"parent": 1, "child": 1, "child finalize": 1}

    again = _parent(models, tools_run, clock)
    if driver == "sync":
        result = again.resume(stop.value.result, timeout=10**6).finish()
    else:

        async def go() -> Any:
            return await (await again.aresume(stop.value.result, timeout=10**6)).afinish()

        result = asyncio.run(go())
    assert dict(models) == {"parent": 2, "child": 1, "child finalize": 1}
    assert dict(tools_run) == {"slow": 1}
    told = [m.content or "" for m in result.messages if m.tool_call_id == "sub"]
    assert len(told) == 1
    assert "child final" in told[0]
