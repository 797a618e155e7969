"""An agent whose tool needs the application's deps, and the deps factories the batch tests hand to workers.

Importable by Ray's workers (the batch tests put ``tests/`` on their path).
The deps hold a lock, which does not pickle: deps that reach a tool in
another process were built there, never sent.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from fsm_agent import Agent, Message, ModelResponse, RunContext
from fsm_agent.batch import BatchItem
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

EXECUTED: list[str] = []
"""The calls of ``whose`` this process made, as ``<owner>:<step>``."""


class Held:
    """The deps: who they were built for, and a lock no pickle can carry."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.lock = threading.Lock()


class TwoSteps:
    """Asks for ``whose`` twice, then answers with what the tools said; stateless, so any process continues a run."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn < 2:
            return tool_turn(tool_call("whose", id=f"w{turn}", step=turn))
        return reply(" | ".join(json.loads(m.content) for m in messages if m.role == "tool"))


def whose(step: int, ctx: RunContext[Held]) -> str:
    """Say whose deps this call was given, and in which process."""
    with ctx.deps.lock:
        EXECUTED.append(f"{ctx.deps.owner}:{step}")
    return f"{ctx.deps.owner} pid={os.getpid()}"


def deps_agent() -> Agent:
    """The agent the deps batch tests run: ``TwoSteps`` and the ``whose`` tool."""
    return Agent(TwoSteps(), [whose], clock=ManualClock())


def held_for(item: BatchItem) -> Held:
    """A ``make_deps``: each run's own deps, named by its input's position."""
    return Held(f"item {item.index}")


def no_deps_for(item: BatchItem) -> Held:
    """A ``make_deps`` that fails, for every item."""
    msg = f"no database for {item.input!r}"
    raise ConnectionError(msg)
