"""The sixth embedding audit: the loop as web handlers, workers and chat sessions embed it.

Readers of ``astream`` that stop between transitions, a request retried
with its ``run_id`` while the first copy still runs, many ``Session.aopen``
requests on one event loop with half their handlers cancelled mid-call (on
SQLite and PostgreSQL), and AG-UI clients over real HTTP whose agents are
traced with the OpenTelemetry SDK's in-memory exporter, one client leaving
mid-call.  Every tool counts its executions per (run id, call id) and checks
that it reached its own request's deps; every model counts its calls per
question.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.agui_apps import Served, StreamingModel, run_input
from support.app_owners import at_once, ending, stream
from support.embedding_round_six import ChargesOnce, Gates, Traced, charges
from support.polling import held_within
from support.sdk import skip_unless_installed

from fsm_agent import Agent, RunExistsError, Session, SqliteStore, TransitionEvent
from fsm_agent.agui import app
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

skip_unless_installed("opentelemetry.sdk", reason="pip install 'fsm-agent[otel]'")

WAIT = 30.0
"""Seconds a test waits for the server to get where it wants it (milliseconds when idle)."""


# --- astream readers that stop between transitions ---------------------------------------------------------------


@pytest.mark.parametrize("streams", [False, True], ids=["plain-model", "streaming-model"])
def test_an_astream_reader_that_stops_on_a_transition_leaves_no_run_span_open(streams: bool) -> None:
    """A handler relays ``astream`` to its client and stops at the first edge (the client left): the run ends.

    No call is in flight then, so nothing is cut: the run, which nobody
    drives on, stops ``cancelled`` before its next call (the tool the reply
    asked for never runs), and its ``invoke_agent`` span ends with that
    reason (``drivers/streaming.py``; ``Agent.astream`` closes ``aevents``
    as it is closed, as ``yield from`` does for ``stream``).
    """
    script = (tool_turn(tool_call("add", id="c1", a=2, b=3)), reply("5"))
    model = StreamingModel(*script) if streams else FakeModel(*script)
    traced = Traced()
    agent = traced.instrument(Agent(model, demo_registry()))
    seen: list[Any] = []

    async def handler() -> None:
        async with contextlib.aclosing(agent.astream("What is 2+3?")) as events:
            async for event in events:
                seen.append(event)
                if isinstance(event, TransitionEvent):
                    break  # the client went away while this edge was sent

    asyncio.run(handler())
    assert [e.dest for e in seen if isinstance(e, TransitionEvent)] == ["CheckTruncation"]
    assert traced.open_spans() == []
    (run_span,) = traced.finished("invoke_agent")
    assert run_span.attributes.get("fsm_agent.stop_reason") == "cancelled"


# --- a request retried with its run_id while the first copy runs -------------------------------------------------


def test_a_request_retried_with_its_run_id_while_the_first_runs_is_refused_by_the_store_and_spans_stay_whole(
    tmp_path: Path,
) -> None:
    """A client times out and retries; the handler runs ``agent.arun(q, run_id=request_id, store=...)`` again.

    The store refuses the second run of an id in flight (``RunExistsError``)
    before anything is called, so the charge is made once and the one run's
    spans are whole (opentelemetry.md: run ids tell runs' spans apart, so the
    runs in flight at once must have different ids, which a store holds to).
    """
    ran: Counter[tuple[str, str]] = Counter()
    wrong: list[tuple[str, Any]] = []
    gates = Gates()
    traced = Traced()
    model = ChargesOnce()
    agent = traced.instrument(Agent(model, charges(ran, gates, wrong)))

    async def handlers() -> None:
        with SqliteStore(tmp_path / "runs.db") as store:
            gates.add("q")
            first = asyncio.create_task(agent.arun("q", run_id="req-1", deps="q", store=store))
            await gates.entered["q"].wait()
            with pytest.raises(RunExistsError):
                await agent.arun("q", run_id="req-1", deps="q", store=store)
            gates.release["q"].set()
            assert (await first).final == "done q"

    asyncio.run(handlers())
    assert ran == Counter({("req-1", "c-q"): 1})
    assert not wrong
    assert traced.open_spans() == []
    assert len(traced.finished("execute_tool")) == 1
    assert len(traced.finished("invoke_agent")) == 1


# --- many Session.aopen requests on one loop, half their handlers cancelled mid-call -------------------------------

REQUESTS = 24
"""Requests at once on one event loop: more than a PostgresStore's ten connections per loop."""


def test_many_session_requests_at_once_with_half_cancelled_mid_call_free_every_session_and_repeat_nothing(
    store_target: str,
) -> None:
    """Each request opens its session (``aopen``) over one shared store and one shared agent; the odd ones' clients
    leave while their charge runs.  Every session's next request is served at once, no charge runs twice, each
    reached only its own request's deps, and the cancelled turn's call is never told to the model as not run."""
    ran: Counter[tuple[str, str]] = Counter()
    wrong: list[tuple[str, Any]] = []
    gates = Gates()
    model = ChargesOnce()
    agent = Agent(model, charges(ran, gates, wrong))

    async def serve() -> tuple[list[Any], list[Any]]:
        store = open_store(store_target)

        async def request(session: str, question: str) -> Any:
            chat = await Session.aopen(agent, store, session, deps=question)
            return await chat.arun(question, request_id=question)

        tasks = {}
        for n in range(REQUESTS):
            gates.add(f"q{n}")
            tasks[n] = asyncio.create_task(request(f"s{n}", f"q{n}"))
        await asyncio.gather(*(gates.entered[f"q{n}"].wait() for n in range(REQUESTS)))
        for n, task in tasks.items():
            if n % 2:
                task.cancel()  # the client left mid-call
            else:
                gates.release[f"q{n}"].set()
        firsts = await asyncio.gather(*tasks.values(), return_exceptions=True)
        for n in range(REQUESTS):
            gates.release[f"q{n}"].set()
            gates.add(f"n{n}", open_=True)
        nexts = await asyncio.gather(*(request(f"s{n}", f"n{n}") for n in range(REQUESTS)), return_exceptions=True)
        return firsts, nexts

    with open_store(store_target) as store:
        firsts, nexts = asyncio.run(serve())
        for n, first in enumerate(firsts):
            if n % 2:
                assert isinstance(first, asyncio.CancelledError), first
                stored = store.load(f"s{n}/1")
                assert (stored["state"], stored["reason"]) == ("Failed", "cancelled")
            else:
                assert getattr(first, "final", first) == f"done q{n}"
        assert [getattr(r, "final", r) for r in nexts] == [f"done n{n}" for n in range(REQUESTS)]
        for n in range(REQUESTS):
            assert [run.run_id for run in store.list_runs(session=f"s{n}")] in (
                [f"s{n}/2", f"s{n}/1"],
                [f"s{n}/1", f"s{n}/2"],
            )
    assert not wrong
    assert set(ran.values()) == {1}
    assert len(ran) == 2 * REQUESTS
    # The cut turn's question got one model call; every other question two (ask, then answer after the charge).
    assert model.calls == Counter({f"q{n}": 1 if n % 2 else 2 for n in range(REQUESTS)}) + Counter(
        {f"n{n}": 2 for n in range(REQUESTS)}
    )


# --- AG-UI over real HTTP, traced, one client leaving mid-call ------------------------------------------------------

CLIENTS = 6


@pytest.mark.slow
def test_traced_ag_ui_turns_of_concurrent_clients_end_every_span_and_a_client_leaving_mid_call_frees_its_thread(
    tmp_path: Any,
) -> None:
    """Six browsers at once, each agent instrumented in ``agent_factory``; tab 0 closes while its charge runs.

    Every run span ends (the left turn's with ``cancelled``), every
    ``execute_tool`` span ends once, each charge ran once with its own
    request's deps, and every thread's next message is served at once.
    """
    ran: Counter[tuple[str, str]] = Counter()
    wrong: list[tuple[str, Any]] = []
    gates = Gates(threads=True)
    for n in range(CLIENTS):
        gates.add(f"q{n}", open_=n != 0)
        gates.add(f"n{n}", open_=True)
    registry = charges(ran, gates, wrong)
    traced = Traced()
    model = ChargesOnce()

    def make_agent(_: Any) -> Agent:
        return traced.instrument(Agent(model, registry))

    def user_text(body: Any) -> str:
        return str(body.messages[-1].content)

    store = open_store(str(tmp_path / "threads.db"))
    server = Served(app(make_agent, store=store, deps_factory=user_text))
    left = threading.Event()

    def leaving() -> None:
        import httpx

        with httpx.Client(timeout=60) as http, http.stream("POST", server.url, json=run_input("tab-0", "x", "q0")) as r:
            for line in r.iter_lines():
                if '"TOOL_CALL_END"' in line:
                    break
            assert gates.entered["q0"].wait(WAIT)
        left.set()

    try:
        ends = at_once(
            leaving,
            *[lambda n=n: stream(server.url, run_input(f"tab-{n}", "x", f"q{n}")) for n in range(1, CLIENTS)],
        )
        assert left.is_set()
        assert held_within(lambda: store.load("tab-0/1")["state"] == "Failed", WAIT)
        gates.release["q0"].set()  # the cut sync charge goes on in its worker thread and returns
        nexts = at_once(
            *[lambda n=n: stream(server.url, run_input(f"tab-{n}", "x", f"n{n}", run_id="r2")) for n in range(CLIENTS)]
        )
        assert held_within(lambda: not traced.open_spans(), WAIT)
    finally:
        for n in range(CLIENTS):
            gates.release[f"q{n}"].set()
        server.close()
    assert ends[0] is None
    for events in ends[1:]:
        assert ending(events) == "RUN_FINISHED success", events[-1]
    for n, events in enumerate(nexts):
        assert (ending(events), events[-1]["result"]) == ("RUN_FINISHED success", f"done n{n}")
    stored = store.load("tab-0/1")
    assert (stored["reason"], stored["evidence"]["unfinished"]) == ("cancelled", "c-q0")
    assert not wrong
    assert ran == Counter({(f"tab-{n}/{t}", f"c-{q}{n}"): 1 for n in range(CLIENTS) for t, q in ((1, "q"), (2, "n"))})
    runs = traced.finished("invoke_agent")
    assert len(runs) == 2 * CLIENTS
    reasons = Counter(span.attributes["fsm_agent.stop_reason"] for span in runs)
    assert reasons == Counter({"done": 2 * CLIENTS - 1, "cancelled": 1})
    tools = traced.finished("execute_tool")
    assert Counter(span.attributes["gen_ai.tool.call.id"] for span in tools) == Counter(
        {f"c-{q}{n}": 1 for n in range(CLIENTS) for q in "qn"}
    )
