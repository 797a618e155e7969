"""A Session used as a web app's request handlers use it: a new object per request, two requests at once.

Each handler builds its own ``Session`` over the shared store (as two
workers of an app do) and the tools count their executions per call id.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.app_owners import at_once
from support.deadline_cuts import DEADLINE
from support.sends import counted_send

from fsm_agent import Agent, Session
from fsm_agent.errors import RunLeasedError, RunStateError
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

TRIALS = 6
"""Races per store: each on a fresh paused conversation."""


def _conversation(model_of: dict[str, FakeModel], session_id: str) -> FakeModel:
    """The one model of a conversation, shared by every handler serving it: send (held back), then two answers."""
    return model_of.setdefault(
        session_id,
        FakeModel(tool_turn(tool_call("send", id="s1", to="ada")), reply("Handled."), reply("Next answered.")),
    )


def test_two_handlers_deciding_one_paused_turn_differently_at_once_keep_one_decision_and_send_only_if_approved(
    store_target: str,
) -> None:
    """Approve in one request, reject in another, at the same moment: one wins whole, the other is told so."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    registry = counted_send(ran, lock)
    models: dict[str, FakeModel] = {}
    sent = 0
    with open_store(store_target) as store:

        def handler(session_id: str, decision: bool | str) -> Any:
            agent = Agent(_conversation(models, session_id), registry, approve={"send"})
            return Session(agent, store=store, session_id=session_id).resume({"s1": decision})

        for trial in range(TRIALS):
            session_id = f"chat-{trial}"
            paused = Session(
                Agent(_conversation(models, session_id), registry, approve={"send"}), store=store, session_id=session_id
            ).run("mail ada")
            assert paused.reason == "paused"
            yes, no = at_once(lambda s=session_id: handler(s, True), lambda s=session_id: handler(s, "not today"))
            outcomes = [o for o in (yes, no) if not isinstance(o, BaseException)]
            refusals = [o for o in (yes, no) if isinstance(o, BaseException)]
            assert len(outcomes) == 1, (yes, no)
            (refusal,) = refusals
            assert isinstance(refusal, RunLeasedError | RunStateError | ValueError), repr(refusal)
            stored = store.load(f"{session_id}/1")
            (answer,) = [m["content"] for m in stored["messages"] if m.get("tool_call_id") == "s1"]
            assert (stored["state"], outcomes[0].final) == ("Done", "Handled.")
            if isinstance(no, BaseException):
                assert answer == '"sent to ada"'
                sent += 1
            else:
                assert "a person rejected this call to 'send': not today" in answer
            assert ran == Counter({"s1": sent})
            assert len(models[session_id].seen) == 2
            # The next request, on a fresh object, builds on the turn as it was decided.
            following = Session(Agent(models[session_id], registry), store=store, session_id=session_id)
            assert following.run("and now?").final == "Next answered."
            assert [r.run_id for r in store.list_runs(session=session_id)] == [f"{session_id}/2", f"{session_id}/1"]
            assert ran == Counter({"s1": sent})


def test_a_handler_resuming_a_turn_already_resumed_by_another_request_changes_nothing(store_target: str) -> None:
    """The resume request retried after it was served: refused saying nothing waits, the call made once."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    registry = counted_send(ran, lock)
    models: dict[str, FakeModel] = {}
    with open_store(store_target) as store:

        def handler() -> Session:
            agent = Agent(_conversation(models, "chat"), registry, approve={"send"})
            return Session(agent, store=store, session_id="chat")

        assert handler().run("mail ada").reason == "paused"
        assert handler().resume({"s1": True}).final == "Handled."
        retried = handler()
        with pytest.raises(ValueError, match="nothing to resume"):
            retried.resume({"s1": True})
        assert (retried.turns, [m.content for m in retried.messages][-1]) == (1, "Handled.")
        assert ran == Counter({"s1": 1})
        assert [r.run_id for r in store.list_runs(session="chat")] == ["chat/1"]


@pytest.mark.slow  # the run waits for its real deadline (support.deadline_cuts)
@pytest.mark.parametrize("stored", [False, True], ids=["in-memory", "sqlite"])
def test_a_call_cut_in_flight_at_the_timeout_is_not_told_to_the_model_as_not_executed(
    stored: bool, tmp_path: Path
) -> None:
    """conversations.md: the calls a stopped turn never made are answered as not run; this one was made."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    release = threading.Event()  # the send is held in flight until the run has stopped at its deadline
    registry = counted_send(ran, lock, hold=release)
    model = FakeModel(tool_turn(tool_call("send", id="s1", to="ada")), reply("Told you."))
    agent = Agent(model, registry, timeout=DEADLINE, on_stop={"timeout": "return"})
    chat = Session(agent, store=tmp_path / "runs.db" if stored else None, session_id="chat")
    cut = chat.run("mail ada")
    assert (cut.reason, cut.evidence.get("unfinished")) == ("timeout", "s1")
    release.set()
    deadline = time.monotonic() + 10
    while not ran and time.monotonic() < deadline:  # the call goes on in its worker thread, and sends
        time.sleep(0.01)
    assert ran == Counter({"s1": 1})
    (answer,) = [m for m in chat.messages if m.role == "tool" and m.tool_call_id == "s1"]
    assert "not executed" not in answer.content, answer.content


def test_a_rejection_arriving_after_an_approval_was_acted_on_is_told_the_decision_that_stood(store_target: str) -> None:
    """Two tabs, the approving one first: the rejecting person must learn the call was approved and made."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    registry = counted_send(ran, lock)
    models: dict[str, FakeModel] = {}
    with open_store(store_target) as store:

        def handler() -> Session:
            agent = Agent(_conversation(models, "chat"), registry, approve={"send"})
            return Session(agent, store=store, session_id="chat")

        assert handler().run("mail ada").reason == "paused"
        assert handler().resume({"s1": True}).final == "Handled."
        with pytest.raises(ValueError, match="nothing to resume") as refused:
            handler().resume({"s1": "not today"})
        assert ran == Counter({"s1": 1})
        assert "s1" in str(refused.value)
        assert "approved" in str(refused.value)
