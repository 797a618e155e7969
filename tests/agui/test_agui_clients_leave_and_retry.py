"""AG-UI clients as browsers behave: many at once, one that leaves mid-stream, one whose request is sent twice.

The app is served by uvicorn on loopback and every tool counts its
executions per call id, so a call made twice shows as a count of two, never
as two equal results.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.agui_apps import Served, run_input
from support.app_owners import at_once, ending, results_of, stream
from support.sends import SendsPerQuestion, counted_send

from fsm_agent import Agent, SqliteStore
from fsm_agent.agui import app
from fsm_agent.persist import open_store

CLIENTS = 12
"""Browsers sending their first message at the same moment, each on a thread of its own."""


@pytest.mark.slow
def test_many_clients_sending_their_first_message_at_once_each_get_their_turn_and_run_their_tool_once() -> None:
    """Twelve threads at once on the app's default store (SQLite in memory): twelve turns, one send each."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    models: dict[str, SendsPerQuestion] = {}
    registry = counted_send(ran, lock, nap=0.01, by_addressee=True)

    def make_agent(run_input: Any) -> Agent:
        with lock:
            model = models.setdefault(run_input.thread_id, SendsPerQuestion())
        return Agent(model, registry)

    asgi = app(make_agent)
    server = Served(asgi)
    try:
        ends = at_once(
            *[lambda n=n: stream(server.url, run_input(f"tab-{n}", "tool", text=f"to {n}")) for n in range(CLIENTS)]
        )
        for n, events in enumerate(ends):
            assert not isinstance(events, BaseException), events
            assert (ending(events), events[-1]["result"]) == ("RUN_FINISHED success", "sent for question 1")
            assert results_of(events) == [("send-1", f'"sent to to {n}"')]
        assert ran == Counter({f"to {n}:send-1": 1 for n in range(CLIENTS)})
        listed = sorted(run.run_id for run in asgi.store.list_runs())
        assert listed == sorted(f"tab-{n}/1" for n in range(CLIENTS))
        assert all(len(model.calls) == 2 for model in models.values())
    finally:
        server.close()


def test_the_same_request_sent_again_after_its_turn_ended_takes_no_second_turn_and_sends_nothing(
    store_target: str,
) -> None:
    """A proxy or client retries a POST whose answer it lost: the turn it asks for was taken already, once."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    model = SendsPerQuestion()
    registry = counted_send(ran, lock, nap=0.01, by_addressee=True)
    with open_store(store_target) as store:
        server = Served(app(lambda _: Agent(model, registry), store=store))
        try:
            body = run_input("retried", "tool", text="ada")
            first = stream(server.url, body)
            again = stream(server.url, body)
        finally:
            server.close()
        assert ending(first) == "RUN_FINISHED success"
        assert ran == Counter({"ada:send-1": 1})
        assert [run.run_id for run in store.list_runs(session="retried")] == ["retried/1"]
        users = [m for m in store.load("retried/1")["messages"] if m["role"] == "user"]
        assert len(users) == 1
        assert ending(again) != "RUN_FINISHED success" or again[-1]["result"] == first[-1]["result"]


class SlowDisk(SqliteStore):
    """A SQLite store whose awaited journal writes take ``pause`` seconds each, as a busy disk or a far database."""

    pause = 0.0

    async def aappend(self, entry: Any, *, owner: str) -> None:
        """The store's own write, once the pause is over."""
        await asyncio.sleep(self.pause)
        await super().aappend(entry, owner=owner)


def _leave_after(url: str, body: dict[str, Any], marker: str, then: threading.Event | None = None) -> None:
    """Open the stream, read it up to the first line holding ``marker`` (and ``then``), and close it: the tab closed."""
    with httpx.Client(timeout=60) as http, http.stream("POST", url, json=body) as response:
        # Held, so leaving the loop does not close the lines' generator: the client leaves as the block ends.
        lines = response.iter_lines()
        for line in lines:
            if marker in line:
                break
        if then is not None:
            assert then.wait(30)
            time.sleep(0.1)  # the model's answer is back; its checkpoint (a second's write) is under way


@pytest.mark.slow
def test_a_client_leaving_while_the_answer_s_checkpoint_is_written_ends_the_turn_with_it_and_frees_the_thread(
    tmp_path: Path,
) -> None:
    """ag-ui.md: the client leaves as the answer is written; the turn ends with it stored, the next is a new one."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    model = SendsPerQuestion()
    registry = counted_send(ran, lock, nap=0.01, by_addressee=True)
    store = SlowDisk(tmp_path / "runs.db")
    store.pause = 1.0
    server = Served(app(lambda _: Agent(model, registry), store=store))
    try:
        # The client leaves once the model answered after the send, while that answer's checkpoint is written.
        _leave_after(server.url, run_input("tab", "tool", text="ada"), '"TOOL_CALL_RESULT"', model.answered)
        deadline = time.monotonic() + 60  # the cut checkpoint written again, then the end (a second's write each)
        while store.load("tab/1")["state"] not in ("Done", "Failed") and time.monotonic() < deadline:
            time.sleep(0.05)
        cut = store.load("tab/1")
        sent = Counter(ran)
        following = stream(server.url, run_input("tab", "tool", text="bob", run_id="r2"))
    finally:
        server.close()
    assert sent == Counter({"ada:send-1": 1})
    assert ending(following) == "RUN_FINISHED success", following[-1].get("message")
    assert cut["state"] == "Done"  # the answer had come: it is kept, not dropped for a cancel
    assert cut["final"] == "sent for question 1"
    assert ran == Counter({"ada:send-1": 1, "bob:send-2": 1})


def test_a_call_still_running_when_the_client_left_is_not_told_to_the_model_as_not_executed(tmp_path: Path) -> None:
    """The send was in flight when the tab closed and then ran; the next turn must not tell the model it never did."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    hold = threading.Event()
    model = SendsPerQuestion()
    started = threading.Event()
    registry = counted_send(ran, lock, nap=0.01, hold=hold, by_addressee=True, started=started)
    store = SqliteStore(tmp_path / "runs.db")
    server = Served(app(lambda _: Agent(model, registry), store=store))
    try:
        # Left once the send runs in its worker thread: a cut before that (a loaded machine) would never run it.
        _leave_after(server.url, run_input("tab", "tool", text="ada"), '"TOOL_CALL_END"', then=started)
        deadline = time.monotonic() + 30  # the server sees the close and stores the cut (ms when idle)
        while store.load("tab/1")["state"] != "Failed" and time.monotonic() < deadline:
            time.sleep(0.02)
        hold.set()  # the call cut in flight goes on in its worker thread and sends
        deadline = time.monotonic() + 30
        while not ran and time.monotonic() < deadline:
            time.sleep(0.02)
        sent = Counter(ran)
        following = stream(server.url, run_input("tab", "tool", text="bob", run_id="r2"))
    finally:
        hold.set()
        server.close()
    cut = store.load("tab/1")
    assert (cut["state"], cut["reason"], cut["evidence"]["unfinished"]) == ("Failed", "cancelled", "send-1")
    assert sent == Counter({"ada:send-1": 1})  # it ran, once
    assert ending(following) == "RUN_FINISHED success"
    (answer,) = [m for m in model.calls[-1] if m.role == "tool" and m.tool_call_id == "send-1"]
    assert "not executed" not in json.loads(answer.content).get("error", "")
