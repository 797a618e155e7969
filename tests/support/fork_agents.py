"""Agents for the tests of forks' surfaces (the viewer, the command line): their one tool counts its executions."""

from __future__ import annotations

from collections.abc import Sequence

from fsm_agent import Agent, Message, ModelResponse, SqliteStore, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

ADDED: list[tuple[int, int]] = []
"""Every execution of the ``add`` tool of an agent made here, in order: a test clears it first."""


def counting_registry() -> ToolRegistry:
    """One tool, ``add``, that records each execution in ``ADDED``."""
    registry = ToolRegistry()

    @registry.register
    def add(a: int, b: int) -> int:
        """Add two whole numbers."""
        ADDED.append((a, b))
        return a + b

    return registry


class SumModel:
    """Asks ``add(2, 3)``, then ``add(3, 3)``..., until ``calls`` results are in, then answers with the last.

    It reads only the conversation, so one model serves any number of runs
    and forks, each asking what its own history calls for.
    """

    def __init__(self, calls: int = 1, answer: str = "the sum is {}") -> None:
        self.calls = calls
        self.answer = answer

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """A call of ``add`` while fewer than ``calls`` results came back, else the answer."""
        results = [m for m in messages if m.role == "tool"]
        if len(results) < self.calls:
            return tool_turn(tool_call("add", a=2 + len(results), b=3, id=f"call_{len(results)}"))
        return reply(self.answer.format(results[-1].content))


def make() -> Agent:
    """The agent of the source runs: one call of ``add``, then the answer."""
    return Agent(SumModel(), counting_registry())


def make_careful() -> Agent:
    """``make()``'s agent with every ``add`` call held for a person's approval."""
    return Agent(SumModel(), counting_registry(), approve={"add"})


def make_twice() -> Agent:
    """An agent that calls ``add`` twice before answering: a fork made with it leaves its source's path."""
    return Agent(SumModel(calls=2, answer="twice: {}"), counting_registry())


def source_run(store: SqliteStore, run_id: str = "source") -> None:
    """Store a finished run of ``make()``'s agent (one ``add`` call) under ``run_id``."""
    make().run("what is 2 + 3?", store=store, run_id=run_id)


AFTER_THE_CALL = 3
"""The source run's transition ``ExecuteTool -> AwaitModel``: its ``add`` call is complete from here on."""
BEFORE_THE_CALL = 2
"""The source run's transition ``Dispatch -> ExecuteTool``: its ``add`` call is about to be made."""
