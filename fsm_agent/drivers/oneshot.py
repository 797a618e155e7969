"""One run with a throwaway agent: ``fsm_agent.run`` and ``fsm_agent.arun``, a plain loop's ``run()`` shape.

Kept apart from ``Agent`` itself: they are a convenience over it, and a
web handler that calls them builds a new agent each time (reuse an ``Agent``
to skip that cost).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fsm_agent.core.cancellation import CancelToken
from fsm_agent.drivers.agent import Agent
from fsm_agent.drivers.model import Model
from fsm_agent.records import RunResult
from fsm_agent.tools import ToolRegistry


def run(
    model: Model,
    registry: ToolRegistry,
    user_input: str,
    system: str = "",
    max_steps: int = 8,
    max_consecutive_failures: int = 3,
    *,
    cancel: CancelToken | None = None,
    log: str | Path | None = None,
    **options: Any,
) -> RunResult:
    """Run one conversation to the end with a throwaway ``Agent``; ``options`` are ``Agent``'s keywords.

    Raises ``AgentLoopError`` on every stop unless ``on_stop`` says otherwise.
    """
    agent = Agent(model, registry, system, max_steps, max_consecutive_failures, **options)
    return agent.run(user_input, cancel=cancel, log=log)


async def arun(
    model: Model,
    registry: ToolRegistry,
    user_input: str,
    system: str = "",
    max_steps: int = 8,
    max_consecutive_failures: int = 3,
    *,
    cancel: CancelToken | None = None,
    log: str | Path | None = None,
    **options: Any,
) -> RunResult:
    """The async twin of ``run``: awaits an async model's ``acomplete`` and runs a turn's tool calls concurrently."""
    agent = Agent(model, registry, system, max_steps, max_consecutive_failures, **options)
    return await agent.arun(user_input, cancel=cancel, log=log)
