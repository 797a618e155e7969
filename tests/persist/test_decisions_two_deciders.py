"""Two people deciding one paused call: exactly one decision stands, the other is told which; bad input stores nothing.

Every test runs on a SQLite file and a PostgreSQL database, with two store
objects on one database (as two web workers would have), or two processes.
Side effects are counted per call id, so a call that ran twice shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Any

import pytest
from support.shared_runs import SECRET, Effects, office
from support.store_cases import CHILDREN, child_process

from fsm_agent import DecisionError, RunLeasedError
from fsm_agent.persist import open_store

RUN = "job"


def _paused(store: Any) -> dict[str, Any]:
    """The office run paused before its two held calls (``read``, ``mail``); as the store has it."""
    agent, _ = office(Effects())
    assert agent.run("tidy up", store=store, run_id=RUN).reason == "paused"
    return store.load(RUN)


def _race(*work: Any) -> list[tuple[str, Any]]:
    """Run each ``work()`` in its own thread, released together; ``("ok", value)`` or ``("error", exc)`` for each."""
    start = threading.Barrier(len(work))
    outcomes: list[tuple[str, Any]] = [("none", None)] * len(work)

    def one(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = ("ok", work[i]())
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcomes[i] = ("error", exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


# --- two people, one call --------------------------------------------------------------------------------------


@pytest.mark.parametrize("trial", range(6))
def test_two_store_objects_deciding_one_call_differently_at_once_keep_exactly_one(
    store_target: str, trial: int
) -> None:
    """Approve and reject ``mail`` at the same moment from two store objects: one wins, the loser is told which."""
    with open_store(store_target) as first, open_store(store_target) as second:
        before = _paused(first)
        outcomes = _race(lambda: first.decide(RUN, "mail", True), lambda: second.decide(RUN, "mail", "not today"))
        kinds = sorted(kind for kind, _ in outcomes)
        assert kinds == ["error", "ok"], outcomes
        won = 0 if outcomes[0][0] == "ok" else 1
        lost = outcomes[1 - won][1]
        winner: bool | str = True if won == 0 else "not today"
        assert isinstance(lost, DecisionError), lost
        assert (lost.run_id, lost.call_id) == (RUN, "mail")
        assert ("already decided (approved)" if winner is True else "already decided (rejected: not today)") in str(
            lost
        )
        stored = first.load(RUN)
        assert stored["approvals"] == {"mail": winner}
        assert stored["stored_seq"] == before["stored_seq"] + 1, "the losing decision wrote something"
        # Whoever resumes it: the mail goes out once if approved, never if rejected.
        first.decide(RUN, "read", False)
        effects = Effects()
        plain, model = office(effects, approve=False)
        assert plain.resume(first.load(RUN), store=first).finish().reason == "done"
        assert effects == ({"mail": 1} if winner is True else {})
        assert SECRET not in model.shown


def _decide_in_process(target: str, decision: bool | str, start: Any, answers: Any) -> None:
    """Another process: open its own store, wait for the other decider, decide ``mail``; report what happened."""
    with contextlib.closing(open_store(target)) as store:
        start.wait()
        try:
            store.decide(RUN, "mail", decision)
        except DecisionError as exc:
            answers.put(("refused", json.dumps(decision), str(exc)))
        else:
            answers.put(("taken", json.dumps(decision), ""))


@pytest.mark.subprocess
def test_two_processes_deciding_one_call_differently_at_once_keep_exactly_one(store_target: str) -> None:
    """Two processes decide ``mail`` (approve, reject) released by one barrier: one is taken, the other refused."""
    with open_store(store_target) as store:
        _paused(store)
    start, answers = CHILDREN.Barrier(2), CHILDREN.Queue()
    workers = [
        child_process(_decide_in_process, store_target, decision, start, answers) for decision in (True, "no mail")
    ]
    for worker in workers:
        worker.start()
    got = [answers.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    assert sorted(kind for kind, _, _ in got) == ["refused", "taken"], got
    taken = json.loads(next(decision for kind, decision, _ in got if kind == "taken"))
    refusal = next(text for kind, _, text in got if kind == "refused")
    assert "already decided" in refusal
    with open_store(store_target) as store:
        assert store.load(RUN)["approvals"] == {"mail": taken}


@pytest.mark.parametrize("decision", [True, False, "not the secrets"])
def test_a_decision_repeated_with_the_same_value_is_taken_as_given(store_target: str, decision: bool | str) -> None:
    """docs/concepts/exactly-once.md: "A decision repeated with the same value is taken as given, so a retried request
    goes on."  A retried request (a double click, an HTTP retry) must not be told its own decision was refused."""
    with open_store(store_target) as first, open_store(store_target) as second:
        _paused(first)
        decided = first.decide(RUN, "read", decision)
        again = second.decide(RUN, "read", decision)
        assert again["approvals"] == decided["approvals"] == {"read": decision}
        assert second.load(RUN)["approvals"] == {"read": decision}


def test_an_awaited_decision_repeated_with_the_same_value_is_taken_as_given(store_target: str) -> None:
    """The async twin keeps the same promise as ``decide``: a retried decision goes on."""

    async def twice() -> dict[str, Any]:
        async with open_store(store_target) as store:
            await store.adecide(RUN, "mail", True)
            return await store.adecide(RUN, "mail", True)

    with open_store(store_target) as store:
        _paused(store)
    assert asyncio.run(twice())["approvals"] == {"mail": True}


def test_the_same_decision_from_two_people_at_once_keeps_it_once_and_the_call_runs_once(store_target: str) -> None:
    """Both approve ``mail`` at once: whatever the second is told, the stored decision is the one given, run once."""
    with open_store(store_target) as first, open_store(store_target) as second:
        _paused(first)
        outcomes = _race(lambda: first.decide(RUN, "mail", True), lambda: second.decide(RUN, "mail", True))
        assert [kind for kind, _ in outcomes].count("ok") >= 1, outcomes
        for kind, value in outcomes:
            assert kind == "ok" or isinstance(value, DecisionError), value
        assert first.load(RUN)["approvals"] == {"mail": True}
        first.decide(RUN, "read", "no")
        effects = Effects()
        plain, _ = office(effects, approve=False)
        assert plain.resume(first.load(RUN), store=first).finish().reason == "done"
        assert effects == {"mail": 1}


# --- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decision", [1, 0, None, 1.5, ["yes"], {"approved": True}, b"no"])
def test_a_decision_that_is_not_true_false_or_text_is_a_type_error_and_nothing_is_stored(
    store_target: str, decision: Any
) -> None:
    """``decide`` and ``adecide`` name the bad value; the stored run, its version included, is as it was."""
    with open_store(store_target) as store:
        before = _paused(store)
        with pytest.raises(TypeError, match="a decision is True, False or a reason text"):
            store.decide(RUN, "mail", decision)

        async def awaited() -> None:
            async with open_store(store_target) as other:
                await other.adecide(RUN, "mail", decision)

        with pytest.raises(TypeError, match="a decision is True, False or a reason text"):
            asyncio.run(awaited())
        assert store.load(RUN) == before


@pytest.mark.parametrize("call_id", ["nope", "", "READ", "read ", 5, None])
def test_a_call_id_the_run_does_not_hold_is_refused_naming_the_pending_calls(store_target: str, call_id: Any) -> None:
    """An unknown (or non-text) call id: a DecisionError listing what is pending; the stored run is unchanged."""
    with open_store(store_target) as store:
        before = _paused(store)
        with pytest.raises(DecisionError, match=r"not a pending call of the run \(pending: read, mail\)"):
            store.decide(RUN, call_id, True)
        assert store.load(RUN) == before


@pytest.mark.parametrize("where", ["leased", "missing"])
def test_a_bad_decision_value_is_named_whatever_the_run_s_state(store_target: str, where: str) -> None:
    """``decide(run, call, 1)`` is bad input wherever the run stands: a TypeError naming the value, not a
    RunLeasedError (a person would wait and retry, to be refused again) nor a KeyError."""
    with open_store(store_target) as store:
        _paused(store)
        run_id = RUN
        if where == "leased":
            store.claim(RUN, store.load(RUN), owner="someone-else")
        else:
            run_id = "no-such-run"
        with pytest.raises(TypeError, match="a decision is True, False or a reason text"):
            store.decide(run_id, "mail", 1)  # type: ignore[arg-type]


def test_a_decision_on_a_run_another_owner_holds_is_refused_naming_the_holder_and_nothing_is_stored(
    store_target: str,
) -> None:
    """A run claimed by another owner: RunLeasedError naming it; once given up, the same decision is taken."""
    with open_store(store_target) as store, open_store(store_target) as other:
        _paused(store)
        seq = other.claim(RUN, store.load(RUN), owner="host:1:other")
        before = store.load(RUN)
        with pytest.raises(RunLeasedError) as held:
            store.decide(RUN, "mail", True)
        assert held.value.holder == "host:1:other"
        assert store.load(RUN) == before
        other.renew(RUN, owner="host:1:other", seq=seq, release=True)
        assert store.decide(RUN, "mail", True)["approvals"] == {"mail": True}


# --- what the model is told --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "why",
    [
        "line one\nline two\ttabbed",
        'quotes " and {"json": "looking"} braces',
        "unicode: é 漢字 🚀",
        "half an emoji \ud83d here",
        "a NUL \x00 inside",
        "x" * 20_000,
        "   ",
    ],
)
def test_a_rejection_s_reason_reaches_the_model_whole(store_target: str, why: str) -> None:
    """Whatever the person wrote is the tool message the model reads, character for character; the call never ran."""
    with open_store(store_target) as store:
        _paused(store)
        store.decide(RUN, "read", why)
        store.decide(RUN, "mail", True)
        assert store.load(RUN)["approvals"]["read"] == why
        effects = Effects()
        plain, model = office(effects, approve=False)
        result = plain.resume(store.load(RUN), store=store).finish()
    assert result.reason == "done"
    assert effects == {"mail": 1}
    told = [m.content for m in result.messages if m.role == "tool" and m.tool_call_id == "read"]
    assert told == [json.dumps({"error": f"a person rejected this call to 'read_file': {why}"}, ensure_ascii=False)]
    assert SECRET not in model.shown
