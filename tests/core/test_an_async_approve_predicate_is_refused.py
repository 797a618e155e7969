"""``approve=`` an ``async def`` predicate is a TypeError when the agent is built.

Why: the rule is called, never awaited, and the coroutine it returns is
truthy: every tool call would wait for a person, whatever the predicate says.
"""

from __future__ import annotations

import pytest

from fsm_agent import Agent, ToolCall
from fsm_agent.testing import FakeModel, demo_registry, reply


async def needs_a_person(call: ToolCall) -> bool:
    """Would say no call needs approval, if it were awaited."""
    return False


def test_an_async_approve_predicate_is_refused_when_the_agent_is_built() -> None:
    """The message names ``approve`` and says to make it a plain def."""
    with pytest.raises(TypeError, match=r"approve is an async def, which is called, not awaited: make it a plain def"):
        Agent(FakeModel(reply("ok")), demo_registry(), approve=needs_a_person)


def test_a_plain_predicate_is_still_taken() -> None:
    """A plain def predicate holds back what it says, as before."""

    def never(call: ToolCall) -> bool:
        return False

    assert Agent(FakeModel(reply("ok")), demo_registry(), approve=never).run("Go.").ok
