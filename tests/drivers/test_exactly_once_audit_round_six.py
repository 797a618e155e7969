"""Exactly once and nothing lost, round six: typed answers, compaction, guardrails and finalize calls, cut and resumed.

Each run is cut where it can be (a Ctrl-C inside a validator, a model call
or ``compact``; a task cancel; the run's deadline; a process that dies),
then finished by a new owner from the store, on both drivers and both
stores.  Every side effect is counted (``support.once_round_six``): each
model call by the turn it answers, each tool execution by call id, each
validator call, each compaction, each guardrail check; and the tokens in
the result are those the scripted model reported for the replies kept.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.exactly_once import LEASE, cut_by_interrupt, resumed_by_new_owner
from support.once_round_six import (
    ACCEPTED,
    ANSWER_USAGE,
    BATCH_USAGE,
    REJECTED,
    REJECTED_USAGE,
    Cuts,
    FinalizeModel,
    Ledger,
    Point,
    Tally,
    compacting_agent,
    die_in_the_call_after_compacting,
    finalize_agent,
    leaks,
    ledger_compacting_agent,
    texts_of,
    tokens_of,
    typed_agent,
    usage_of,
)
from support.store_cases import in_child

from fsm_agent import AgentLoopError, Message, RunResult
from fsm_agent.persist import open_store
from fsm_agent.testing import edges

# (the driver that is cut, the driver of the new owner): each driver cut, each driver resuming
CROSSED = [("sync", "async"), ("async", "sync")]
WAIT = 60.0
"""A bound on waits for something that happens within a second (an event set by a call)."""


# --- typed answers ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "cuts"),
    [
        ("the rejected answer's check", {"validator": -1}),
        ("the retry model call", {"model": 2}),
        ("the accepted answer's check", {"validator": 5}),
    ],
    ids=["rejected_check", "retry_call", "accepted_check"],
)
@pytest.mark.parametrize(("cutter", "resumer"), CROSSED)
def test_a_typed_answer_cut_by_ctrl_c_is_finished_by_a_new_owner_each_call_once_and_every_answer_kept(
    store_target: str, cutter: str, resumer: str, where: str, cuts: dict[str, Any]
) -> None:
    """A batch (a, b), a rejected answer, the retry: cut at ``where``, a new owner makes only what was cut again."""
    tally = Tally()
    cut_by_interrupt(store_target, "r", cutter, typed_agent(tally, Cuts(**cuts)))
    result = resumed_by_new_owner(store_target, "r", resumer, typed_agent(tally, Cuts()))
    assert (result.reason, result.output) == ("done", Point(5))
    assert tally.tools == {"a": 1, "b": 1}
    # the model call of each turn once, the cut one (the retry) twice
    assert tally.model == ([0, 1, 2, 2] if "model" in cuts else [0, 1, 2])
    # each answer's check once; the check cut by the Ctrl-C is made again
    cut_value = cuts.get("validator")
    assert dict(tally.validated) == {x: 2 if x == cut_value else 1 for x in (-1, 5)}
    # nothing dropped: the batch's results, the rejected answer, the message sending it back, the answer
    assert texts_of(result, "tool") == ['"a ok"', '"b ok"']
    assert texts_of(result, "assistant")[1:] == [REJECTED, ACCEPTED]
    assert texts_of(result, "user")[1].startswith("Your final answer was not accepted:\n- x must be positive")
    assert [step.kind for step in result.steps].count("output_invalid") == 1
    assert edges(result).count("Dispatch->AwaitModel[output_invalid]") == 1
    assert tokens_of(result) == usage_of(BATCH_USAGE, REJECTED_USAGE, ANSWER_USAGE)


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_retry_call_cut_at_the_deadline_is_made_once_more_by_a_new_owner_and_the_rejected_answer_not_checked_again(
    store_target: str, driver: str
) -> None:
    """The deadline cuts the retry model call (it hangs until the run returned); the stop is written with the
    retry edge, so a new owner with more time makes that call again and checks only the new answer."""
    tally = Tally()
    release = threading.Event()
    agent = typed_agent(tally, Cuts(), timeout=2.0)  # only the cut call outlasts it: it waits for the test
    real = agent.model.complete

    def hangs_on_the_retry(messages: Any, tools: Any, output: Any = None) -> Any:
        if sum(1 for m in messages if m.role == "assistant") == 2 and not release.is_set():
            with tally.lock:
                tally.model.append(2)
            assert release.wait(WAIT), "the test never released the abandoned call"
            raise ConnectionError("abandoned: its outcome is not taken in")
        return real(messages, tools, output)

    agent.model.complete = hangs_on_the_retry  # type: ignore[method-assign]
    store = open_store(store_target, lease=LEASE)
    try:
        if driver == "sync":
            stopped = _stopped(lambda: agent.run("q", store=store, run_id="r"))
        else:
            stopped = _stopped(lambda: asyncio.run(agent.arun("q", store=store, run_id="r")))
    finally:
        release.set()
        store.close()
    assert (stopped.reason, stopped.evidence["unfinished"]) == ("timeout", "model call of turn 3")
    assert texts_of(stopped, "assistant")[1:] == [REJECTED]
    result = resumed_by_new_owner(store_target, "r", "sync", typed_agent(tally, Cuts()), timeout=600)
    assert (result.reason, result.output) == ("done", Point(5))
    assert tally.tools == {"a": 1, "b": 1}
    assert tally.model == [0, 1, 2, 2]
    assert dict(tally.validated) == {-1: 1, 5: 1}
    assert texts_of(result, "assistant")[1:] == [REJECTED, ACCEPTED]
    assert tokens_of(result) == usage_of(BATCH_USAGE, REJECTED_USAGE, ANSWER_USAGE)


def _stopped(go: Any) -> RunResult:
    try:
        result: RunResult = go()
    except AgentLoopError as stop:
        return stop.result
    return result


# --- guardrails -------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("cutter", "resumer"), CROSSED)
def test_an_answer_guardrail_cut_by_ctrl_c_trips_for_the_new_owner_with_no_call_made_again(
    store_target: str, cutter: str, resumer: str
) -> None:
    """Ctrl-C inside the answer guardrail's check of the accepted typed answer: the reply was written as it came
    back, so the new owner checks it again, trips, and makes no model or tool call; the answer and the rejected
    one are kept."""
    tally = Tally()
    cuts = Cuts(guardrail=ACCEPTED)
    cut_by_interrupt(store_target, "r", cutter, typed_agent(tally, cuts, stop_conditions=[leaks(tally, cuts)]))
    owner = typed_agent(tally, Cuts(), stop_conditions=[leaks(tally, Cuts())])
    result = resumed_by_new_owner(store_target, "r", resumer, owner)
    assert (result.reason, result.final) == ("leaked", ACCEPTED)
    assert edges(result)[-1] == "Dispatch->Failed[leaked]"
    assert tally.model == [0, 1, 2]
    assert tally.tools == {"a": 1, "b": 1}
    assert tally.guarded == [ACCEPTED, ACCEPTED]  # the cut check, and the new owner's
    assert texts_of(result, "assistant")[1:] == [REJECTED, ACCEPTED]
    assert tokens_of(result) == usage_of(BATCH_USAGE, REJECTED_USAGE, ANSWER_USAGE)
    with open_store(store_target) as store:
        stored = store.load("r")
        assert (stored["state"], stored["reason"]) == ("Failed", "leaked")
        with pytest.raises(ValueError, match="leaked"):
            owner.resume(stored, store=store)
    assert tally.model == [0, 1, 2]


# --- finalize ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("cutter", "resumer"), CROSSED)
def test_a_finalize_call_cut_by_ctrl_c_after_a_batch_is_made_once_more_by_a_new_owner_and_counted_once(
    store_target: str, cutter: str, resumer: str
) -> None:
    tally = Tally()
    cut_by_interrupt(store_target, "r", cutter, finalize_agent(tally, Cuts(model=1)))
    result = resumed_by_new_owner(store_target, "r", resumer, finalize_agent(tally, Cuts()))
    assert (result.reason, result.evidence["finalize"]) == ("max_steps", {"outcome": "answered"})
    assert result.final == "final from a and b"
    assert tally.tools == {"a": 1, "b": 1}
    assert tally.model == [0, 1, 1]  # the finalize call, cut, then made once more
    assert texts_of(result, "tool") == ['"a ok"', '"b ok"']
    assert edges(result).count("ExecuteTool->AwaitModel[finalize_on_max_steps]") == 1
    assert tokens_of(result) == usage_of(BATCH_USAGE, ANSWER_USAGE)


def test_a_task_cancelled_in_a_finalize_call_keeps_its_stop_and_a_resume_with_room_runs_no_tool_again(
    store_target: str,
) -> None:
    """The finalize call of a stored run is cut by a task cancel: stored stopped on max_steps (the stop it answered),
    counting the cut call as a turn; a resume with room asks the model once and runs neither tool again."""
    tally = Tally()

    async def cut() -> None:
        hold = asyncio.Event()  # never set: the finalize call hangs until the cancel
        model = FinalizeModel(tally, Cuts(), hold)
        model.started = asyncio.Event()
        with open_store(store_target) as store:
            task = asyncio.ensure_future(finalize_agent(tally, Cuts(), model).arun("q", store=store, run_id="r"))
            await asyncio.wait_for(model.started.wait(), WAIT)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(cut())
    with open_store(store_target) as store:
        stored = store.load("r")
        assert (stored["state"], stored["reason"]) == ("Failed", "max_steps")
        result = finalize_agent(tally, Cuts()).resume(stored, store=store, max_steps=3).finish()
    assert result.final == "final from a and b"
    assert tally.tools == {"a": 1, "b": 1}
    assert tally.model == [0, 1]  # the cut finalize call (counted on entry), then the resumed run's one call
    assert texts_of(result, "tool") == ['"a ok"', '"b ok"']
    assert tokens_of(result) == usage_of(BATCH_USAGE, ANSWER_USAGE)


@pytest.mark.slow
@pytest.mark.parametrize(
    "way",
    [
        "sync_finish",
        "sync_advance",
        "async",
    ],
)
def test_a_finalize_call_for_max_steps_is_not_cut_by_the_runs_deadline_on_any_driver(way: str) -> None:
    """decisions.md: "a finalize call made for another stop ... is not bounded by the deadline it answers".

    The finalize call (for ``max_steps``) outlasts the run's 0.5 s deadline:
    it returns once the deadline is well past (a bounded wait, 6 times the
    deadline).  On every way of driving the finalize answer is taken, the
    reason ``max_steps``: the sync ``finish()``, which waits for its worker
    until the deadline it started with, waits on for a finalize call in flight.
    """
    tally = Tally()
    release = threading.Event()
    model = FinalizeModel(tally, Cuts())
    plain = model.complete

    def slow_finalize(messages: Any, tools: Any) -> Any:
        if not tools:
            release.wait(3.0)  # the deadline (0.5 s) passes meanwhile
        return plain(messages, tools)

    model.complete = slow_finalize  # type: ignore[method-assign]
    agent = finalize_agent(tally, Cuts(), model, timeout=0.5)
    try:
        if way == "sync_finish":
            result = _stopped(lambda: agent.run("q"))
        elif way == "sync_advance":
            run = agent.start("q")
            while not run.done:
                run.advance()
            result = _stopped(run.finish)
        else:
            result = _stopped(lambda: asyncio.run(agent.arun("q")))
    finally:
        release.set()
    assert (result.reason, result.evidence["finalize"]) == ("max_steps", {"outcome": "answered"})
    assert result.final == "final from a and b"
    assert tally.model == [0, 1]


# --- compaction -------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("cutter", "resumer"), CROSSED)
def test_a_ctrl_c_in_the_call_made_after_a_compaction_keeps_the_compaction_for_the_new_owner(
    store_target: str, cutter: str, resumer: str
) -> None:
    """The Ctrl-C in the compacted call writes the run with its compaction: the new owner does not compact again,
    and makes only the cut call again."""
    tally = Tally()
    cut_by_interrupt(store_target, "r", cutter, compacting_agent(tally, Cuts(model="compacted")))
    assert tally.compacted == [4]
    result = resumed_by_new_owner(store_target, "r", resumer, compacting_agent(tally, Cuts()))
    assert result.final == "end"
    assert tally.compacted == [4]
    assert tally.tools == {"step1": 1}
    # step1's call, the overflow, the compacted call (the answer) cut, then made again
    assert tally.model == [2, 4, 1, 1]
    assert [m.content for m in result.messages] == ["SYS", "q", "", '"step1 ok"', "end"]
    assert [step.kind for step in result.steps] == ["tool_call", "compaction", "final"]
    assert tokens_of(result) == usage_of(BATCH_USAGE, ANSWER_USAGE)


@pytest.mark.slow
def test_a_task_cancelled_while_compacting_leaves_the_compaction_to_the_next_owner_and_no_call_is_made_twice(
    store_target: str,
) -> None:
    """A task cancel inside an async ``compact`` (docs: "a cancel while compacting leaves the compaction due"):
    the overflowed call is not made again, the compaction is (it was cut), then the compacted call once."""
    tally = Tally()
    started = threading.Event()

    async def hanging(messages: list[Message]) -> list[Message]:
        with tally.lock:
            tally.compacted.append(len(messages))
        started.set()
        await asyncio.Event().wait()
        raise AssertionError

    async def cut() -> None:
        with open_store(store_target, lease=LEASE) as store:
            agent = compacting_agent(tally, Cuts(), compact=hanging)
            task = asyncio.ensure_future(agent.arun("q", store=store, run_id="r"))
            while not started.is_set():
                await asyncio.sleep(0)  # the run's own steps: no timing
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(cut())
    result = resumed_by_new_owner(store_target, "r", "sync", compacting_agent(tally, Cuts()))
    assert result.final == "end"
    assert tally.compacted == [4, 4]
    assert tally.tools == {"step1": 1}
    assert tally.model == [2, 4, 1]
    assert [step.kind for step in result.steps] == ["tool_call", "compaction", "final"]
    assert edges(result).count("AwaitModel->AwaitModel[compacts_history]") == 1


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_compaction_still_running_at_the_deadline_is_given_up_and_the_run_stops_on_timeout(driver: str) -> None:
    """long-runs.md: "A compaction is a model turn like any other"; a call in flight at the deadline is abandoned
    (decisions.md), and the typed answer's check, user code too, is cut at it (typed-answers.md).  A compaction
    that hangs (here for 6 s) is given up at the run's 0.5 s timeout, as the check is."""
    tally = Tally()
    release = threading.Event()

    def hangs(messages: list[Message]) -> list[Message]:
        with tally.lock:
            tally.compacted.append(len(messages))
        release.wait(6.0)
        return [Message("user", "summary")]

    agent = compacting_agent(tally, Cuts(), compact=hangs, timeout=0.5)
    started = time.monotonic()
    try:
        result = _stopped(lambda: agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q")))
    finally:
        release.set()
    took = time.monotonic() - started
    assert result.reason == "timeout"
    assert took < 5.0, f"the run stopped {took:.1f} s after it started, its timeout 0.5 s"


@pytest.mark.slow
@pytest.mark.parametrize("every", ["call", "transition"])
@pytest.mark.parametrize(("cutter", "resumer"), CROSSED)
def test_a_process_dying_in_the_call_after_a_compaction_does_not_compact_again_on_resume(
    store_target: str, tmp_path: Path, cutter: str, resumer: str, every: str
) -> None:
    """exactly-once.md: with every="call" or "transition" a crash repeats at most the call in flight (here the
    compacted model call).  The compaction before it (a summary another model writes, as long-runs.md suggests) had
    completed: it is written before that call, so the new owner does not compact again."""
    folder = str(tmp_path)
    code = in_child(die_in_the_call_after_compacting, store_target, folder, cutter, every, LEASE)
    assert code == 9
    ledger = Ledger(folder)
    assert ledger.lines() == ["model 2", "tool step1", "model 4", "compact 4", "model 1"]
    result = resumed_by_new_owner(store_target, "long", resumer, ledger_compacting_agent(folder, die=False))
    assert result.final == "end"
    lines = ledger.lines()
    assert lines.count("tool step1") == 1
    assert lines.count("compact 4") == 1, lines
    assert lines[5:] == ["model 1"]  # the compacted call, cut by the crash, made again: it answers
