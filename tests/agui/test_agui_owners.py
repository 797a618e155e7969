"""Second owners of an AG-UI thread: answers sent twice or at once, a viewer deciding, a client that left and retried.

Each test races real requests against the app served by uvicorn (on
SQLite and PostgreSQL), then counts the side effects of the tools and the
model's calls exactly: an approved call runs once, a rejected one never,
one decision is kept per call, and a turn is stored once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
from support.agui_apps import Scenarios, Served, run_input, scenario_app
from support.app_owners import at_once, decide, ending, results_of, staggered, stream
from support.ui_runs import Viewer

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.agui import AgUiApp, app
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

TRIALS = 8
"""Races per test: each on a thread of its own, so every trial starts from a fresh paused turn."""
APPROVE = [{"interruptId": "s1", "status": "resolved", "payload": {"approved": True}}]
REJECT = [{"interruptId": "s1", "status": "resolved", "payload": {"approved": False, "reason": "not today"}}]


@pytest.fixture
def served(store_target: str) -> Iterator[tuple[AgUiApp, Scenarios, Served, Any]]:
    """The scenario app over ``store_target`` served on loopback, its scenarios, the server and the store."""
    with open_store(store_target) as store:
        asgi, scenarios = scenario_app(store=store)
        server = Served(asgi)
        try:
            yield asgi, scenarios, server, store
        finally:
            scenarios.gate.set()
            server.close()


def _paused(url: str, thread: str) -> None:
    """Thread ``thread``'s first turn, paused on ``send`` (call ``s1``) for a decision."""
    assert ending(stream(url, run_input(thread, "approve"))) == "RUN_FINISHED interrupt"


def _stored_result(store: Any, thread: str) -> tuple[str, str]:
    """Turn 1's state, and the one result of ``s1`` its conversation holds."""
    stored = store.load(f"{thread}/1")
    (result,) = [m["content"] for m in stored["messages"] if m.get("tool_call_id") == "s1"]
    return stored["state"], result


def _answer(url: str, thread: str, run_id: str, answer: list[dict[str, Any]]) -> Any:
    body = run_input(thread, "approve", run_id=run_id, resume=answer)
    return lambda: stream(url, body)


@pytest.mark.slow
def test_the_same_answer_to_an_interrupt_sent_twice_at_once_runs_the_call_once(
    served: tuple[AgUiApp, Scenarios, Served, Any],
) -> None:
    """A retried resume racing its original: one finishes the turn, the other is RUN_ERROR; send ran once a trial."""
    _, scenarios, server, store = served
    for trial in range(TRIALS):
        thread = f"twice-{trial}"
        _paused(server.url, thread)
        first, second = at_once(_answer(server.url, thread, "r2", APPROVE), _answer(server.url, thread, "r2", APPROVE))
        assert sorted([ending(first), ending(second)]) == ["RUN_ERROR", "RUN_FINISHED success"]
        won = first if ending(first) != "RUN_ERROR" else second
        assert (results_of(won), won[-1]["result"]) == ([("s1", '"sent to ada"')], "Sent.")
        assert scenarios.executed["send"] == trial + 1
        assert len(scenarios.models[thread].seen) == 2  # the paused turn's call and the answer after the send
        assert _stored_result(store, thread) == ("Done", '"sent to ada"')
        assert [r.run_id for r in store.list_runs(session=thread)] == [f"{thread}/1"]


@pytest.mark.slow
def test_an_approval_and_a_rejection_sent_at_once_keep_one_decision_and_the_call_runs_only_if_approved(
    served: tuple[AgUiApp, Scenarios, Served, Any],
) -> None:
    """Two people answer one interrupt differently at once: the winner's decision is stored, and it alone acts."""
    _, scenarios, server, store = served
    sent = 0
    for trial in range(TRIALS):
        thread = f"split-{trial}"
        _paused(server.url, thread)
        yes, no = staggered(
            _answer(server.url, thread, "r2", APPROVE), _answer(server.url, thread, "r3", REJECT), trial, TRIALS
        )
        assert sorted([ending(yes), ending(no)]) == ["RUN_ERROR", "RUN_FINISHED success"]
        state, result = _stored_result(store, thread)
        assert state == "Done"
        if ending(yes) == "RUN_ERROR":
            assert "a person rejected this call to 'send': not today" in result
            assert results_of(no) == [("s1", result)]
        else:
            assert results_of(yes) == [("s1", result)] == [("s1", '"sent to ada"')]
            sent += 1
        assert scenarios.executed.get("send", 0) == sent
        assert len(scenarios.models[thread].seen) == 2


@pytest.mark.slow
def test_a_viewer_rejection_racing_an_ag_ui_approval_keeps_one_decision_and_the_call_runs_only_if_approved(
    served: tuple[AgUiApp, Scenarios, Served, Any],
) -> None:
    """The run viewer rejects the paused call while the chat approves it: exactly one of them is taken."""
    _, scenarios, server, store = served
    viewer = Viewer(store, allow_decisions=True)
    sent = 0
    try:
        for trial in range(TRIALS):
            thread = f"viewer-{trial}"
            _paused(server.url, thread)

            def reject(thread: str = thread) -> tuple[int, dict[str, Any]]:
                return decide(viewer.url, f"{thread}/1", {"call_id": "s1", "approve": False, "why": "not today"})

            chat, (status, page) = staggered(_answer(server.url, thread, "r2", APPROVE), reject, trial, TRIALS)
            stored = store.load(f"{thread}/1")
            if status == 200:
                assert ending(chat) == "RUN_ERROR", chat[-1]
                assert (stored["approvals"], stored["paused"]) == ({"s1": "not today"}, True)
                assert len(scenarios.models[thread].seen) == 1
            else:
                assert status == 409, page
                assert ending(chat) == "RUN_FINISHED success"
                assert _stored_result(store, thread) == ("Done", '"sent to ada"')
                sent += 1
            assert scenarios.executed.get("send", 0) == sent
    finally:
        viewer.close()


def test_two_new_turns_of_one_thread_at_once_store_one_turn_and_run_its_tool_once(
    served: tuple[AgUiApp, Scenarios, Served, Any],
) -> None:
    """Two tabs send a message to the same thread while its turn is in its tool: one turn, the other RUN_ERROR."""
    _, scenarios, server, store = served
    first: list[Any] = []
    worker = threading.Thread(target=lambda: first.append(stream(server.url, run_input("busy", "wait"))))
    worker.start()
    try:
        assert scenarios.entered.wait(30)
        second = stream(server.url, run_input("busy", "wait", text="hello?", run_id="r2"))
        assert [e["type"] for e in second] == ["RUN_STARTED", "RUN_ERROR"]
        assert "turn 1 of session 'busy' is still being taken by" in second[-1]["message"]
    finally:
        scenarios.gate.set()
        worker.join(30)
    assert (ending(first[0]), first[0][-1]["result"]) == ("RUN_FINISHED success", "after the wait")
    assert scenarios.executed["wait"] == 1
    assert len(scenarios.models["busy"].seen) == 2
    assert [r.run_id for r in store.list_runs(session="busy")] == ["busy/1"]


def test_a_second_request_refused_while_a_turn_runs_leaves_that_turn_cancellable(
    served: tuple[AgUiApp, Scenarios, Served, Any],
) -> None:
    """``cancel(thread)`` still stops the running turn after another request for the thread was refused."""
    asgi, scenarios, server, _ = served
    first: list[Any] = []
    worker = threading.Thread(target=lambda: first.append(stream(server.url, run_input("stoppable", "wait"))))
    worker.start()
    try:
        assert scenarios.entered.wait(30)
        refused = stream(server.url, run_input("stoppable", "wait", text="hello?", run_id="r2"))
        assert ending(refused) == "RUN_ERROR"
        cancelled = asgi.cancel("stoppable", "the user pressed stop")
    finally:
        scenarios.gate.set()
        worker.join(30)
    assert cancelled is True
    assert ending(first[0]) == "RUN_FINISHED cancelled"


# --- a client that left, and the same request sent again ---------------------------------------------------------


class SendsUntilAnswered:
    """Asks for ``send`` until the conversation holds a result of it, then answers; its second call waits for ``go``.

    A model that reads the history: if a completed send's outcome were lost,
    the next turn would ask for it again and the count would show it.
    """

    def __init__(self) -> None:
        self.calls: list[Sequence[Message]] = []
        self.go = threading.Event()
        self.waiting = threading.Event()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.calls.append(tuple(messages))
        if len(self.calls) == 2:  # the reply after the send: held while the client goes away
            self.waiting.set()
            assert self.go.wait(60)
        if not any(m.role == "tool" for m in messages):
            return tool_turn(tool_call("send", id=f"s{len(self.calls)}", to="ada"))
        return reply(f"sent, call {len(self.calls)}")


def test_a_client_that_left_after_the_send_and_retried_the_same_request_sends_once(store_target: str) -> None:
    """The stream closes while the model answers the send; the same request again is a new turn that sends nothing."""
    model = SendsUntilAnswered()
    sent: list[str] = []
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted)."""
        sent.append(call_id)
        return f"sent to {to}"

    with open_store(store_target) as store:
        server = Served(app(lambda _: Agent(model, registry), store=store))
        try:
            body = run_input("left", "tool")
            with httpx.Client(timeout=60) as http, http.stream("POST", server.url, json=body) as response:
                # Held, so leaving the loop does not close the lines' generator (and with it the stream): the
                # client leaves only as the block ends, once the server is where the test wants it.
                lines = response.iter_lines()
                for line in lines:
                    if '"TOOL_CALL_RESULT"' in line:
                        break
                assert model.waiting.wait(30)
            deadline = time.monotonic() + 30  # the server sees the close and stores the cut (ms when idle)
            while store.load("left/1")["state"] != "Failed" and time.monotonic() < deadline:
                time.sleep(0.02)
            cut = store.load("left/1")
            assert (cut["state"], cut["reason"]) == ("Failed", "cancelled")
            model.go.set()
            again = stream(server.url, body)
        finally:
            model.go.set()
            server.close()
        assert (ending(again), again[-1]["result"]) == ("RUN_FINISHED success", "sent, call 3")
        assert results_of(again) == []
        assert sent == ["s1"]
        assert len(model.calls) == 3
        assert [m.role for m in model.calls[2]] == ["user", "assistant", "tool", "user"]
        assert sorted(r.run_id for r in store.list_runs(session="left")) == ["left/1", "left/2"]


@pytest.mark.parametrize(
    ("viewer_decision", "decided", "sent"),
    [
        ({"approve": True}, {"approved": True}, 1),
        ({"approve": False, "why": "not today"}, {"approved": False, "reason": "not today"}, 0),
    ],
)
def test_a_turn_the_viewer_decided_is_told_again_with_its_decision_and_that_answer_resumes_it(
    served: tuple[AgUiApp, Scenarios, Served, Any], viewer_decision: dict[str, Any], decided: dict[str, Any], sent: int
) -> None:
    """The viewer decided every interrupt of the paused turn; the chat sends its request again, then answers.

    The repeat is the same interrupt, carrying the decision given in its
    metadata (before, no interrupt was left to send and the stream ended
    with no final event); answered with that decision, the turn goes on.
    """
    _, scenarios, server, store = served
    viewer = Viewer(store, allow_decisions=True)
    try:
        _paused(server.url, "decided")
        status, _ = decide(viewer.url, "decided/1", {"call_id": "s1", **viewer_decision})
        again = stream(server.url, run_input("decided", "approve"))
        answer = [{"interruptId": "s1", "status": "resolved", "payload": decided}]
        resumed = stream(server.url, run_input("decided", "approve", run_id="r2", resume=answer))
    finally:
        viewer.close()
    assert status == 200
    assert [e["type"] for e in again] == ["RUN_STARTED", "RUN_FINISHED"]
    (interrupt,) = again[-1]["outcome"]["interrupts"]
    assert (interrupt["id"], interrupt["metadata"]["fsm_agent"]["decided"]) == ("s1", decided)
    assert ending(resumed) == "RUN_FINISHED success", resumed[-1]
    state, result = _stored_result(store, "decided")
    assert state == "Done"
    assert results_of(resumed) == [("s1", result)]
    assert ("sent to ada" in result) == bool(sent)
    assert ("not today" in result) == (not sent)
    assert scenarios.executed.get("send", 0) == sent
    assert len(scenarios.models["decided"].seen) == 2  # the paused turn's call and the answer after s1's outcome


def test_a_new_message_to_a_turn_the_viewer_decided_is_refused_naming_no_call_as_waiting(
    served: tuple[AgUiApp, Scenarios, Served, Any],
) -> None:
    _, scenarios, server, store = served
    viewer = Viewer(store, allow_decisions=True)
    try:
        _paused(server.url, "decided")
        status, _ = decide(viewer.url, "decided/1", {"call_id": "s1", "approve": True})
        refused = stream(server.url, run_input("decided", "approve", "and now?", run_id="r2"))
    finally:
        viewer.close()
    assert status == 200
    assert ending(refused) == "RUN_ERROR"
    assert refused[-1]["message"] == (
        "turn 1 of session 'decided' is paused, its calls decided: resume it (Session.resume) first"
    )
    assert scenarios.executed.get("send", 0) == 0
    assert (store.load("decided/1")["paused"], store.load("decided/1")["approvals"]) == (True, {"s1": True})
