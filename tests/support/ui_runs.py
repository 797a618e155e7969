"""Stored runs for the viewer's tests (stopped, finished, paused, hostile, one still going), and the viewer served."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from fsm_agent import Agent, AgentLoopError, ModelResponse, SqliteStore, ToolRegistry
from fsm_agent.cli.ui import bind, url_of
from fsm_agent.testing import CounterModel, FakeModel, demo_registry, reply, tool_call, tool_turn

WAIT = 15_000
"""Milliseconds a browser test waits for the page before failing."""

HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
"""A model answer that would run script if the page ever treated it as markup."""


def mail_registry(sent: list[dict[str, str]]) -> ToolRegistry:
    """``demo_registry`` plus ``send_email``, which records what it sent in ``sent``."""
    registry = demo_registry()

    @registry.register
    def send_email(to: str, body: str) -> str:
        """Send an email (here: remember it)."""
        sent.append({"to": to, "body": body})
        return f"sent to {to}"

    return registry


def stopped(store: SqliteStore, run_id: str = "stopped") -> None:
    """A run that stops on max_steps after three turns of tool calls."""
    try:
        Agent(CounterModel(), demo_registry(), max_steps=3).run("count", store=store, run_id=run_id)
    except AgentLoopError:
        return
    msg = "the max_steps run was meant to stop"
    raise AssertionError(msg)


def finished(store: SqliteStore, run_id: str = "finished", answer: str = "(2+3)*4 = 20") -> None:
    """A run that calls a tool once, then answers."""
    model = FakeModel([tool_turn(tool_call("add", a=2, b=3), content="first the sum"), reply(answer)])
    Agent(model, demo_registry()).run("what is (2+3)*4?", store=store, run_id=run_id)


def paused(store: SqliteStore, sent: list[dict[str, str]], run_id: str = "paused") -> str:
    """A run paused before a ``send_email`` call that needs approval; returns that call's id."""
    call = tool_call("send_email", to="boss@example.com", body="the report", id="call_mail")
    model = FakeModel([tool_turn(call), reply("mailed")])
    result = Agent(model, mail_registry(sent), approve={"send_email"}).run("mail it", store=store, run_id=run_id)
    assert result.reason == "paused"
    return call.id


def hostile(store: SqliteStore, run_id: str = "hostile") -> None:
    """A finished run whose answer (and tool output) is markup with script in it."""
    finished(store, run_id, answer=HOSTILE)


class GatedModel:
    """A scripted model that waits for ``release()`` before each reply, so a test can watch a run as it goes."""

    def __init__(self, replies: list[ModelResponse]) -> None:
        self.replies = list(replies)
        self.gate = threading.Semaphore(0)

    def release(self, times: int = 1) -> None:
        """Let ``times`` more model calls return."""
        for _ in range(times):
            self.gate.release()

    def complete(self, messages: Any, tools: Any) -> ModelResponse:
        """The next scripted reply, once released (at most 30 s, so a broken test cannot hang)."""
        if not self.gate.acquire(timeout=30):
            msg = "GatedModel was never released"
            raise TimeoutError(msg)
        return self.replies.pop(0)


def live(store: SqliteStore, run_id: str = "live") -> tuple[GatedModel, threading.Thread]:
    """A run started in a thread that waits at its first model call; release the model to let it go on."""
    model = GatedModel(
        [
            tool_turn(tool_call("add", a=1, b=2)),
            tool_turn(tool_call("add", a=3, b=4)),
            reply("done at last"),
        ]
    )
    agent = Agent(model, demo_registry())
    thread = threading.Thread(target=agent.run, args=("go",), kwargs={"store": store, "run_id": run_id}, daemon=True)
    thread.start()
    return model, thread


def all_runs(store: SqliteStore) -> None:
    """Fill ``store`` with a stopped, a finished, a paused and a hostile run."""
    stopped(store)
    finished(store)
    paused(store, [])
    hostile(store)


class Viewer:
    """The viewer over a store, served by uvicorn on a free loopback port in a thread of this process."""

    def __init__(self, store: Any, **options: Any) -> None:
        import uvicorn  # the ui extra; the tests that serve the viewer need it, the others do not

        from fsm_agent.ui import create_app

        self.socket = bind("127.0.0.1", 0)
        self.url = url_of(self.socket)
        config = uvicorn.Config(
            create_app(store, store_name="runs.db", poll=0.1, **options),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started, "the viewer did not start"

    def close(self) -> None:
        """Stop serving and wait for the thread."""
        self.server.should_exit = True
        self.thread.join(10)
        self.socket.close()


def put_row(path: Path, run_id: str, snapshot: dict[str, Any], state: str = "Done") -> None:
    """Write ``snapshot`` as the run ``run_id`` straight into the store's table, past the store's checks."""
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "INSERT INTO runs (run_id, snapshot, state, reason, paused, updated, steps, tokens, seq, base_seq)"
            " VALUES (?, ?, ?, 'done', 0, 1.0, 1, 0, 0, 0)",
            (run_id, json.dumps(snapshot), state),
        )
