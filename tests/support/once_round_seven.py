"""Counted runs for the seventh exactly-once audit: cancel tokens, deadlines and leases met inside user code.

The runs are those of ``support.once_round_six`` (a parallel batch, a typed
answer sent back once, a compaction, a finalize call), each side effect
counted in a ``Tally``.  What is new here is *where* a run is met: a
``CancelToken`` cancelled from another thread while a validator, a
compaction, a guardrail or a finalize call is running (``CancelInside``); a
part of the run held past its deadline or its lease (``Gate``); a store write
held in flight (``held_write``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from fsm_agent import Agent, AgentLoopError, CancelToken, Message, Retry, RunLeasedError, RunResult
from fsm_agent.persist import open_store
from support.once_round_six import Point, Tally, TypedModel, batch_registry, summary

WAIT = 60.0
"""A bound on waits for something that happens within a second (an event another thread sets)."""


class CancelInside:
    """Cancels ``token`` from a thread of its own once a part of the run says it ``started``; the part then waits
    (``inside``) until the cancel landed, so the token is cancelled while that part is running."""

    def __init__(self) -> None:
        self.token = CancelToken()
        self.started = threading.Event()
        self.landed = threading.Event()
        self.thread = threading.Thread(target=self._cancel, daemon=True)
        self.thread.start()

    def _cancel(self) -> None:
        if self.started.wait(WAIT):
            self.token.cancel("the user left")
            self.landed.set()

    def inside(self) -> None:
        """Called by the part of the run the cancel must land in: returns once the token is cancelled."""
        self.started.set()
        assert self.landed.wait(WAIT), "the cancelling thread never cancelled the token"


class Gate:
    """Holds a part of the run until the test opens it (``opened``), after the run returned; ``entered`` says it
    is held.  The hold is bounded by ``WAIT``, so a test that fails never leaves a thread behind for long."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def hold(self) -> None:
        self.entered.set()
        self.opened.wait(WAIT)

    def open(self) -> None:
        self.opened.set()


def drive(agent: Agent, driver: str, store: Any, run_id: str = "r", **keywords: Any) -> RunResult:
    """``agent``'s run ``run_id`` on ``driver``, to its end: its result, or the stopped one ``AgentLoopError``
    carries."""
    try:
        if driver == "sync":
            return agent.run("q", store=store, run_id=run_id, **keywords)
        return asyncio.run(agent.arun("q", store=store, run_id=run_id, **keywords))
    except AgentLoopError as stop:
        return stop.result


def validated_agent(tally: Tally, during: Callable[[int], None] | None = None, **options: Any) -> Agent:
    """``support.once_round_six.typed_agent`` whose validator calls ``during(x)`` before it judges ``x``."""

    def positive(point: Point) -> Point:
        with tally.lock:
            tally.validated[point.x] += 1
        if during is not None:
            during(point.x)
        if point.x <= 0:
            raise Retry("x must be positive")
        return point

    return Agent(
        TypedModel(tally, _NoCuts()),
        batch_registry(tally),
        output_type=Point,
        output_validators=[positive],
        max_concurrency=2,
        **options,
    )


class _NoCuts:
    def fire(self, point: str, value: Any = True) -> None:
        return None


def counted_compact(tally: Tally, during: Callable[[], None]) -> Callable[[list[Message]], list[Message]]:
    """The summary ``compact`` of ``support.once_round_six``, counted, calling ``during()`` before it returns."""

    def compact(messages: list[Message]) -> list[Message]:
        with tally.lock:
            tally.compacted.append(len(messages))
        during()
        return summary(messages)

    return compact


def held_write(store: Any, hold_when: Callable[[], bool], hold: Callable[[], None]) -> threading.Event:
    """Make ``store``'s next journal write (``append``) once ``hold_when()`` holds wait in ``hold()`` before it is
    made, once; the returned event says the write is held."""
    held = threading.Event()
    append = store.append

    def appended(*args: Any, **keywords: Any) -> Any:
        if not held.is_set() and hold_when():
            held.set()
            hold()
        return append(*args, **keywords)

    store.append = appended
    return held


def claim_after_the_lease(target: str, lease: float, claim: Callable[[Any], Any], leases: int = 3) -> Any:
    """Try to take run ``r`` over (``claim(store)``) as a second owner would, again each time the lease the first
    owner holds has run out, for ``leases`` leases: the claim's outcome if it ever succeeds, else None.

    A live owner's heartbeat renews the lease every third of it, so the
    claim is refused each time; one whose lease nobody renews is taken over.
    """
    store = open_store(target, lease=lease)
    try:
        for _ in range(leases):
            try:
                return claim(store)
            except RunLeasedError as busy:
                wait = max(busy.until - time.time(), 0.0) + lease / 3
                threading.Event().wait(wait)  # until the lease stated in the refusal has run out
        return None
    finally:
        store.close()
