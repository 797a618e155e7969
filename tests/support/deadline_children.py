"""A sub-agent that makes one tool call, then hangs in its answer until its parent's deadline cuts it.

Each child runs ``work`` on its input, then (while ``Counts.hold``) waits in
its answer: the parent's deadline cuts it there, with its ``work`` completed
and counted (``support.cancelled_with_parent``'s ``Counts``, ``child_tools``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from fsm_agent import Message, ModelResponse
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.cancelled_with_parent import WAIT, Counts


class HangsInItsAnswer:
    """A child's model: asks for ``work`` on its input, then (while ``counts.hold``) hangs in its answer.

    On the sync driver the hang is a wait on ``release``, which the test sets
    once the cut is over (the child's thread outlives the parent's deadline
    until its own); on the async driver it lasts until the task is cancelled.
    """

    def __init__(self, counts: Counts, release: threading.Event) -> None:
        self.counts, self.release = counts, release

    def _ask(self, messages: Sequence[Message]) -> tuple[str, bool]:
        with self.counts.lock:
            self.counts.child += 1
        asked = next(m.content for m in messages if m.role == "user")
        return asked, any(m.role == "tool" for m in messages)

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        asked, worked = self._ask(messages)
        if not worked:
            return tool_turn(tool_call("work", id=f"w-{asked}", item=asked))
        if self.counts.hold:
            self.release.wait(WAIT)
        return reply(f"found {asked}")

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        asked, worked = self._ask(messages)
        if not worked:
            return tool_turn(tool_call("work", id=f"w-{asked}", item=asked))
        if self.counts.hold:
            await asyncio.Event().wait()  # cut by the parent's deadline
        return reply(f"found {asked}")
