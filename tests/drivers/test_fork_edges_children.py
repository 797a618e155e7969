"""A fork of a source cut while its sub-agent was running: the sub-agent's completed calls are not made again.

The parent asks the ``research`` sub-agent once; the sub-agent makes
``lookup`` and then its process dies (its model raises a ``BaseException``,
as a kill would leave things: the stored child holds the completed lookup,
the parent the call in flight).  Every tool counts its executions by call id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Died(BaseException):
    """The process running the source died here."""


class Child:
    """Asks ``lookup`` first; its second call dies while ``dying`` is set, else answers."""

    def __init__(self, dying: bool) -> None:
        self.dying = dying

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema], output: Any = None) -> ModelResponse:
        if not any(m.role == "assistant" for m in messages):
            return tool_turn(tool_call("lookup", id="l1", q="who"))
        if self.dying:
            raise Died
        return reply("ada")


class Parent:
    def complete(self, messages: Sequence[Message], tools: list[JSONSchema], output: Any = None) -> ModelResponse:
        asked = any(m.role == "assistant" for m in messages)
        return reply("done") if asked else tool_turn(tool_call("research", id="r1", input="who?"))


def researcher(made: Counter[str], *, dying: bool) -> Agent:
    child_tools = ToolRegistry()

    @child_tools.register
    def lookup(q: str, call_id: str) -> str:
        """Look a question up."""
        made[call_id] += 1
        return "ada"

    tools = ToolRegistry()
    tools.register(Agent(Child(dying), child_tools).as_tool("research", "Research a question."))
    return Agent(Parent(), tools)


def test_a_fork_of_a_source_cut_inside_its_sub_agent_does_not_make_the_sub_agent_s_completed_call_again(
    store_target: str,
) -> None:
    with open_store(store_target) as store:
        made: Counter[str] = Counter()
        with pytest.raises(Died):
            researcher(made, dying=True).run("go", store=store, run_id="src")
        assert dict(made) == {"l1": 1}
        assert store.load("src/r1")["steps"][-1]["kind"] == "tool_call"  # the child's lookup is durable
        forked = researcher(made, dying=False).fork("src", 0, store=store, run_id="f").finish()
        assert forked.final == "done"
        assert dict(made) == {"l1": 1}  # the lookup the source's sub-agent completed is not made again
