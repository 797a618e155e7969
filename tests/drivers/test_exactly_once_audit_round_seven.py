"""Exactly once and nothing lost, round seven: cancel tokens, deadlines and leases met inside user code.

Round six cut typed answers, guardrails, finalize calls and compactions by
a Ctrl-C, a task cancel, a deadline and a process death.  Here the same
counted runs (``support.once_round_six``, ``support.once_round_seven``) are
met by what round six left out: a ``CancelToken`` cancelled from another
thread while a validator, a compaction, a guardrail or a finalize call is
running; a deadline while a store write is in flight (the sync driver's
worker); a validator that outlasts the deadline, then a new owner; a
compaction that outlasts the lease.  Each model call is counted by the turn
it answers, each tool execution by call id, each validator, guardrail and
compaction call, and the tokens in the result are those of the replies kept.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support.exactly_once import LEASE, resumed_by_new_owner
from support.once_round_seven import (
    CancelInside,
    Gate,
    claim_after_the_lease,
    counted_compact,
    drive,
    held_write,
    validated_agent,
)
from support.once_round_six import (
    ACCEPTED,
    ANSWER_USAGE,
    BATCH_USAGE,
    REJECTED,
    REJECTED_USAGE,
    Cuts,
    FinalizeModel,
    Point,
    Tally,
    compacting_agent,
    finalize_agent,
    texts_of,
    tokens_of,
    typed_agent,
    usage_of,
)

from fsm_agent import RunResult, RunView, StopCondition
from fsm_agent.persist import open_store
from fsm_agent.testing import edges

DRIVERS = ["sync", "async"]


# --- a cancel token cancelled while user code runs ---------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_token_cancelled_while_a_validator_rejects_forbids_the_retry_call_with_or_without_a_timeout(
    store_target: str, driver: str
) -> None:
    """decisions.md: a retry "is not made when a before-model stop (cancelled, ...) holds", named in blocked_by.

    The token is cancelled (from another thread) while the validator checks
    the rejected answer.  With a 600 s timeout that never comes into play the
    run stops ``output_invalid``, ``blocked_by: cancelled``, and the retry is
    not made; so does the same run without a timeout (``_checked`` reads the
    cancel flag after every check, deadline or not).
    """
    outcomes = []
    for options in ({"timeout": 600}, {}):
        tally = Tally()
        cancel = CancelInside()
        agent = validated_agent(tally, lambda x, cancel=cancel: cancel.inside() if x < 0 else None, **options)
        with open_store(store_target, lease=LEASE) as store:
            result = drive(agent, driver, store, f"r{len(outcomes)}", cancel=cancel.token)
        outcomes.append((result.reason, result.evidence.get("blocked_by"), tally.model, dict(tally.validated)))
        assert tally.tools == {"a": 1, "b": 1}
        assert texts_of(result, "assistant")[1] == REJECTED  # the rejected answer is kept either way
    assert outcomes[0] == ("output_invalid", "cancelled", [0, 1], {-1: 1})
    assert outcomes[1] == outcomes[0], "the run without a timeout made the retry call after the cancel"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_token_cancelled_while_compacting_stops_the_run_before_the_compacted_call_and_keeps_the_compaction(
    store_target: str, driver: str
) -> None:
    """CancelToken: "a run holding it stops at its next check ... Checks happen before each model call".

    The token is cancelled while ``compact`` runs (a summary another model
    writes, long-runs.md).  As a deadline passing there does, the cancel
    stops the run before the compacted call: ``cancelled``, the compaction
    written, and a new owner makes the compacted call once without
    compacting again.
    """
    tally = Tally()
    cancel = CancelInside()
    agent = compacting_agent(tally, Cuts(), compact=counted_compact(tally, cancel.inside))
    with open_store(store_target, lease=LEASE) as store:
        stopped = drive(agent, driver, store, cancel=cancel.token)
    assert tally.compacted == [4]
    assert tally.model == [2, 4], "a model call was made after the token was cancelled"
    assert stopped.reason == "cancelled"
    result = resumed_by_new_owner(store_target, "r", driver, compacting_agent(tally, Cuts()))
    assert result.final == "end"
    assert tally.compacted == [4]
    assert tally.model == [2, 4, 1]
    assert tally.tools == {"step1": 1}


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_token_cancelled_during_a_finalize_call_keeps_its_answer_and_nothing_is_called_again(
    store_target: str, driver: str
) -> None:
    """The finalize call (for max_steps after a parallel batch) is in flight when the token is cancelled: its answer
    is taken, the reason stays max_steps, and the stored run is ended and let go; nothing is called twice."""
    tally = Tally()
    cancel = CancelInside()
    model = FinalizeModel(tally, Cuts())
    plain = model.complete

    def finalize_meets_the_cancel(messages: Any, tools: Any) -> Any:
        if not tools:
            cancel.inside()
        return plain(messages, tools)

    model.complete = finalize_meets_the_cancel  # type: ignore[method-assign]
    model.acomplete = None  # type: ignore[assignment,method-assign]  # the async driver calls complete on a thread
    with open_store(store_target, lease=LEASE) as store:
        result = drive(finalize_agent(tally, Cuts(), model), driver, store, cancel=cancel.token)
        stored = store.load("r")
    assert cancel.token.cancelled
    assert (result.reason, result.evidence["finalize"]) == ("max_steps", {"outcome": "answered"})
    assert result.final == "final from a and b"
    assert tally.model == [0, 1]
    assert tally.tools == {"a": 1, "b": 1}
    assert texts_of(result, "tool") == ['"a ok"', '"b ok"']
    assert tokens_of(result) == usage_of(BATCH_USAGE, ANSWER_USAGE)
    assert (stored["state"], stored["reason"]) == ("Done", "max_steps")
    assert stored["messages"][-1]["content"] == "final from a and b"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_token_cancelled_during_an_answer_guardrail_lets_its_verdict_stand_with_no_call_after_it(
    store_target: str, driver: str
) -> None:
    """The answer guardrail trips while the token is cancelled inside it: the run stops on the guardrail (no call
    follows an answer), each call once, the answer and the rejected one kept, the run let go."""
    tally = Tally()
    cancel = CancelInside()

    def holds_five(view: RunView) -> bool:
        text = view.last_response.message.content if view.last_response is not None else ""
        tally.guarded.append(text)
        cancel.inside()
        return "5" in text

    guard = StopCondition("leaked", "answer", holds_five, "the answer holds a five", policy="return")
    with open_store(store_target, lease=LEASE) as store:
        result = drive(typed_agent(tally, Cuts(), stop_conditions=[guard]), driver, store, cancel=cancel.token)
    assert (result.reason, result.final) == ("leaked", ACCEPTED)
    assert tally.guarded == [ACCEPTED]
    assert tally.model == [0, 1, 2]
    assert tally.tools == {"a": 1, "b": 1}
    assert texts_of(result, "assistant")[1:] == [REJECTED, ACCEPTED]
    assert tokens_of(result) == usage_of(BATCH_USAGE, REJECTED_USAGE, ANSWER_USAGE)
    with open_store(store_target) as store:
        stored = store.load("r")
    assert (stored["state"], stored["reason"]) == ("Failed", "leaked")


# --- deadlines ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_an_answer_check_cut_at_the_deadline_is_checked_again_by_a_new_owner_without_a_model_call(
    store_target: str, driver: str
) -> None:
    """typed-answers.md: "The answer stays in result.messages, unchecked, and a resume with more time checks it
    again."

    The validator of the accepted answer outlasts the run's 3 s deadline (it
    is held until the new owner has finished; everything before it takes
    milliseconds).  The run stops ``timeout`` on ``Dispatch->Failed[timeout]``,
    its answer unchecked.  The new owner, with more time, checks that answer
    (``Failed->Dispatch[resumes_before_answer]``): no fourth model call, the
    answer kept once and its tokens counted once.
    """
    tally = Tally()
    gate = Gate()
    first = validated_agent(tally, lambda x: gate.hold() if x > 0 and not gate.entered.is_set() else None, timeout=3.0)
    try:
        with open_store(store_target, lease=LEASE) as store:
            stopped = drive(first, driver, store)
        assert (stopped.reason, stopped.evidence["unfinished"]) == ("timeout", "the answer's check")
        assert edges(stopped)[-1] == "Dispatch->Failed[timeout]"
        assert texts_of(stopped, "assistant")[1:] == [REJECTED, ACCEPTED]  # kept, unchecked
        result = resumed_by_new_owner(store_target, "r", driver, validated_agent(tally), timeout=600)
    finally:
        gate.open()
    assert (result.reason, result.output) == ("done", Point(5))
    assert tally.tools == {"a": 1, "b": 1}
    assert dict(tally.validated) == {-1: 1, 5: 2}  # the cut check, then the new owner's
    assert tally.model == [0, 1, 2], "the new owner asked the model again for the answer it holds"
    assert texts_of(result, "assistant")[1:] == [REJECTED, ACCEPTED]
    assert tokens_of(result) == usage_of(BATCH_USAGE, REJECTED_USAGE, ANSWER_USAGE)


@pytest.mark.slow
def test_a_sync_deadline_met_while_a_store_write_is_in_flight_lets_the_write_land_and_repeats_no_call(
    store_target: str,
) -> None:
    """The sync driver with a real 1 s timeout: the write of tool ``a``'s outcome (the worker holds the run while it
    writes) is held until the deadline is well past (3 s, 3 times the deadline).  The deadline does not cut the
    write: it lands, ``b`` is not started (its time is up), the run stops ``timeout`` with nothing unfinished and is
    let go; a new owner runs only ``b`` and the later turns."""
    tally = Tally()
    agent = typed_agent(tally, Cuts(), timeout=1.0)
    with open_store(store_target, lease=LEASE) as store:
        held = held_write(store, lambda: tally.tools["a"] == 1, lambda: threading.Event().wait(3.0))
        stopped = drive(agent, "sync", store)
    assert held.is_set()
    assert (stopped.reason, stopped.evidence.get("unfinished")) == ("timeout", None)
    assert edges(stopped)[-1] == "Dispatch->Failed[timeout]"
    assert tally.tools == {"a": 1}
    with open_store(store_target, lease=LEASE) as store:
        stored = store.load("r")
        assert [m["content"] for m in stored["messages"] if m["role"] == "tool"] == ['"a ok"']  # the held write landed
        # taken at once, no retry: a lease the stopped run kept would raise RunLeasedError here
        result = typed_agent(tally, Cuts()).resume(stored, store=store, timeout=600).finish()
    assert (result.reason, result.output) == ("done", Point(5))
    assert tally.tools == {"a": 1, "b": 1}
    assert tally.model == [0, 1, 2]
    assert dict(tally.validated) == {-1: 1, 5: 1}
    assert texts_of(result, "tool") == ['"a ok"', '"b ok"']
    assert tokens_of(result) == usage_of(BATCH_USAGE, REJECTED_USAGE, ANSWER_USAGE)


# --- leases -------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_compaction_that_outlasts_the_lease_keeps_the_run_from_a_second_owner(store_target: str, driver: str) -> None:
    """exactly-once.md: "while a model or tool call is in flight, by a heartbeat ... So a call may take any time,
    and a dead owner's run is free within one lease"; decisions.md: a compaction "gets what a call gets".

    A compaction (a summary another model writes) runs for three 2 s leases,
    its owner alive.  A second owner tries to take the run each time the
    lease it was refused on has run out.  The heartbeat renews the lease
    while ``compact`` runs, as during a call, so the second owner is refused
    each time and the summary is paid once.
    """
    lease = 2.0
    tally = Tally()
    gate = Gate()
    first = compacting_agent(tally, Cuts(), compact=counted_compact(tally, gate.hold))
    outcome: list[Any] = []

    def owner() -> None:
        with open_store(store_target, lease=lease) as store:
            try:
                outcome.append(drive(first, driver, store))
            except BaseException as exc:  # noqa: BLE001 - the first owner refused its next write: read below
                outcome.append(exc)

    thread = threading.Thread(target=owner)
    thread.start()
    try:
        assert gate.entered.wait(60.0), "the run never compacted"

        def take_over(store: Any) -> RunResult:
            second = compacting_agent(tally, Cuts())
            return second.resume(store.load("r"), store=store).finish()

        taken = claim_after_the_lease(store_target, lease, take_over)
    finally:
        gate.open()
        thread.join(60.0)
    assert taken is None, f"a second owner took the run over from a live owner: {tally.compacted} compactions"
    assert isinstance(outcome[0], RunResult)
    assert outcome[0].final == "end"
    assert tally.compacted == [4]
    assert tally.model == [2, 4, 1]
