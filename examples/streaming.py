"""Text as it is written, offline: a scripted model that streams its replies word by word.

``OpenAIChatModel`` and ``AnthropicModel`` stream through their SDKs the same
way; a model of your own streams by having ``complete_stream(messages,
tools, on_text)`` (and ``acomplete_stream`` for the async driver).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from fsm_agent import Agent, Message, ModelResponse, TextDelta
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Typist(FakeModel):
    """A scripted model that hands each reply's text on word by word before returning the whole reply."""

    def complete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], on_text: Callable[[str], None]
    ) -> ModelResponse:
        response = self.complete(messages, tools)
        for word in re.findall(r"\S+\s*", response.message.content):
            on_text(word)
        return response


model = Typist(tool_turn(tool_call("add", a=2, b=3), content="Let me add those."), reply("The sum is 5."))
agent = Agent(model, demo_registry())
in_text = False
for event in agent.stream("What is 2+3?"):
    if isinstance(event, TextDelta):
        print(event.text, end="|", flush=True)  # "|" marks where one piece ends
        in_text = True
    else:
        print(("\n" if in_text else "") + f"  [{event.source} -> {event.dest}]")
        in_text = False
