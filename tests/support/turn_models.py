"""Scripted models for conversation turns cut mid-way: each answers by the turn's question, so any owner goes on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from fsm_agent import Message, ModelResponse, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


def _last_question(messages: Sequence[Message]) -> int:
    return max(i for i, m in enumerate(messages) if m.role == "user")


class RetriesWhatWasNotRun:
    """First question: ``slow`` then two charges in one reply.  Later: asks again for each charge told not executed."""

    def __init__(self) -> None:
        self.seen: list[tuple[Message, ...]] = []

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.seen.append(tuple(messages))
        last = _last_question(messages)
        if messages[last].content == "Charge 2 and 3 cents.":
            calls = [tool_call("slow", id="c1", n=1), tool_call("charge", id="c2", cents=2)]
            return tool_turn(*calls, tool_call("charge", id="c3", cents=3))
        if any(m.role == "tool" for m in messages[last:]):
            return reply("done")
        asked = {c.id: c for m in messages if m.role == "assistant" for c in m.tool_calls}
        again = [
            tool_call("charge", id=f"{m.tool_call_id}-again", cents=asked[m.tool_call_id].arguments["cents"])
            for m in messages[:last]
            if m.role == "tool" and "not executed" in m.content and asked[m.tool_call_id].name == "charge"
        ]
        return tool_turn(*again) if again else reply("nothing to redo")


class Mailer:
    """Asks for ``send`` on "Mail Ada.", says "sent" once a tool answered it, and ``thanks`` on "Thanks."; counted."""

    def __init__(self, thanks: str = "welcome") -> None:
        self.thanks = thanks
        self.asked: list[str] = []

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        last = _last_question(messages)
        self.asked.append(messages[last].content)
        if messages[last].content == "Thanks.":
            return reply(self.thanks)
        if any(m.role == "tool" for m in messages[last:]):
            return reply("sent")
        return tool_turn(tool_call("send", id="c1", to="ada"))


def sender(made: Counter[str]) -> ToolRegistry:
    """A registry with ``send``: an effect in the world, counted per call id in ``made``."""
    tools = ToolRegistry()

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a message: an effect in the world, counted per call id."""
        made[call_id] += 1
        return f"sent to {to}"

    return tools
