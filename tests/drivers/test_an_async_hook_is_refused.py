"""``agent.on(name, fn)`` with an ``async def`` fn is a TypeError when it is registered.

Why: every driver calls hooks and none awaits them (the hooks are
observers, called in order at each transition), so an async hook's body
would never run, silently.
"""

from __future__ import annotations

import pytest

from fsm_agent import Agent
from fsm_agent.testing import FakeModel, demo_registry, reply


async def on_transition(event: object) -> None:
    """Would record the event, if anything awaited it."""


def test_an_async_hook_is_refused_when_registered() -> None:
    """The message names the hook and says to make it a plain def."""
    agent = Agent(FakeModel(reply("ok")), demo_registry())
    with pytest.raises(TypeError, match=r"hook for 'transition' is an async def.*make it a plain def"):
        agent.on("transition", on_transition)
    assert not agent.hooks


def test_an_async_hook_is_refused_through_the_decorator_too() -> None:
    """``@agent.on(name)`` registers through the same check."""
    agent = Agent(FakeModel(reply("ok")), demo_registry())
    with pytest.raises(TypeError, match="async def"):
        agent.on("enter:Done")(on_transition)
