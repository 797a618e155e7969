"""A Session whose turns overflow and compact: the model sees the compacted context, the record keeps everything.

docs/how-to/long-runs.md ("result.messages keeps the whole conversation";
"The compacted history is part of the run's snapshot") and
docs/how-to/conversations.md ("session.messages is the whole conversation";
a new Session object continues it).  Every tool call and compaction is
counted; both drivers, both stores.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from fsm_agent import Agent, ContextOverflowError, Message, ModelResponse, Session, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

WINDOW = 4


class _Window:
    """Overflows past ``WINDOW`` messages; per question, one ``note`` call, then an answer naming the question."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.sent.append([m.content for m in messages])
        if len(messages) > WINDOW:
            raise ContextOverflowError("prompt is too long", tokens=len(messages), limit=WINDOW)
        last = max(i for i, m in enumerate(messages) if m.role == "user")
        question = messages[last].content
        if not any(m.role == "tool" for m in messages[last:]):
            return tool_turn(tool_call("note", id=f"n-{question}", text=question))
        return reply(f"noted {question}")


def _agent(noted: list[str], compacted: list[int]) -> tuple[Agent, _Window]:
    tools = ToolRegistry()

    @tools.register
    def note(text: str) -> str:
        """Note a word, counted."""
        noted.append(text)
        return f"ok {text}"

    def compact(messages: list[Message]) -> list[Message]:
        compacted.append(len(messages))
        questions = [m.content for m in messages if m.role == "user"]
        return [Message("user", "summary: " + " / ".join(questions[:-1])), Message("user", questions[-1])]

    model = _Window()
    return Agent(model, tools, on_stop={"context_overflow": "compact"}, compact=compact), model


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_compacted_turns_keep_every_message_and_run_each_tool_once(store_target: str, driver: str) -> None:
    noted: list[str] = []
    compacted: list[int] = []
    agent, model = _agent(noted, compacted)
    with open_store(store_target) as store:
        session = Session(agent, store=store, session_id="long")
        for question in ("one", "two", "three"):
            result = session.run(question) if driver == "sync" else asyncio.run(session.arun(question))
            assert result.final == f"noted {question}"
        again = Session(Agent(FakeModel(), demo_registry()), store=store, session_id="long")
        stored = [store.load(f"long/{n}") for n in (1, 2, 3)]

    assert noted == ["one", "two", "three"]
    whole: list[tuple[str, str]] = []
    for q in ("one", "two", "three"):
        whole += [("user", q), ("assistant", ""), ("tool", f'"ok {q}"'), ("assistant", f"noted {q}")]
    assert [(m.role, m.content) for m in session.messages] == whole
    assert again.messages == session.messages
    assert again.turns == 3
    # Turn 1 fits; turns 2 and 3 overflow on their first call and compact, and the model is sent the summary.
    assert compacted, "no turn compacted"
    assert any(sent[:1] == ["summary: one"] for sent in model.sent)
    for data in stored[1:]:
        assert data["compaction"] is not None
        assert [m["content"] for m in data["messages"]][: len(data["messages"])] == [
            c for _, c in whole[: len(data["messages"])]
        ]
    assert all(len(sent) <= WINDOW for sent in model.sent if not _overflowing(sent))


def _overflowing(sent: list[str]) -> bool:
    return len(sent) > WINDOW


def test_a_store_less_session_s_compacted_turn_keeps_every_message() -> None:
    noted: list[str] = []
    compacted: list[int] = []
    agent, _ = _agent(noted, compacted)
    session = Session(agent)
    for question in ("one", "two"):
        session.run(question)
    assert noted == ["one", "two"]
    assert [m.content for m in session.messages if m.role == "user"] == ["one", "two"]
    assert len(session.messages) == 8
    assert compacted
