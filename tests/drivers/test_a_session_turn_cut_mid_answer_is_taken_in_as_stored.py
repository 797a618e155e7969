"""A stored session's turn cut mid-answer (its task cancelled) is in the session object as the store holds it.

The cut turn is stored ``Failed``/``cancelled``; the session object that
took it says so at once (``turns``, ``messages``), as a new ``Session``
over the store does, instead of only after its next turn read the store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, Session
from fsm_agent.persist import open_store
from fsm_agent.testing import demo_registry, reply


class SlowTypist:
    """Streams its answer word by word, a little apart; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, messages: Sequence[Message], tools: Any) -> ModelResponse:
        self.calls += 1
        return reply("The Moon is about 384,400 km away, on average.")

    async def acomplete_stream(
        self, messages: Sequence[Message], tools: Any, on_text: Callable[[str], None]
    ) -> ModelResponse:
        response = self.complete(messages, tools)
        for word in response.message.content.split(" "):
            on_text(word + " ")
            await asyncio.sleep(0.02)
        return response


def _said(messages: Sequence[Message]) -> list[tuple[str, str]]:
    return [(message.role, message.content) for message in messages]


def test_a_stored_turn_cut_mid_answer_is_in_the_session_object_at_once(store_target: str) -> None:
    model = SlowTypist()
    agent = Agent(model, demo_registry())
    shown: list[str] = []
    pressed = asyncio.Event()

    def show(delta: Any) -> None:
        shown.append(delta.text)
        if len(shown) == 3:
            pressed.set()

    agent.on("text", show)

    async def cut_then_read() -> tuple[Session, Session]:
        with open_store(store_target) as store:
            chat = await Session.aopen(agent, store, "moon")
            turn = asyncio.create_task(chat.arun("How far is the Moon?"))
            await pressed.wait()
            turn.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await turn
            return chat, await Session.aopen(agent, store, "moon")

    chat, fresh = asyncio.run(cut_then_read())
    assert (chat.turns, fresh.turns) == (1, 1)
    assert _said(chat.messages) == _said(fresh.messages)
    assert ("user", "How far is the Moon?") in _said(chat.messages)
    assert model.calls == 1
