"""A model whose ``acomplete`` is a plain def: ``arun`` says so, as ``async def complete`` is told.

The run stops ``model_error`` naming the fix, where Python's own "object
ModelResponse can't be used in 'await' expression" named none.  Refusing a
plain-def ``acomplete`` when the agent is built would also refuse a wrapper
that returns another model's coroutine, so the call's value is checked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError
from fsm_agent.testing import demo_registry, reply


class PlainAcomplete:
    """A model whose ``acomplete`` is a plain def: the mirror of the ``async def complete`` the agent refuses."""

    def complete(self, messages: Any, tools: Any) -> Any:
        return reply("hi")

    def acomplete(self, messages: Any, tools: Any) -> Any:
        return reply("hi")


def test_a_plain_def_acomplete_is_named_as_such_on_arun() -> None:
    """``AwaitModel->Failed[model_error]`` naming ``acomplete`` and ``async def``."""
    with pytest.raises(AgentLoopError) as stop:
        asyncio.run(Agent(PlainAcomplete(), demo_registry()).arun("Hi"))
    assert stop.value.reason == "model_error"
    assert "model.acomplete returned ModelResponse, not an awaitable: make it an async def" in str(
        stop.value.evidence.get("error")
    )
