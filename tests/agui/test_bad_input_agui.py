"""A client's malformed AG-UI request is refused saying why, before any call runs; no answer is dropped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient
from support.agui_apps import Scenarios, outline, post, run_input, scenario_app

from fsm_agent.agui import AgUiApp


@pytest.fixture
def served() -> tuple[AgUiApp, Scenarios]:
    return scenario_app()


@pytest.fixture
def client(served: tuple[AgUiApp, Scenarios]) -> Iterator[TestClient]:
    with TestClient(served[0]) as test_client:
        yield test_client


def test_two_different_answers_to_one_interrupt_are_refused_and_the_call_never_runs(
    served: tuple[AgUiApp, Scenarios], client: TestClient
) -> None:
    """``resume`` answers s1 with a rejection, then with an approval: RUN_ERROR naming s1; the call stays undecided.

    The command line refuses the same thing (``two different decisions on``);
    keeping the last answer runs a call the person also rejected.
    """
    _, scenarios = served
    post(client, run_input("t-twice", "approve"))
    answers = [
        {"interruptId": "s1", "status": "resolved", "payload": {"approved": False, "reason": "not to ada"}},
        {"interruptId": "s1", "status": "resolved", "payload": True},
    ]
    events = post(client, run_input("t-twice", "approve", run_id="r2", resume=answers))
    assert events[-1]["type"] == "RUN_ERROR"
    assert "s1" in events[-1]["message"]
    assert scenarios.executed.get("send", 0) == 0


def test_the_same_answer_given_twice_is_taken_once(served: tuple[AgUiApp, Scenarios], client: TestClient) -> None:
    """A client that repeats one answer (a retried submit) resumes as with one: the call runs once."""
    _, scenarios = served
    post(client, run_input("t-again", "approve"))
    answer = {"interruptId": "s1", "status": "resolved", "payload": {"approved": True}}
    events = post(client, run_input("t-again", "approve", run_id="r2", resume=[answer, answer]))
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["result"] == "Sent."
    assert scenarios.executed["send"] == 1


def test_an_answer_to_an_interrupt_the_turn_does_not_have_is_refused_and_nothing_runs(
    served: tuple[AgUiApp, Scenarios], client: TestClient
) -> None:
    """An answer to ``zz`` beside the approval of s1: RUN_ERROR naming zz; s1 is not half-applied, and runs later."""
    _, scenarios = served
    post(client, run_input("t-unknown", "approve"))
    answers = [
        {"interruptId": "s1", "status": "resolved", "payload": True},
        {"interruptId": "zz", "status": "resolved", "payload": True},
    ]
    events = post(client, run_input("t-unknown", "approve", run_id="r2", resume=answers))
    assert outline(events) == ["RUN_STARTED", "RUN_ERROR"]
    assert "'zz'" in events[-1]["message"]
    assert scenarios.executed.get("send", 0) == 0
    approve = [{"interruptId": "s1", "status": "resolved", "payload": True}]
    assert post(client, run_input("t-unknown", "approve", run_id="r3", resume=approve))[-1]["result"] == "Sent."
    assert scenarios.executed["send"] == 1


def test_a_resume_on_a_thread_with_no_paused_turn_says_so(
    served: tuple[AgUiApp, Scenarios], client: TestClient
) -> None:
    """``resume`` on a new thread: RUN_ERROR saying the thread has no paused turn, not a store's internal key."""
    events = post(
        client, run_input("t-new", "tool", resume=[{"interruptId": "s1", "status": "resolved", "payload": True}])
    )
    assert outline(events) == ["RUN_STARTED", "RUN_ERROR"]
    message = events[-1]["message"]
    assert "t-new/0" not in message
    assert "paused" in message
    assert served[1].executed == {}
