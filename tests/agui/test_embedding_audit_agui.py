"""An app embedding the AG-UI endpoint as a web service does: per-request deps, clients that leave and retry.

Every tool counts its executions per call id, so a call made twice shows as
a count of two.  The app is served by uvicorn on loopback (``Served``) and
read with a real HTTP client, except where only the agent factory matters.
"""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import httpx
from starlette.testclient import TestClient
from support.agui_apps import Served, post, run_input
from support.app_owners import ending, stream
from support.polling import held_within
from support.sqlite_writer import writer_holds_a_write
from support.turn_models import RetriesWhatWasNotRun

from fsm_agent import Agent, Message, ModelResponse, RunContext, SqliteStore, ToolRegistry
from fsm_agent.agui import app
from fsm_agent.persist import Store, open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

WAIT = 10.0
"""Seconds a test waits for the server to get where it wants it (milliseconds when idle)."""


class SendsOnce:
    """Asks for ``send`` (call ``s1``) until the user's last message has a tool result after it, then answers."""

    def __init__(self) -> None:
        self.calls: list[tuple[Message, ...]] = []
        self._lock = threading.Lock()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self._lock:
            self.calls.append(tuple(messages))
        last = max(i for i, m in enumerate(messages) if m.role == "user")
        if not any(m.role == "tool" for m in messages[last:]):
            return tool_turn(tool_call("send", id="s1", to=messages[last].content))
        return reply("sent")


def _state(store: Store, run_id: str) -> tuple[str, str | None]:
    stored = store.load(run_id)
    return stored["state"], stored["reason"]


# --- deps -------------------------------------------------------------------------------------------------------


class Account:
    """What one request of the app holds: the signed-in user and their orders."""

    ORDERS: ClassVar[dict[str, list[str]]] = {"alice": ["A-17"], "bob": ["B-2"]}

    def __init__(self, user: str) -> None:
        self.user = user


def my_orders(ctx: RunContext[Account]) -> list[str]:
    """The signed-in user's orders."""
    return Account.ORDERS[ctx.deps.user]


def test_a_tool_reading_the_requests_deps_gets_each_requests_own_over_ag_ui() -> None:
    """Two users' requests: each one's tool reads that request's deps (built from the request), never NoDepsError."""

    class Orders:
        def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
            if not any(m.role == "tool" for m in messages):
                return tool_turn(tool_call("my_orders", id="o1"))
            return reply("Your orders.")

    def make_agent(run_input: Any) -> Agent:
        return Agent(Orders(), [my_orders])

    def make_deps(run_input: Any) -> Account:
        return Account(run_input.forwarded_props["user"])

    # Whatever the endpoint calls its per-request deps factory, it is handed this one.
    keywords = [name for name in inspect.signature(app).parameters if "deps" in name]
    asgi = app(make_agent, **dict.fromkeys(keywords, make_deps))
    with TestClient(asgi) as client:
        ends = {}
        for user in ("alice", "bob"):
            body = {**run_input(f"t-{user}", "tool", run_id=f"r-{user}"), "forwardedProps": {"user": user}}
            events = post(client, body)
            ends[user] = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert ends == {"alice": ['["A-17"]'], "bob": ['["B-2"]']}


# --- a client that leaves during an approved call, then sends its answer again ------------------------------------


def test_an_interrupt_answer_sent_again_after_the_client_left_mid_call_makes_the_approved_call_once(
    store_target: str,
) -> None:
    """ag-ui.md: an answer sent again after it was acted on is a RUN_ERROR naming the decision; the send runs once."""
    ran: Counter[str] = Counter()
    entered, gate, returned = threading.Event(), threading.Event(), threading.Event()
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted per call id); held until the test lets go."""
        ran[call_id] += 1
        entered.set()
        gate.wait(WAIT)
        returned.set()
        return f"sent to {to}"

    model = SendsOnce()
    with open_store(store_target) as store:
        server = Served(app(lambda _: Agent(model, registry, approve={"send"}), store=store))
        try:
            assert ending(stream(server.url, run_input("tab", "tool"))) == "RUN_FINISHED interrupt"
            answer = [{"interruptId": "s1", "status": "resolved", "payload": {"approved": True}}]
            body = run_input("tab", "tool", run_id="r2", resume=answer)
            with httpx.Client(timeout=WAIT) as http, http.stream("POST", server.url, json=body) as response:
                assert response.status_code == 200
                assert entered.wait(WAIT)  # the approved send is running: the tab closes now
            assert held_within(lambda: _state(store, "tab/1")[0] == "Failed", WAIT)
            assert _state(store, "tab/1") == ("Failed", "cancelled")
            gate.set()  # the cut send goes on in its worker thread, and sends
            assert returned.wait(WAIT)
            again = stream(server.url, body)  # the client lost the answer and sends it again
        finally:
            gate.set()
            server.close()
    assert ran == Counter({"s1": 1})
    assert ending(again) == "RUN_ERROR"


# --- a client that leaves while the store commits a checkpoint ---------------------------------------------------


def _locked_by_another_writer(path: Path, other: list[sqlite3.Connection]) -> None:
    """Another connection to the file (another process, the run viewer) takes SQLite's write lock, once."""
    if not other:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("BEGIN IMMEDIATE")
        other.append(db)


def test_a_client_leaving_while_the_store_commits_the_tools_checkpoint_does_not_keep_the_thread_waiting(
    tmp_path: Path,
) -> None:
    """ag-ui.md: a client that leaves while the turn's checkpoint is written leaves no half-kept turn; next is served.

    Another writer holds SQLite's write lock from the send's ``after_tool``
    hook on (its outcome is written before that: ``Journal.keep_outcome``),
    so the store's writer thread has taken the transition's checkpoint and
    waits to commit it when the client leaves; the lock is let go after the
    server saw the client leave.
    """
    path = tmp_path / "runs.db"
    ran: Counter[str] = Counter()
    other: list[sqlite3.Connection] = []
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted)."""
        ran[call_id] += 1
        return f"sent to {to}"

    model = SendsOnce()
    store = SqliteStore(path)
    cut = threading.Event()

    def make_agent(_: Any) -> Agent:
        agent = Agent(model, registry)
        agent.on("after_tool", lambda event: _locked_by_another_writer(path, other))
        agent.on("unfinished", lambda event: cut.set())  # the turn's task was cancelled inside the write
        return agent

    server = Served(app(make_agent, store=store))
    try:
        with httpx.Client(timeout=WAIT) as http, http.stream("POST", server.url, json=run_input("tab", "tool")) as got:
            lines = got.iter_lines()
            for line in lines:
                if '"TOOL_CALL_RESULT"' in line:
                    break
            # The send's checkpoint is in the writer's hands: the tab closes.
            assert held_within(writer_holds_a_write, WAIT)
        assert cut.wait(WAIT)  # the server saw the client leave and cancelled the turn mid-write
        other[0].execute("COMMIT")  # the other writer is done: the send's checkpoint commits
        held_within(lambda: _state(store, "tab/1")[0] in ("Done", "Failed"), 1.0)
        first = _state(store, "tab/1")
        following = stream(server.url, run_input("tab", "tool", text="again", run_id="r2"))
    finally:
        for db in other:
            db.close()
        server.close()
    assert ending(following) == "RUN_FINISHED success", following[-1].get("message")
    assert first[0] in ("Done", "Failed")
    assert ran["s1"] == 1


def test_a_client_leaving_while_the_store_commits_the_tools_outcome_ends_the_turn_cancelled_with_it_kept(
    tmp_path: Path,
) -> None:
    """The write of the send's outcome (before its ``after_tool`` hooks: the relay's) waits on another writer's lock.

    The client leaves then: the turn stops ``cancelled`` with the send kept
    (``also_ran``), no call in flight, and the thread's next turn is served
    once the lock is let go; the send ran once.
    """
    path = tmp_path / "runs.db"
    ran: Counter[str] = Counter()
    other: list[sqlite3.Connection] = []
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted); another writer of the file takes its write lock as it returns."""
        ran[call_id] += 1
        _locked_by_another_writer(path, other)
        return f"sent to {to}"

    model = SendsOnce()
    store = SqliteStore(path)
    asgi = app(lambda _: Agent(model, registry), store=store)
    server = Served(asgi)
    try:
        with httpx.Client(timeout=WAIT) as http, http.stream("POST", server.url, json=run_input("tab", "tool")) as got:
            lines = got.iter_lines()
            for line in lines:
                if '"TOOL_CALL_END"' in line:
                    break
            assert held_within(writer_holds_a_write, WAIT)  # the send returned; its outcome waits for the lock
        assert held_within(lambda: bool(asgi._left), WAIT)  # the server saw the client leave
        other[0].execute("COMMIT")
        assert held_within(lambda: _state(store, "tab/1")[0] == "Failed", WAIT)
        stored = store.load("tab/1")
        following = stream(server.url, run_input("tab", "tool", text="again", run_id="r2"))
    finally:
        for db in other:
            db.close()
        server.close()
    assert (stored["reason"], stored["evidence"]["also_ran"], stored["evidence"].get("unfinished")) == (
        "cancelled",
        ["s1"],
        None,
    )
    assert ending(following) == "RUN_FINISHED success", following[-1].get("message")
    assert ran == Counter({"s1": 1, "s1-2": 1})  # the next turn's question asks for a send of its own
    assert len(model.calls) == 3  # the first turn's one call (none after the client left), the next turn's two
    assert [m.tool_call_id for m in model.calls[1] if m.role == "tool"] == ["s1"]  # the next turn is told s1 once


class SlowNextWrite(SqliteStore):
    """A SQLite store whose next awaited journal write, once ``slow`` is set, waits until its caller is cancelled.

    A disk (or a far database) that takes longer than the client stays: the
    write is under way when the client leaves, whatever the machine's load.
    """

    slow = False

    async def aappend(self, entry: Any, *, owner: str) -> None:
        """The store's own write, after the wait if one was asked for (the cancel ends the wait, not the write)."""
        if self.slow:
            self.slow = False
            await asyncio.sleep(WAIT)
        await super().aappend(entry, owner=owner)


def test_a_client_leaving_while_the_tools_checkpoint_is_written_makes_no_further_model_call(tmp_path: Path) -> None:
    """ag-ui.md: the write is finished and the run stops before its next call (cancelled); the model is not asked."""
    ran: Counter[str] = Counter()
    store = SlowNextWrite(tmp_path / "runs.db")
    registry = ToolRegistry()
    sent = threading.Event()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted); the disk is slow for the write of its outcome."""
        ran[call_id] += 1
        store.slow = True
        sent.set()
        return f"sent to {to}"

    model = SendsOnce()
    asgi = app(lambda _: Agent(model, registry), store=store)
    server = Served(asgi)
    try:
        with httpx.Client(timeout=WAIT) as http, http.stream("POST", server.url, json=run_input("tab", "tool")) as got:
            lines = got.iter_lines()
            for line in lines:
                if '"TOOL_CALL_END"' in line:
                    break
            assert sent.wait(WAIT)  # the client leaves while the send's outcome is being written
        assert held_within(lambda: _state(store, "tab/1")[0] in ("Done", "Failed"), WAIT)
        stored = store.load("tab/1")
    finally:
        server.close()
    assert ran == Counter({"s1": 1})
    assert len(model.calls) == 1, "the model was asked again after the client left"
    assert (stored["state"], stored["reason"]) == ("Failed", "cancelled")


# --- a client that leaves in the middle of a parallel batch ------------------------------------------------------


def test_charges_that_ran_before_the_client_left_mid_batch_are_not_told_as_not_executed(tmp_path: Path) -> None:
    """ag-ui.md/conversations.md: the next turn tells the model what is known; each charge is made once."""
    charged: Counter[int] = Counter()
    registry = ToolRegistry()

    @registry.register
    async def slow(n: int) -> str:
        """Wait for a reply that comes late."""
        await asyncio.sleep(30)
        return "late"

    @registry.register
    async def charge(cents: int) -> str:
        """Charge the card (counted)."""
        charged[cents] += 1
        return f"charged {cents}"

    model = RetriesWhatWasNotRun()
    store = SqliteStore(tmp_path / "runs.db")
    server = Served(app(lambda _: Agent(model, registry), store=store))
    try:
        body = run_input("tab", "tool", text="Charge 2 and 3 cents.")
        with httpx.Client(timeout=WAIT) as http, http.stream("POST", server.url, json=body) as response:
            assert response.status_code == 200
            assert held_within(lambda: len(charged) == 2, WAIT)  # both charges came back; slow is still in flight
        assert held_within(lambda: _state(store, "tab/1")[0] == "Failed", WAIT)
        following = stream(server.url, run_input("tab", "tool", text="Did it work?", run_id="r2"))
    finally:
        server.close()
    assert ending(following) == "RUN_FINISHED success"
    told = {m.tool_call_id: m.content for m in model.seen[1] if m.role == "tool"}
    assert "not executed" not in told["c2"]
    assert "not executed" not in told["c3"]
    assert charged == Counter({2: 1, 3: 1})
