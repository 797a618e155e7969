"""The same AG-UI request (same threadId and runId) sent twice: answered from the turn it took, nothing called again.

The app is served by uvicorn on loopback; the model counts its calls and the
tool its executions per call id.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from support.agui_apps import Served, run_input
from support.app_owners import at_once, ending, results_of, stream
from support.sends import SendsPerQuestion, counted_send

from fsm_agent import Agent, ToolRegistry
from fsm_agent.agui import app

TRIALS = 5
"""Threads on which two copies of one request race."""


def _served(models: dict[str, SendsPerQuestion], registry: ToolRegistry, **agent: Any) -> tuple[Served, Any]:
    lock = threading.Lock()

    def make_agent(run_input: Any) -> Agent:
        with lock:
            model = models.setdefault(run_input.thread_id, SendsPerQuestion())
        return Agent(model, registry, **agent)

    asgi = app(make_agent)
    return Served(asgi), asgi


@pytest.mark.slow
def test_the_same_request_sent_twice_at_once_takes_one_turn_and_sends_once() -> None:
    """Two copies of one request race on each thread: one takes the turn, the other takes none and sends nothing."""
    ran: Counter[str] = Counter()
    models: dict[str, SendsPerQuestion] = {}
    server, asgi = _served(models, counted_send(ran, threading.Lock(), nap=0.05, by_addressee=True))
    try:
        for trial in range(TRIALS):
            body = run_input(f"tab-{trial}", "tool", text=f"to {trial}")
            ends = at_once(lambda body=body: stream(server.url, body), lambda body=body: stream(server.url, body))
            assert not any(isinstance(events, BaseException) for events in ends), ends
            finished = [events for events in ends if ending(events) == "RUN_FINISHED success"]
            refused = [events for events in ends if ending(events) != "RUN_FINISHED success"]
            assert finished, ends
            assert {events[-1]["result"] for events in finished} == {"sent for question 1"}
            # The copy that came while the turn was being taken is told so: it may retry, and is then answered.
            assert all("still being taken" in events[-1]["message"] for events in refused), refused
            assert [r.run_id for r in asgi.store.list_runs(session=f"tab-{trial}")] == [f"tab-{trial}/1"]
            again = stream(server.url, body)
            assert (ending(again), again[-1]["result"]) == ("RUN_FINISHED success", "sent for question 1")
            assert results_of(again) == []
            assert len(models[f"tab-{trial}"].calls) == 2
    finally:
        server.close()
    assert ran == Counter({f"to {trial}:send-1": 1 for trial in range(TRIALS)})


def test_the_same_request_while_its_turn_is_paused_is_told_the_interrupt_again_then_the_result() -> None:
    ran: Counter[str] = Counter()
    models: dict[str, SendsPerQuestion] = {}
    server, asgi = _served(models, counted_send(ran, threading.Lock(), nap=0.05, by_addressee=True), approve={"send"})
    try:
        body = run_input("tab", "tool", text="ada")
        paused = stream(server.url, body)
        again = stream(server.url, body)
        answer = [{"interruptId": "send-1", "status": "resolved", "payload": {"approved": True}}]
        resumed = stream(server.url, run_input("tab", "tool", run_id="r2", resume=answer))
        after = stream(server.url, body)
        resume_again = stream(server.url, run_input("tab", "tool", run_id="r2", resume=answer))
    finally:
        server.close()
    assert ending(paused) == ending(again) == "RUN_FINISHED interrupt"
    assert again[-1]["outcome"]["interrupts"] == paused[-1]["outcome"]["interrupts"]
    assert (ending(resumed), resumed[-1]["result"]) == ("RUN_FINISHED success", "sent for question 1")
    assert (ending(after), after[-1]["result"]) == ("RUN_FINISHED success", "sent for question 1")
    assert results_of(after) == []
    # The answer sent again is refused, naming the decision that was acted on.
    assert ending(resume_again) == "RUN_ERROR"
    assert "tool call 'send-1' was already approved and made" in resume_again[-1]["message"]
    assert [r.run_id for r in asgi.store.list_runs(session="tab")] == ["tab/1"]
    assert len(models["tab"].calls) == 2
    assert ran == Counter({"ada:send-1": 1})


def test_the_same_request_after_its_turn_stopped_gets_the_same_error_and_nothing_is_called() -> None:
    ran: Counter[str] = Counter()
    models: dict[str, SendsPerQuestion] = {}
    server, asgi = _served(models, counted_send(ran, threading.Lock(), nap=0.05, by_addressee=True), max_steps=1)
    try:
        body = run_input("tab", "tool", text="ada")
        first = stream(server.url, body)
        again = stream(server.url, body)
    finally:
        server.close()
    assert (ending(first), first[-1]["code"]) == ("RUN_ERROR", "max_steps")
    assert (ending(again), again[-1]["code"], again[-1]["message"]) == ("RUN_ERROR", "max_steps", first[-1]["message"])
    assert [e["type"] for e in again] == ["RUN_STARTED", "RUN_ERROR"]
    assert [r.run_id for r in asgi.store.list_runs(session="tab")] == ["tab/1"]
    assert len(models["tab"].calls) == 1
    assert ran == Counter({"ada:send-1": 1})
