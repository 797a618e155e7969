"""A tool call a cancel or a deadline cut off while it ran is told to the model as such, never as "not executed".

A sync tool cut that way goes on in its worker thread and makes its effect,
so the model must not be invited to make it again; a call of the same reply
that never started is still told it did not run.  Every tool counts its
executions per call id.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from fsm_agent import Agent, Message, Session, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

CUT = "cut off while running (timeout): it may have run; its outcome is unknown"
NOT_RUN = "not executed: the turn stopped (timeout) before this call"


def counted(ran: Counter[str], lock: threading.Lock) -> ToolRegistry:
    """``send`` counts each execution by call id, after 0.3 s (longer than the runs' timeout)."""
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted per call id)."""
        time.sleep(0.3)
        with lock:
            ran[call_id] += 1
        return f"sent to {to}"

    return registry


def _wait_for(ran: Counter[str], call_id: str) -> None:
    deadline = time.monotonic() + 10
    while not ran[call_id] and time.monotonic() < deadline:  # the cut call goes on in its worker thread
        time.sleep(0.01)


def _errors(messages: Iterable[Message], *ids: str) -> list[str]:
    """The error texts of the tool messages answering ``ids``, in that order."""
    answers = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    return [json.loads(answers[call_id])["error"] for call_id in ids]


@pytest.mark.parametrize("stored", [False, True], ids=["in-memory", "sqlite"])
def test_the_call_a_deadline_cut_is_told_as_cut_and_the_call_never_started_as_not_run(
    stored: bool, tmp_path: Path
) -> None:
    ran: Counter[str] = Counter()
    registry = counted(ran, threading.Lock())
    model = FakeModel(
        tool_turn(tool_call("send", id="s1", to="ada"), tool_call("send", id="s2", to="bob")), reply("Told you.")
    )
    agent = Agent(model, registry, timeout=0.1, on_stop={"timeout": "return"})
    chat = Session(agent, store=tmp_path / "runs.db" if stored else None, session_id="chat")
    cut = chat.run("mail ada and bob")
    assert (cut.reason, cut.evidence.get("unfinished")) == ("timeout", "s1")
    _wait_for(ran, "s1")
    time.sleep(0.1)
    assert ran == Counter({"s1": 1})  # s1 ran in its thread; s2 never started
    assert _errors(chat.messages, "s1", "s2") == [CUT, NOT_RUN]
    if stored:
        again = Session(agent, store=tmp_path / "runs.db", session_id="chat")
        assert _errors(again.messages, "s1", "s2") == [CUT, NOT_RUN]
    assert chat.run("and now?").final == "Told you."
    assert _errors(model.seen[-1], "s1", "s2") == [CUT, NOT_RUN]
    assert ran == Counter({"s1": 1})


def test_every_call_of_a_batch_a_deadline_cut_in_flight_on_the_async_driver_is_told_as_cut(tmp_path: Path) -> None:
    """``arun`` makes a reply's calls at once: the deadline cuts both in flight, both go on and send."""
    ran: Counter[str] = Counter()
    registry = counted(ran, threading.Lock())
    model = FakeModel(
        tool_turn(tool_call("send", id="s1", to="ada"), tool_call("send", id="s2", to="bob")), reply("Told you.")
    )
    agent = Agent(model, registry, timeout=0.1, on_stop={"timeout": "return"})
    chat = Session(agent, store=tmp_path / "runs.db", session_id="chat")
    cut = asyncio.run(chat.arun("mail ada and bob"))
    assert (cut.reason, cut.evidence.get("unfinished")) == ("timeout", "s1, s2")
    _wait_for(ran, "s1")
    _wait_for(ran, "s2")
    assert ran == Counter({"s1": 1, "s2": 1})
    assert _errors(chat.messages, "s1", "s2") == [CUT, CUT]
    assert asyncio.run(chat.arun("and now?")).final == "Told you."
    assert _errors(model.seen[-1], "s1", "s2") == [CUT, CUT]
    assert ran == Counter({"s1": 1, "s2": 1})
