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
from support.deadline_cuts import DEADLINE
from support.sends import counted_send

from fsm_agent import Agent, Message, Session
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

CUT = "cut off while running (timeout): it may have run; its outcome is unknown"
NOT_RUN = "not executed: the turn stopped (timeout) before this call"

# Each run here waits for its real deadline (see support.deadline_cuts): the call it cuts is held until it has.
pytestmark = pytest.mark.slow


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
    release = threading.Event()  # s1 is held in flight until the run has stopped at its deadline
    registry = counted_send(ran, threading.Lock(), hold=release)
    model = FakeModel(
        tool_turn(tool_call("send", id="s1", to="ada"), tool_call("send", id="s2", to="bob")), reply("Told you.")
    )
    agent = Agent(model, registry, timeout=DEADLINE, on_stop={"timeout": "return"})
    chat = Session(agent, store=tmp_path / "runs.db" if stored else None, session_id="chat")
    cut = chat.run("mail ada and bob")
    assert (cut.reason, cut.evidence.get("unfinished")) == ("timeout", "s1")
    assert ran == Counter()
    release.set()
    _wait_for(ran, "s1")
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
    release = threading.Event()  # both calls are held in flight until the run has stopped at its deadline
    registry = counted_send(ran, threading.Lock(), hold=release)
    model = FakeModel(
        tool_turn(tool_call("send", id="s1", to="ada"), tool_call("send", id="s2", to="bob")), reply("Told you.")
    )
    agent = Agent(model, registry, timeout=DEADLINE, on_stop={"timeout": "return"})
    chat = Session(agent, store=tmp_path / "runs.db", session_id="chat")
    cut = asyncio.run(chat.arun("mail ada and bob"))
    assert (cut.reason, cut.evidence.get("unfinished")) == ("timeout", "s1, s2")
    assert ran == Counter()
    release.set()
    _wait_for(ran, "s1")
    _wait_for(ran, "s2")
    assert ran == Counter({"s1": 1, "s2": 1})
    assert _errors(chat.messages, "s1", "s2") == [CUT, CUT]
    assert asyncio.run(chat.arun("and now?")).final == "Told you."
    assert _errors(model.seen[-1], "s1", "s2") == [CUT, CUT]
    assert ran == Counter({"s1": 1, "s2": 1})
