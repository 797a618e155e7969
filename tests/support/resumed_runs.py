"""A run stopped by a limit and resumed under a lifted one: the script, its counted model and tool, its agent.

The model answers by the conversation it is sent (as a model at
temperature 0 would): the n-th reply of ``SCRIPT`` when sent n assistant
messages, so a fork or a replay that goes on asks it again and gets the
same answers.  The model and the tool count their calls, so "nothing was
called" is counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry, Usage
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

USAGE = Usage(input_tokens=10, output_tokens=5)
SCRIPT = [tool_turn(tool_call("add", id=f"a{n}", a=n, b=1), usage=USAGE) for n in range(5)] + [reply("6", usage=USAGE)]
LIFTS = {  # each limit: the agent's own (the source stops on it after two turns or three), and the one it resumes under
    "max_steps": (2, 10),
    "token_budget": (40, 1000),
}


class Counts:
    """How often the model and the tool were called."""

    def __init__(self) -> None:
        self.model = 0
        self.tool = 0


class ByTurn:
    """A model that answers the n-th reply of ``SCRIPT`` when sent n assistant messages."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.counts.model += 1
        return SCRIPT[sum(1 for m in messages if m.role == "assistant")]


def make_agent(
    counts: Counts, limit: str = "max_steps", *, off_by_one_from: int | None = None, **options: Any
) -> Agent:
    """The source's agent, under the lower of ``limit``'s values; ``off_by_one_from``: where its ``add`` now errs."""
    registry = ToolRegistry()

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        counts.tool += 1
        return a + b + (1 if off_by_one_from is not None and a >= off_by_one_from else 0)

    registry.register(add)
    return Agent(ByTurn(counts), registry, on_stop={limit: "return"}, **{limit: LIFTS[limit][0], **options})
