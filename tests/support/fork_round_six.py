"""Agents for the sixth fork and replay audit: every tool and every model counts its calls, by call id and by turn.

``planner`` is the richest run the audit forks: a parallel batch of a
sub-agent (whose own reply is a parallel batch) and two lookups, a ``send``
held for a person's approval, a context overflow compacted, a typed answer
rejected once, every reply priced under a ``cost_budget``.  Its models
answer by the conversation they are sent, so one model serves a source and
all its forks, and each counts its calls by the turn it answers.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pydantic

from fsm_agent import (
    Agent,
    AgentLoopError,
    AgentRun,
    ContextOverflowError,
    Message,
    ModelResponse,
    Price,
    RunResult,
    ToolRegistry,
    Usage,
)
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

PRICE = Price(1, 2)
"""US dollars per million input and output tokens: every reply of these agents is priced."""
SUMMARY = "so far: all looked up and sent"
"""The compacted history's one user message."""


class Answer(pydantic.BaseModel):
    """The planner's typed answer."""

    total: int


class Cut:
    """Arms one lookup (by its ``q``) to be cut: ``"ctrl_c"`` raises KeyboardInterrupt, ``"hang"`` waits forever.

    A hanging lookup sets ``started`` (an ``asyncio.Event`` of the loop the
    test drives) first, so the test cancels the task only once the call is
    in flight.
    """

    def __init__(self) -> None:
        self.q: str | None = None
        self.how = "ctrl_c"
        self.started: asyncio.Event | None = None

    async def fire(self, q: str) -> None:
        if q != self.q:
            return
        self.q = None
        if self.how == "ctrl_c":
            raise KeyboardInterrupt
        assert self.started is not None
        self.started.set()
        await asyncio.Event().wait()


def registry(made: Counter[str], cut: Cut | None = None) -> ToolRegistry:
    """``lookup`` and ``send``, each counting its executions as ``"<tool> <argument> <call id>"``."""
    tools = ToolRegistry()

    async def lookup(q: str, call_id: str) -> str:
        """Look something up."""
        made[f"lookup {q} {call_id}"] += 1
        if cut is not None:
            await cut.fire(q)
        return f"found {q}"

    async def send(to: str, call_id: str) -> str:
        """Send a message: an effect in the world."""
        made[f"send {to} {call_id}"] += 1
        return f"sent {to}"

    tools.register(lookup)
    tools.register(send)
    return tools


class PlannerModel:
    """The planner's model: the batch, then ``send``, then an overflow; compacted, a bad answer, then a good one."""

    def __init__(self, made: Counter[str]) -> None:
        self.made = made

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema], output: Any = None) -> ModelResponse:
        compacted = any(m.role == "user" and m.content == SUMMARY for m in messages)
        turn = sum(1 for m in messages if m.role == "assistant")
        self.made[f"model {'compacted ' if compacted else ''}{turn}"] += 1
        if not compacted:
            if turn == 0:
                return tool_turn(
                    tool_call("research", id="r1", input="x?"),
                    tool_call("lookup", id="l1", q="a"),
                    tool_call("lookup", id="l2", q="b"),
                    usage=Usage(100, 10),
                )
            if turn == 1:
                return tool_turn(tool_call("send", id="s1", to="ada"), usage=Usage(200, 20))
            raise ContextOverflowError("too long")
        if messages[-1].content == SUMMARY:
            return reply("not json", usage=Usage(300, 30))
        return reply('{"total": 3}', usage=Usage(400, 40))


class ResearcherModel:
    """The sub-agent's model: a parallel batch of two lookups, then its answer."""

    def __init__(self, made: Counter[str]) -> None:
        self.made = made

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema], output: Any = None) -> ModelResponse:
        turn = sum(1 for m in messages if m.role == "assistant")
        self.made[f"child model {turn}"] += 1
        if turn == 0:
            return tool_turn(
                tool_call("lookup", id="cl1", q="c1"), tool_call("lookup", id="cl2", q="c2"), usage=Usage(10, 1)
            )
        return reply("x found", usage=Usage(20, 2))


def _compact(messages: list[Message]) -> list[Message]:
    return [messages[0], Message("user", SUMMARY)]


def planner(made: Counter[str], cut: Cut | None = None) -> Agent:
    """The audit's richest agent (see the module); ``made`` counts its tools' and both models' calls."""
    tools = registry(made, cut)
    child = Agent(ResearcherModel(made), registry(made, cut), prices=PRICE, max_concurrency=2)
    tools.register(child.as_tool("research", "Research one question."))
    return Agent(
        PlannerModel(made),
        tools,
        system="You plan.",
        prices=PRICE,
        cost_budget=100.0,
        approve={"send"},
        output_type=Answer,
        output_retries=2,
        max_concurrency=3,
        compact=_compact,
        on_stop={"context_overflow": "compact"},
        max_steps=20,
    )


def side_effects(made: Counter[str]) -> dict[str, int]:
    """The tool executions ``made`` counted, without the model calls."""
    return {label: n for label, n in made.items() if "model" not in label}


def model_calls(made: Counter[str]) -> dict[str, int]:
    """The model calls ``made`` counted (the sub-agent's too), by the turn each answered."""
    return {label: n for label, n in made.items() if "model" in label}


def finished(run: AgentRun, driver: str) -> RunResult:
    """``run`` driven to its end on ``driver``; a stop's result rather than its error."""
    try:
        return run.finish() if driver == "sync" else asyncio.run(run.afinish())
    except AgentLoopError as stop:
        return stop.result


def forked(agent: Agent, driver: str, source: Any, at: int, **keywords: Any) -> AgentRun:
    """``agent.fork`` on the sync driver, ``agent.afork`` on the async one (not driven yet)."""
    if driver == "sync":
        return agent.fork(source, at, **keywords)

    async def go() -> AgentRun:
        return await agent.afork(source, at, **keywords)

    return asyncio.run(go())


def counters(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A stored run's counters without its clock."""
    return {name: value for name, value in snapshot["counters"].items() if name != "elapsed"}
