"""A Session's history holds every turn's messages, a turn cut or stopped included (docs/how-to/conversations.md).

"``session.messages`` is the whole conversation"; "without a store the
session keeps the conversation in memory, for the life of the object"; "A
stopped turn ... after the session has taken in its messages".  Every tool
counts its executions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, Session, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn


class _Steps:
    """Asks for ``slow(1)``, then ``slow(2)``, then answers naming how many questions it was sent."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def complete(self, messages: Sequence[Message], tools: list[Any]) -> ModelResponse:
        self.seen.append([m.content for m in messages])
        last = max(i for i, m in enumerate(messages) if m.role == "user")
        answered = sum(1 for m in messages[last:] if m.role == "tool")
        if messages[last].content == "go" and answered < 2:
            return tool_turn(tool_call("slow", id=f"s{answered + 1}", n=answered + 1))
        return reply(f"{sum(1 for m in messages if m.role == 'user')} questions")


def _session(store: Any, done: list[int], started: list[asyncio.Event]) -> tuple[Session, _Steps]:
    tools = ToolRegistry()

    @tools.register
    async def slow(n: int) -> str:
        """Step ``n``; step 2 waits until its task is cancelled."""
        if n == 2:
            started[0].set()
            await asyncio.Event().wait()
        done.append(n)
        return f"ok {n}"

    model = _Steps()
    return Session(Agent(model, tools), store=store, session_id="chat"), model


def _cut_then_next(session: Session, started: list[asyncio.Event]) -> str:
    async def go() -> str:
        started[0] = asyncio.Event()
        turn = asyncio.create_task(session.arun("go"))
        await started[0].wait()
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        return (await session.arun("and now?")).final

    return asyncio.run(go())


EXPECTED = [
    ("user", "go"),
    ("assistant", ""),
    ("tool", '"ok 1"'),
    ("assistant", ""),
    ("tool", '{"error": "cut off while running (cancelled): it may have run; its outcome is unknown"}'),
    ("user", "and now?"),
    ("assistant", "2 questions"),
]


def test_a_stored_sessions_turn_whose_task_was_cancelled_is_kept_in_the_next_turns_history(store_target: str) -> None:
    done: list[int] = []
    started: list[asyncio.Event] = [asyncio.Event()]
    with open_store(store_target) as store:
        session, model = _session(store, done, started)
        assert _cut_then_next(session, started) == "2 questions"
        assert session.turns == 2
        assert [(m.role, m.content) for m in session.messages] == EXPECTED
        again = Session(Agent(FakeModel(), demo_registry()), store=store, session_id="chat")
        assert [(m.role, m.content) for m in again.messages] == EXPECTED
    assert done == [1]
    assert len(model.seen) == 3


def test_a_store_less_sessions_turn_whose_task_was_cancelled_is_kept_in_the_next_turns_history() -> None:
    """The same cut without a store: the turn's question and its completed call's result must not vanish."""
    done: list[int] = []
    started: list[asyncio.Event] = [asyncio.Event()]
    session, _ = _session(None, done, started)
    final = _cut_then_next(session, started)
    assert done == [1]  # slow(1) ran: its result is part of the conversation
    assert [(m.role, m.content) for m in session.messages][:3] == EXPECTED[:3]
    assert final == "2 questions"
    assert session.turns == 2


@pytest.mark.parametrize("stored", [False, True])
def test_session_resume_of_a_stopped_turn_keeps_every_message_and_the_next_turn_builds_on_it(
    stored: bool, tmp_path: Any
) -> None:
    echoed: list[str] = []
    tools = demo_registry()

    @tools.register
    def note(text: str) -> str:
        """Note a word, counted."""
        echoed.append(text)
        return text

    model = FakeModel(
        tool_turn(tool_call("note", id="c1", text="a")),
        tool_turn(tool_call("note", id="c2", text="b")),
        reply("Two."),
        reply("Next."),
    )
    target = str(tmp_path / "chat.db") if stored else None
    session = Session(Agent(model, tools, max_steps=1), store=target, session_id="s")
    with pytest.raises(AgentLoopError) as stop:
        session.run("count")
    assert stop.value.reason == "max_steps"
    assert session.resume(max_steps=3).final == "Two."
    assert session.turns == 1
    assert session.run("more").final == "Next."
    whole = [("user", "count"), ("assistant", ""), ("tool", '"a"'), ("assistant", ""), ("tool", '"b"')]
    whole += [("assistant", "Two."), ("user", "more"), ("assistant", "Next.")]
    assert [(m.role, m.content) for m in session.messages] == whole
    assert [m.content for m in model.seen[-1]] == [c for _, c in whole[:-1]]
    assert echoed == ["a", "b"]
    if stored:
        again = Session(Agent(FakeModel(), demo_registry()), store=target, session_id="s")
        assert (again.turns, [(m.role, m.content) for m in again.messages]) == (2, whole)


def test_a_store_less_sessions_turn_cut_by_ctrl_c_is_kept_in_the_next_turns_history() -> None:
    """A ``KeyboardInterrupt`` from a tool on the sync driver leaves the turn unfinished: kept, its call cut off."""
    done: list[int] = []
    tools = ToolRegistry()

    @tools.register
    def slow(n: int) -> str:
        """Step ``n``; step 2 is cut short, as by Ctrl-C."""
        if n == 2:
            raise KeyboardInterrupt
        done.append(n)
        return f"ok {n}"

    session = Session(Agent(_Steps(), tools))
    with pytest.raises(KeyboardInterrupt):
        session.run("go")
    assert session.turns == 1
    assert session.run("and now?").final == "2 questions"
    assert done == [1]
    cut = '{"error": "cut off while running (interrupted): it may have run; its outcome is unknown"}'
    assert [(m.role, m.content) for m in session.messages] == [*EXPECTED[:4], ("tool", cut), *EXPECTED[5:]]


def test_a_call_cut_by_ctrl_c_in_a_store_less_session_is_never_told_as_not_run() -> None:
    calls: list[str] = []
    tools = ToolRegistry()

    @tools.register
    def weather(city: str) -> str:
        """The weather in a city; the first call for Rome is cut short, as by Ctrl-C."""
        calls.append(city)
        if calls == ["Paris", "Rome"]:
            raise KeyboardInterrupt
        return f"sunny in {city}"

    model = FakeModel(
        tool_turn(tool_call("weather", id="c1", city="Paris"), tool_call("weather", id="c2", city="Rome")),
        reply("You are welcome."),
    )
    chat = Session(Agent(model, tools))
    with pytest.raises(KeyboardInterrupt):
        chat.run("Weather in Paris and Rome?")
    assert calls == ["Paris", "Rome"]  # Rome's call was made: it was running when the Ctrl-C came
    told = {m.tool_call_id: m.content for m in chat.messages if m.role == "tool"}
    assert told["c1"] == '"sunny in Paris"'
    assert "not executed" not in told["c2"], told["c2"]  # today: not executed: the turn stopped (stopped) ...
