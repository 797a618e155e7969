"""Sessions: a conversation kept between requests, in memory or in a store, continued by another process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.sessions import echoing_agent

from fsm_agent import (
    Agent,
    AgentLoopError,
    Message,
    ModelResponse,
    RunLeasedError,
    RunStateError,
    Session,
    TurnLeasedError,
)
from fsm_agent.__main__ import main as cli
from fsm_agent.persist import open_store
from fsm_agent.testing import demo_registry, reply
from fsm_agent.tools import JSONSchema


def test_each_turn_continues_the_conversation_with_the_system_prompt_once() -> None:
    """Turn 2 sees turn 1's question, tool call, tool result and answer; the system prompt leads once."""
    agent, model = echoing_agent()
    session = Session(agent)
    assert session.run("add two numbers").final == "answer 1 to add two numbers"
    second = session.run("thanks")
    assert second.final == "answer 2 to thanks"
    roles = [m.role for m in model.seen[-1]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert session.turns == 2


def test_a_stopped_turn_is_kept_and_its_unmade_calls_are_answered_as_not_run() -> None:
    """A turn stopped on max_steps raises, yet the next turn continues after it with every call answered."""
    agent, model = echoing_agent(max_steps=2)
    session = Session(agent)
    with pytest.raises(AgentLoopError) as info:
        session.run("loop forever")
    assert info.value.reason in ("max_steps", "repeated_action")
    assert session.turns == 1
    nxt = session.run("stop now")
    assert nxt.final.startswith("answer 2 to stop now")
    tools = [m for m in model.seen[-1] if m.role == "tool"]
    calls = [c.id for m in model.seen[-1] for c in m.tool_calls]
    assert sorted(t.tool_call_id for t in tools) == sorted(calls)  # every call answered: providers accept it
    assert any("not executed: the turn stopped" in t.content for t in tools)


def test_both_drivers_take_the_same_turns() -> None:
    """``run`` and ``arun`` turns give the same conversation."""
    sync_agent, _ = echoing_agent()
    async_agent, _ = echoing_agent()
    sync = Session(sync_agent)
    asynchronous = Session(async_agent)
    for text in ("add please", "and again"):
        sync.run(text)
        asyncio.run(asynchronous.arun(text))
    assert sync.messages == asynchronous.messages


def test_a_stored_session_is_continued_by_a_new_object_and_listed_by_session(store_target: str) -> None:
    """With a store each turn is a stored run under the session; a new Session with the id carries on."""
    agent, _ = echoing_agent()
    Session(agent, store=store_target, session_id="chat-7").run("add one")
    fresh, model = echoing_agent()
    later = Session(fresh, store=store_target, session_id="chat-7")
    assert later.turns == 1
    assert later.run("and then?").final == "answer 2 to and then?"
    assert [m.role for m in model.seen[-1]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    with open_store(store_target) as store:
        runs = {r.run_id: r.session for r in store.list_runs(session="chat-7")}
        assert runs == {"chat-7/1": "chat-7", "chat-7/2": "chat-7"}
        assert store.load("chat-7/2")["session_id"] == "chat-7"
        assert store.list_runs(session="other") == []


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_session_is_continued_by_another_process(backend: str, tmp_path: Path, request: Any) -> None:
    """Turn 1 here, turn 2 in a new Python process with a new Session: it sees turn 1 and is stored as turn 2."""
    if backend == "sqlite":
        target = str(tmp_path / "runs.db")
    else:
        # A name of its own: the same test twice in one session (a repeat) must not meet its database again.
        target = request.getfixturevalue("postgres_cluster").new_database(f"session_process_{uuid.uuid4().hex[:12]}")
    agent, _ = echoing_agent()
    Session(agent, store=target, session_id="proc").run("add one")
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from support.sessions import echoing_agent
from fsm_agent import Session
agent, model = echoing_agent()
result = Session(agent, store={target!r}, session_id="proc").run("second")
print(result.final, len(model.seen[-1]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["answer", "2", "to", "second", "6"]
    with open_store(target) as store:
        assert {r.run_id for r in store.list_runs(session="proc")} == {"proc/1", "proc/2"}


class Held:
    """A model that waits for ``go`` before answering, so a test can start a second turn meanwhile."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = threading.Event()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.started.set()
        assert self.go.wait(10)
        return reply("held answer")


def test_two_turns_of_one_stored_session_at_once_never_interleave(store_target: str) -> None:
    """While turn 1 runs in one object, a turn from another is a RunLeasedError; turn 1 alone is stored."""
    held = Held()
    first = Session(Agent(held, demo_registry()), store=store_target, session_id="busy")
    worker = threading.Thread(target=first.run, args=("slow question",))
    worker.start()
    try:
        assert held.started.wait(10)
        other_agent, other_model = echoing_agent()
        with pytest.raises(RunLeasedError, match="turn 1 of session 'busy' is still being taken by ") as busy:
            Session(other_agent, store=store_target, session_id="busy").run("me too")
        assert type(busy.value) is TurnLeasedError  # public: a traceback names fsm_agent.errors.TurnLeasedError
        assert other_model.seen == []
    finally:
        held.go.set()
        worker.join(10)
    with open_store(store_target) as store:
        assert [r.run_id for r in store.list_runs(session="busy")] == ["busy/1"]
    follow, _ = echoing_agent()
    assert Session(follow, store=store_target, session_id="busy").run("now").final == "answer 2 to now"


def test_two_turns_of_one_session_object_at_once_wait_for_each_other() -> None:
    """The same object asked twice at once takes the turns one after the other: histories never interleave."""
    agent, model = echoing_agent()
    session = Session(agent)
    threads = [threading.Thread(target=session.run, args=(f"question {i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert session.turns == 4
    users = [[m.content for m in seen if m.role == "user"] for seen in model.seen]
    assert [len(u) for u in users] == [1, 2, 3, 4]  # each turn saw every turn before it, whole


def test_a_paused_turn_must_be_resumed_before_the_next(store_target: str) -> None:
    """A turn paused for approval refuses a new turn naming the call; ``resume`` decides and continues it."""
    agent, model = echoing_agent(approve={"add"})
    session = Session(agent, store=store_target, session_id="ask")
    assert session.run("add it").reason == "paused"
    with pytest.raises(RunStateError, match=r"turn 1 of session 'ask' is paused for a decision on add \(a1\)"):
        Session(agent, store=store_target, session_id="ask").run("next")
    resumed = Session(agent, store=store_target, session_id="ask").resume({"a1": True})
    assert resumed.reason == "done"
    assert session.run("next").final == "answer 2 to next"
    assert len(model.seen) == 3


def test_runs_list_filters_by_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``runs list --session ID`` lists that conversation's turns only."""
    db = str(tmp_path / "runs.db")
    agent, _ = echoing_agent()
    one = Session(agent, store=db, session_id="one")
    one.run("hi")
    one.run("again")
    Session(agent, store=db, session_id="two").run("hello")
    assert cli(["runs", "list", "--store", db, "--session", "one"]) == 0
    listed = sorted(line.split("\t")[0] for line in capsys.readouterr().out.splitlines())
    assert listed == ["one/1", "one/2"]


def test_the_viewer_lists_a_session_s_turns(tmp_path: Path) -> None:
    """``/api/runs?session=`` lists one conversation's turns, each row naming its session."""
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")
    from starlette.testclient import TestClient

    from fsm_agent.ui import create_app

    db = str(tmp_path / "runs.db")
    agent, _ = echoing_agent()
    Session(agent, store=db, session_id="s1").run("hi")
    Session(agent, store=db, session_id="s2").run("hi")
    with open_store(db) as store:
        client = TestClient(create_app(store), base_url="http://127.0.0.1")
        rows = client.get("/api/runs", params={"session": "s1"}).json()["runs"]
    assert [(r["run_id"], r["session"]) for r in rows] == [("s1/1", "s1")]
    assert json.dumps(rows)  # plain JSON
