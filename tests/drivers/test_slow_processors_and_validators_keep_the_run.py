"""A history processor or an output validator that outlasts a lease or the deadline: the run stays its owner's.

docs/concepts/exactly-once.md ("At most one owner advances a run at a
time"; the lease is renewed while user code the run waits on runs) and
docs/how-to/long-runs.md ("a call the processors delayed past the
deadline is not made").  Owner A holds its processor (before its second
model call) or its validator (on its first answer) for longer than a
lease, while owner B asks to resume the stored run from another store
object, twice, a lease apart: B is refused both times and calls nothing.
Every model call, processor and validator call is counted by the turn it
serves, and each is made once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from fsm_agent import Agent, CancelToken, Message, ModelResponse, Retry, RunLeasedError, RunResult, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn

LEASE = 2.0
"""A live owner's heartbeat renews it every 0.67 s while the slow part runs (it would have to stall 1.3 s to lose
it), and B asks again after 1.25 leases, so that a part not kept leased would be taken over; both figures are
seconds against the milliseconds each call takes here."""
WAIT = 60.0


class Ledger:
    """What was called, by kind and the model turn it served: ``model:2``, ``processor:2``, ``validator:3``."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def add(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1


class Hold:
    """Holds the slow part the first time it runs for ``turn``, until the test releases it."""

    def __init__(self, turn: int) -> None:
        self.turn = turn
        self.entered = threading.Event()
        self.release = threading.Event()

    def maybe_wait(self, turn: int) -> None:
        if turn == self.turn and not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(WAIT)


class Model:
    """Turn 1 asks for ``note``; turn 2 answers "21" (rejected by the validator); turn 3 answers "7"."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def complete(self, messages: list[Message], tools: Any) -> ModelResponse:
        turn = 1 + sum(1 for m in messages if m.role == "assistant")
        self.ledger.add(f"model:{turn}")
        if turn == 1:
            return tool_turn(tool_call("note", id="n1", text="a"))
        return reply("21" if turn == 2 else "7")


def make_agent(ledger: Ledger, part: str, hold: Hold | None, **options: Any) -> Agent:
    registry = ToolRegistry()

    @registry.register
    def note(text: str) -> str:
        """Count one execution."""
        ledger.add(f"tool:{text}")
        return f"noted {text}"

    def processor(messages: list[Message]) -> list[Message]:
        turn = 1 + sum(1 for m in messages if m.role == "assistant")
        ledger.add(f"processor:{turn}")
        if hold is not None and part == "processor":
            hold.maybe_wait(turn)
        return messages

    def small(answer: str) -> str:
        ledger.add(f"validator:{answer}")
        if hold is not None and part == "validator":
            hold.maybe_wait(2 if answer == "21" else 3)
        if int(answer) > 10:
            raise Retry("at most 10")
        return answer

    return Agent(
        Model(ledger),
        registry,
        history_processors=[processor],
        output_type=str,
        output_validators=[small],
        **options,
    )


def _drive(agent: Agent, driver: str, target: str, how: str) -> RunResult:
    """Start run "r" (``how="start"``) or resume it from the store, on ``driver``, on a store object of its own."""
    if driver.startswith("sync"):
        with open_store(target, lease=LEASE) as store:
            if how == "start":
                return agent.run("q", store=store, run_id="r")
            return agent.resume(store.load("r"), store=store).finish()

    async def go() -> RunResult:
        store = open_store(target, lease=LEASE)
        try:
            if how == "start":
                return await agent.arun("q", store=store, run_id="r")
            return await agent.resume(await store.aload("r"), store=store).afinish()
        finally:
            await store.aclose()
            store.close()

    return asyncio.run(go())


EXPECTED = Counter(
    {
        "model:1": 1,
        "model:2": 1,
        "model:3": 1,
        "processor:1": 1,
        "processor:2": 1,
        "processor:3": 1,
        "tool:a": 1,
        "validator:21": 1,
        "validator:7": 1,
    }
)


@pytest.mark.slow
@pytest.mark.parametrize("part", ["processor", "validator"])
@pytest.mark.parametrize(("owner", "other"), [("sync", "async"), ("async", "sync"), ("sync, timeout", "sync")])
def test_a_second_owner_is_refused_while_a_slow_processor_or_validator_runs_and_nothing_is_called_twice(
    store_target: str, part: str, owner: str, other: str
) -> None:
    ledger = Ledger()
    hold = Hold(2)
    # "sync, timeout": the run has a deadline (far off), so its work runs on a worker (_bounded).
    options = {"timeout": WAIT * 4} if owner == "sync, timeout" else {}
    agent = make_agent(ledger, part, hold, **options)
    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            outcome["result"] = _drive(agent, owner, store_target, "start")
        except BaseException as exc:  # noqa: BLE001 - kept for the test to raise
            outcome["error"] = exc

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    try:
        assert hold.entered.wait(WAIT), f"the {part} of turn 2 never ran"
        before = Counter(ledger.counts)
        second = make_agent(ledger, part, None)
        with pytest.raises(RunLeasedError):
            _drive(second, other, store_target, "resume")
        time.sleep(LEASE * 1.25)  # longer than a lease: only the heartbeat while the part runs keeps it
        with pytest.raises(RunLeasedError):
            _drive(second, other, store_target, "resume")
        assert ledger.counts == before  # the refused owner called nothing
    finally:
        hold.release.set()
        thread.join(WAIT)
    assert not thread.is_alive()
    if "error" in outcome:
        raise outcome["error"]
    assert outcome["result"].output == "7"
    assert ledger.counts == EXPECTED


class Slow:
    """A processor that takes ``seconds`` before the model call of turn 1: past the run's deadline."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, messages: list[Message]) -> list[Message]:
        time.sleep(self.seconds)
        return messages


class Counting:
    """A model counting its calls: each is paid."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, messages: list[Message], tools: Any) -> ModelResponse:
        self.calls += 1
        return reply("answer")


DEADLINE = 0.3
"""The run's timeout; the processor takes 0.6 s (twice it), and a model call milliseconds."""


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_model_call_the_processors_delayed_past_the_deadline_is_not_made_and_a_resume_makes_it_once(
    store_target: str, driver: str
) -> None:
    model = Counting()
    agent = Agent(
        model, ToolRegistry(), history_processors=[Slow(DEADLINE * 2)], timeout=DEADLINE, on_stop={"timeout": "return"}
    )
    with open_store(store_target, lease=LEASE) as store:
        run = agent.start("q", store=store, run_id="r")
        stopped = run.finish() if driver == "sync" else asyncio.run(run.afinish())
        assert stopped.reason == "timeout"
        assert "unfinished" not in stopped.evidence  # no call was in flight: none was made
        assert model.calls == 0
        again = Agent(model, ToolRegistry(), history_processors=[Slow(0)])
        result = again.resume(store.load("r"), store=store, timeout=60).finish()
    assert result.final == "answer"
    assert model.calls == 1


class Hanging:
    """A processor that hangs until the test lets it go: a summary whose model call never answers."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.release = threading.Event()

    def __call__(self, messages: list[Message]) -> list[Message]:
        self.running.set()
        try:
            assert self.release.wait(WAIT)
        finally:
            self.running.clear()
        return messages

    async def hang(self, messages: list[Message]) -> list[Message]:
        self.running.set()
        try:
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        finally:
            self.running.clear()
        return messages


@pytest.mark.parametrize("kind", ["sync processor", "async processor"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_processors_that_hang_stop_the_run_timeout_at_its_deadline_and_a_resume_makes_the_call_once(
    store_target: str, driver: str, kind: str
) -> None:
    """long-runs.md: the processors run within the run's time left, as a typed answer's check does.  The run stops
    while the processor still hangs (it is let go only after the run returned), with no call made."""
    model = Counting()
    hanging = Hanging()
    processor = hanging if kind == "sync processor" else hanging.hang
    on_the_loop = kind == "async processor" and driver == "async"  # cancelled there; a thread runs on
    agent = Agent(
        model, ToolRegistry(), history_processors=[processor], timeout=DEADLINE, on_stop={"timeout": "return"}
    )
    try:
        with open_store(store_target, lease=LEASE) as store:
            run = agent.start("q", store=store, run_id="r")
            stopped = run.finish() if driver == "sync" else asyncio.run(run.afinish())
            assert stopped.reason == "timeout"
            assert hanging.running.is_set() is not on_the_loop
            assert "unfinished" not in stopped.evidence
            assert model.calls == 0
            hanging.release.set()
            result = agent.resume(store.load("r"), store=store, timeout=60).finish()
    finally:
        hanging.release.set()
    assert result.final == "answer"
    assert model.calls == 1


@pytest.mark.parametrize("kind", ["async processor", "sync processor"])
def test_a_task_cancelled_in_a_processor_stops_the_run_cancelled_before_its_call_and_a_resume_makes_it_once(
    store_target: str, kind: str
) -> None:
    """On the async driver a sync processor runs on a thread, an async one on the loop; either way a cancel of the
    task meanwhile is the run's ``cancelled`` stop before the call, stored, as one during the call would be."""
    model = Counting()
    entered = threading.Event()

    def blocking(messages: list[Message]) -> list[Message]:
        entered.set()
        time.sleep(0.5)  # the cancel lands meanwhile; the thread then ends, its result unread
        return messages

    async def awaiting(messages: list[Message]) -> list[Message]:
        entered.set()
        await asyncio.sleep(3600)
        return messages

    processor = awaiting if kind == "async processor" else blocking
    agent = Agent(model, ToolRegistry(), history_processors=[processor])

    asyncio.run(_cancelled_in(agent, store_target, entered))
    with open_store(store_target, lease=LEASE) as store:
        stored = store.load("r")
        assert (stored["state"], stored["reason"]) == ("Failed", "cancelled")
        assert model.calls == 0
        result = Agent(model, ToolRegistry()).resume(stored, store=store).finish()
    assert result.final == "answer"
    assert model.calls == 1


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_processor_that_raises_is_heard_as_a_model_call_that_failed_between_its_two_events(driver: str) -> None:
    """``before_model`` then ``after_model`` with the error, as for a failed call (a trace shows it errored): the
    hooks still come first, the processors after them, the call not made."""
    model = Counting()

    def broken(messages: list[Message]) -> list[Message]:
        raise KeyError("region")

    agent = Agent(model, ToolRegistry(), history_processors=[broken], on_stop={"model_error": "return"})
    heard: list[tuple[str, str | None]] = []
    agent.on("before_model", lambda event: heard.append(("before_model", event.error)))
    agent.on("after_model", lambda event: heard.append(("after_model", event.error)))
    result = agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    assert result.reason == "model_error"
    assert heard == [("before_model", None), ("after_model", "KeyError: 'region'")]
    assert model.calls == 0


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_cancel_while_the_processors_run_stops_the_run_before_its_model_call(driver: str) -> None:
    """limits-and-policies.md: the token is checked before every model call; after the processors too."""
    model = Counting()
    token = CancelToken()

    def cancels(messages: list[Message]) -> list[Message]:
        token.cancel("the user left")
        return messages

    agent = Agent(model, ToolRegistry(), history_processors=[cancels], on_stop={"cancelled": "return"})
    result = agent.run("q", cancel=token) if driver == "sync" else asyncio.run(agent.arun("q", cancel=token))
    assert result.reason == "cancelled"
    assert model.calls == 0
    assert agent.resume(result, cancel=CancelToken()).finish().final == "answer"
    assert model.calls == 1


def test_a_task_cancelled_while_its_answer_is_checked_stops_the_run_cancelled_let_go_for_a_resume(
    store_target: str,
) -> None:
    """async.md: a cancelled task leaves its run in ``Failed`` with reason ``cancelled``; during a typed answer's
    check too (``Dispatch->Failed[cancelled]`` on ``interrupted``).  It was left in Dispatch, leased until the lease
    lapsed.  The resume checks the answer again and asks the model nothing."""
    model = Counting()
    entered, release = threading.Event(), threading.Event()
    checked: list[str] = []

    def slow(answer: str) -> str:
        checked.append(answer)
        entered.set()
        release.wait(WAIT)
        return answer

    agent = Agent(model, ToolRegistry(), output_type=str, output_validators=[slow])

    try:
        # Released once the cancel has stopped the run: asyncio.run waits for the validator's thread as it closes.
        asyncio.run(_cancelled_in(agent, store_target, entered, then=release.set))
    finally:
        release.set()
    with open_store(store_target, lease=LEASE) as store:
        stored = store.load("r")
        assert (stored["state"], stored["reason"]) == ("Failed", "cancelled")
        assert stored["evidence"]["unfinished"] == "the output check"
        result = agent.resume(stored, store=store).finish()  # let go: no lease to wait out
    assert (result.output, model.calls, checked) == ("answer", 1, ["answer", "answer"])


async def _cancelled_in(
    agent: Agent, store_target: str, entered: threading.Event, then: Callable[[], object] = lambda: None
) -> None:
    """Run "r" on ``agent`` in a task, cancelled once ``entered`` is set (the part the test holds has begun); ``then``
    once the cancelled task has ended."""
    store = open_store(store_target, lease=LEASE)
    try:
        task = asyncio.ensure_future(agent.arun("q", store=store, run_id="r"))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        then()
    finally:
        await store.aclose()
        store.close()
