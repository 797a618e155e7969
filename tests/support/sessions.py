"""The sessions the tests share with a child process: a model that echoes how far the conversation got."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsm_agent import Agent, Message, ModelResponse
from fsm_agent.testing import demo_registry, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Echoing:
    """Answers each question with how many user messages it has seen; ``add`` first if the question says so."""

    def __init__(self) -> None:
        self.seen: list[list[Message]] = []

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.seen.append(list(messages))
        question = [m for m in messages if m.role == "user"][-1].content
        asked = sum(1 for m in messages if m.role == "user")
        if question.startswith("add") and messages[-1].role == "user":
            return tool_turn(tool_call("add", id=f"a{asked}", a=asked, b=1))
        if question.startswith("loop"):
            return tool_turn(tool_call("echo", id=f"e{len(self.seen)}", text="again"))
        return reply(f"answer {asked} to {question}")


def echoing_agent(**options: Any) -> tuple[Agent, Echoing]:
    """An agent over ``Echoing`` and the demonstration tools, with a system prompt; ``options`` go to ``Agent``."""
    model = Echoing()
    return Agent(model, demo_registry(), "Be brief.", **options), model
