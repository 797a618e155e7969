"""Exactly once when a run stops while calls are in flight: its deadline, a cancel token, a cancelled task; resumed.

Every tool counts its tries and its side effects, and the model its calls
(``support.inflight_stops``), so "no completed call was made again, the cut
one only by the resume, and none lost" is counted exactly, on both drivers,
without a store and with each store taken over by a new owner.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
from support.exactly_once import WAIT, Effects, resumed_by_new_owner
from support.inflight_stops import DEADLINE, Hold, answer, make_agent

from fsm_agent import Agent, AgentLoopError, CancelToken, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import edges, reply
from fsm_agent.tools import JSONSchema

DRIVERS = ["sync", "async"]
ABC = ("a", "b", "c")
ABCD = ("a", "b", "c", "d")


def _resumed(agent: Agent, source: RunResult, driver: str, **options: object) -> RunResult:
    """``agent`` continues ``source`` (no store) on ``driver`` to its end."""
    if driver == "sync":
        return agent.resume(source, **options).finish()  # type: ignore[arg-type]

    async def go() -> RunResult:
        return await (await agent.aresume(source, **options)).afinish()  # type: ignore[arg-type]

    return asyncio.run(go())


def _stopped(run: Callable[[], object]) -> AgentLoopError:
    """The stop ``run()`` raises."""
    with pytest.raises(AgentLoopError) as stop:
        run()
    return stop.value


@pytest.fixture
def released() -> Iterator[list[Hold]]:
    """Holds of sync calls a test leaves in flight, let go (without their side effect) when it ends."""
    holds: list[Hold] = []
    yield holds
    for hold in holds:
        hold.release(complete=False)


# --- the run's deadline passes while a parallel batch is in flight (async driver) ----------------------------


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_deadline_mid_batch_cuts_only_the_call_in_flight_and_a_resume_makes_only_that_call_again(
    resumer: str,
) -> None:
    """a and b finished, c was in flight: the stop names c, keeps a and b, and the resume makes c alone, once."""
    effects = Effects()
    agent = make_agent(effects, ABC, Hold(effects, "c", after=("a", "b")), timeout=DEADLINE)
    stop = _stopped(lambda: asyncio.run(agent.arun("go")))
    assert stop.reason == "timeout"
    assert stop.evidence["unfinished"] == "c"
    assert stop.evidence["also_ran"] == ["a", "b"]
    assert dict(effects.done) == {"a": 1, "b": 1}
    assert effects.parent_model == 1
    result = _resumed(agent, stop.result, resumer, timeout=60)
    assert result.final == answer(ABC)
    assert dict(effects.done) == {"a": 1, "b": 1, "c": 1}
    assert effects.tries == {"a": 1, "b": 1, "c": 2}  # the cut call, cancelled before its effect, made again
    assert effects.parent_model == 2  # the batch's reply was kept: only the answer was asked for


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_stored_run_cut_by_its_deadline_mid_batch_is_finished_by_a_new_owner_each_completed_call_made_once(
    store_target: str, resumer: str
) -> None:
    """The deadline's stop is in the store with a and b's outcomes; a new owner makes only c, once."""
    effects = Effects()
    agent = make_agent(effects, ABC, Hold(effects, "c", after=("a", "b")), timeout=DEADLINE)
    with open_store(store_target) as store:
        stop = _stopped(lambda: asyncio.run(agent.arun("go", store=store, run_id="r")))
        stored = store.load("r")
    assert (stop.reason, stored["reason"], stored["state"]) == ("timeout", "timeout", "Failed")
    assert dict(effects.done) == {"a": 1, "b": 1}
    owner = make_agent(effects, ABC, timeout=DEADLINE)
    result = resumed_by_new_owner(store_target, "r", resumer, owner, timeout=60)
    assert result.final == answer(ABC)
    assert dict(effects.done) == {"a": 1, "b": 1, "c": 1}
    assert effects.tries == {"a": 1, "b": 1, "c": 2}
    assert effects.parent_model == 2


@pytest.mark.slow
def test_the_evidence_of_a_deadline_passing_mid_batch_says_the_time_was_up() -> None:
    """The timeout stop's evidence reads ``elapsed`` against ``timeout``: at the stop, elapsed reached timeout."""
    effects = Effects()
    agent = make_agent(effects, ABC, Hold(effects, "c", after=("a", "b")), timeout=DEADLINE)
    stop = _stopped(lambda: asyncio.run(agent.arun("go")))
    assert stop.reason == "timeout"
    assert stop.evidence["elapsed"] >= DEADLINE
    assert stop.evidence["counters"]["seconds"][0] >= DEADLINE


# --- the run's deadline passes while one sync call is in flight (sync driver) ---------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_deadline_on_a_sync_call_abandons_it_and_a_resume_makes_only_that_call_again(
    resumer: str, released: list[Hold]
) -> None:
    """Sync driver, one call at a time: a ran, c is abandoned at the deadline (it never finishes): c alone again."""
    effects = Effects()
    hold = Hold(effects, "c", after=("a",))
    released.append(hold)
    agent = make_agent(effects, ("a", "c"), hold, tool="swork", timeout=DEADLINE)
    stop = _stopped(lambda: agent.run("go"))
    assert stop.reason == "timeout"
    assert stop.evidence["unfinished"] == "c"
    assert edges(stop.result)[-1] == "ExecuteTool->Failed[timeout]"
    assert dict(effects.done) == {"a": 1}
    result = _resumed(agent, stop.result, resumer, timeout=60)
    assert result.final == answer(("a", "c"))
    assert dict(effects.done) == {"a": 1, "c": 1}
    assert effects.tries == {"a": 1, "c": 2}
    assert effects.parent_model == 2


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_stored_sync_run_cut_by_its_deadline_is_finished_by_a_new_owner_each_completed_call_made_once(
    store_target: str, resumer: str, released: list[Hold]
) -> None:
    """The same with a store: the abandoned call's owner stopped, a new owner makes c only, a never again."""
    effects = Effects()
    hold = Hold(effects, "c", after=("a",))
    released.append(hold)
    agent = make_agent(effects, ("a", "c"), hold, tool="swork", timeout=DEADLINE)
    with open_store(store_target) as store:
        stop = _stopped(lambda: agent.run("go", store=store, run_id="r"))
        assert store.load("r")["reason"] == "timeout"
    assert stop.evidence["unfinished"] == "c"
    owner = make_agent(effects, ("a", "c"), tool="swork", timeout=DEADLINE)
    result = resumed_by_new_owner(store_target, "r", resumer, owner, timeout=60)
    assert result.final == answer(("a", "c"))
    assert dict(effects.done) == {"a": 1, "c": 1}
    assert effects.tries == {"a": 1, "c": 2}
    assert effects.parent_model == 2


@pytest.mark.slow
def test_a_sync_call_abandoned_at_the_deadline_may_finish_after_the_stop_and_a_resume_makes_it_again() -> None:
    """As documented (exactly-once.md): a call given up in flight may still finish, and its outcome is not taken
    in, so the resume makes it again under the same id (a ``call_id`` tool does its effect once); nothing else."""
    effects = Effects()
    hold = Hold(effects, "c", after=("a",))
    agent = make_agent(effects, ("a", "c"), hold, tool="swork", timeout=DEADLINE)
    stop = _stopped(lambda: agent.run("go"))
    assert (stop.reason, stop.evidence["unfinished"]) == ("timeout", "c")
    hold.release(complete=True)  # the abandoned call goes on in its thread, to its side effect
    deadline = time.monotonic() + WAIT
    while effects.done["c"] < 1:
        assert time.monotonic() < deadline, "the abandoned call never finished"
        time.sleep(0.01)
    result = agent.resume(stop.result, timeout=60).finish()
    assert result.final == answer(("a", "c"))
    assert dict(effects.done) == {"a": 1, "c": 2}
    assert effects.tries == {"a": 1, "c": 2}
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == ["a", "c"]


def _stopped_by_asyncio_run(agent: Agent, release: Callable[[], None]) -> AgentLoopError:
    """``asyncio.run(agent.arun("go"))`` on a thread: its stop, once ``asyncio.run`` returned without waiting for
    the call the deadline gave up (which ``release()`` lets end afterwards)."""
    stopped = threading.Event()
    outcome: list[AgentLoopError] = []

    async def go() -> None:
        try:
            await agent.arun("go")
        except AgentLoopError as stop:
            outcome.append(stop)
        stopped.set()

    thread = threading.Thread(target=asyncio.run, args=(go(),), daemon=True)
    thread.start()
    try:
        assert stopped.wait(WAIT), "the run never stopped"
        thread.join(5.0)  # closing the loop takes milliseconds
        assert not thread.is_alive(), "asyncio.run still waits for the abandoned call"
    finally:
        release()
        thread.join(WAIT)
    (stop,) = outcome
    return stop


@pytest.mark.slow
def test_asyncio_run_of_a_run_cut_by_its_deadline_does_not_wait_for_the_abandoned_sync_call() -> None:
    """``asyncio.run(agent.arun(...))`` returns at the deadline's stop, as the sync driver's ``run`` does."""
    effects = Effects()
    hold = Hold(effects, "c", after=("a", "b"))
    agent = make_agent(effects, ABC, hold, tool="swork", timeout=DEADLINE)
    stop = _stopped_by_asyncio_run(agent, lambda: hold.release(complete=False))
    assert stop.reason == "timeout"


class _StuckModel:
    """A sync model whose call returns only once ``release`` is set: cut by the run's deadline first."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.calls += 1
        self.release.wait(WAIT)
        return reply("too late")


@pytest.mark.slow
def test_asyncio_run_of_a_run_whose_sync_model_call_is_cut_by_its_deadline_does_not_wait_for_that_call() -> None:
    """The model's call, on a worker thread, is abandoned at the deadline: ``asyncio.run`` returns at the stop."""
    model = _StuckModel()
    stop = _stopped_by_asyncio_run(Agent(model, ToolRegistry(), timeout=DEADLINE), model.release.set)
    assert (stop.reason, stop.result.evidence["unfinished"]) == ("timeout", "model call of turn 1")
    assert model.calls == 1


# --- a cancel token cancelled while a batch is in flight ------------------------------------------------------


@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_cancel_token_set_mid_batch_on_the_sync_driver_stops_before_the_next_call_and_a_new_owner_makes_the_rest(
    store_target: str, resumer: str
) -> None:
    """c cancels while it runs: c completes, d is not made; a new owner with a fresh token makes d alone, once."""
    effects = Effects()
    token = CancelToken()
    hold = Hold(effects, "c", after=("a", "b"), then=lambda: token.cancel("the user left"), stay=False)
    agent = make_agent(effects, ABCD, hold, tool="swork")
    with open_store(store_target) as store:
        stop = _stopped(lambda: agent.run("go", store=store, run_id="r", cancel=token))
        assert store.load("r")["reason"] == "cancelled"
    assert (stop.reason, stop.evidence["why"]) == ("cancelled", "the user left")
    assert [call.id for call in stop.result.pending] == ["d"]
    assert dict(effects.done) == {"a": 1, "b": 1, "c": 1}
    owner = make_agent(effects, ABCD, tool="swork")
    result = resumed_by_new_owner(store_target, "r", resumer, owner, cancel=CancelToken())
    assert result.final == answer(ABCD)
    assert dict(effects.done) == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert effects.tries == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert effects.parent_model == 2


def test_a_cancel_token_set_mid_batch_on_the_async_driver_stops_the_run_before_the_next_model_call() -> None:
    """The token is checked before every model and tool call: set while the batch ran, no model call follows.

    The tools of this batch return without waiting, so ``a`` and ``b`` are done before ``c`` sets the token and
    ``d`` starts after it: ``d`` is left unmade (the token is read as each call starts), and made once by a resume.
    """
    effects = Effects()
    token = CancelToken()
    hold = Hold(effects, "c", after=("a", "b"), then=lambda: token.cancel("the user left"), stay=False)
    agent = make_agent(effects, ABCD, hold)
    with pytest.raises(AgentLoopError) as stopped:
        asyncio.run(agent.arun("go", cancel=token))
    assert stopped.value.reason == "cancelled"
    assert effects.parent_model == 1  # no model call after the cancel
    assert effects.tries == {"a": 1, "b": 1, "c": 1}  # those that started ran once; d, after the cancel, did not
    assert [call.arguments["label"] for call in stopped.value.result.pending] == ["d"]
    _resumed(agent, stopped.value.result, "async", cancel=CancelToken())
    assert effects.tries == {"a": 1, "b": 1, "c": 1, "d": 1}


# --- the task driving the run is cancelled while a batch is in flight ------------------------------------------


@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_task_cancelled_mid_batch_is_stored_cancelled_and_a_new_owner_makes_only_the_cut_call_again(
    store_target: str, resumer: str
) -> None:
    """a and b finished, c in flight when the task is cancelled: stored cancelled; a new owner makes c alone."""
    effects = Effects()
    hold = Hold(effects, "c", after=("a", "b"))
    agent = make_agent(effects, ABC, hold)

    async def cut() -> RunResult:
        with open_store(store_target) as store:
            run = await agent.astart("go", store=store, run_id="r")
            task: asyncio.Future[RunResult] = asyncio.ensure_future(run.afinish())
            while not hold.in_flight.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return run.result

    stopped = asyncio.run(cut())
    assert (stopped.reason, stopped.evidence["unfinished"]) == ("cancelled", "c")
    with open_store(store_target) as store:
        assert store.load("r")["reason"] == "cancelled"
    assert dict(effects.done) == {"a": 1, "b": 1}
    owner = make_agent(effects, ABC)
    result = resumed_by_new_owner(store_target, "r", resumer, owner, cancel=CancelToken())
    assert result.final == answer(ABC)
    assert dict(effects.done) == {"a": 1, "b": 1, "c": 1}
    assert effects.tries == {"a": 1, "b": 1, "c": 2}
    assert effects.parent_model == 2
