"""The local executor: every run of the batch in this process, on the async driver, at most ``max_in_flight`` at once.

Agent runs mostly wait (on the model, on tools), so one event loop keeps
hundreds of them going on one core; its executor has threads enough for
each run's sync calls (``worker.blocking_calls``).  The loop runs in a thread of its own
and hands results over a queue, so the caller's thread stays free to draw a
progress bar and to receive Ctrl-C.  On Ctrl-C (or the caller dropping the
iterator) each run in flight stops at its next check, as ``Failed``/
``cancelled`` with its lease given up, and the next pass over the batch
resumes it; a run still waiting on a call after ``GRACE`` seconds (or at a
second Ctrl-C) has its task cancelled where it waits.  A call that raises
``KeyboardInterrupt`` or ``SystemExit`` stops the batch the same way, its
own run left as the driver leaves it (written, unfinished), and the
caller's thread raises it.

A run another owner still holds (a crashed driver's, until its lease
lapses) does not keep its worker waiting: it is put back, the worker takes
the next run, and it is tried again once the lease has run out.
"""

from __future__ import annotations

import asyncio
import heapq
import queue
import threading
import time
from collections.abc import Callable, Iterator

from fsm_agent.batch.items import BatchItem
from fsm_agent.batch.worker import (
    AgentFactory,
    DepsFactory,
    Later,
    Patience,
    atry_item,
    blocking_calls,
    failed_result,
)
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.persist.store import Store
from fsm_agent.records import RunResult

DEFAULT_IN_FLIGHT = 64
"""Runs at once when ``max_in_flight`` is not given: enough to hide model latency, few enough for rate limits."""

_POLL = 0.1
"""Seconds the caller's thread waits on the queue at a time, so a signal is handled promptly."""

GRACE = 10.0
"""Seconds the runs in flight get, once the batch is left, to reach their next check and stop there."""

Finished = tuple[BatchItem, RunResult]


def iter_local(
    make_agent: AgentFactory,
    store: Store,
    items: list[BatchItem],
    *,
    max_in_flight: int,
    cancel: CancelToken | None,
    on_start: Callable[[BatchItem], None] | None = None,
    make_deps: DepsFactory | None = None,
    on_end: Callable[[BatchItem], None] | None = None,
) -> Iterator[Finished]:
    """Yield ``(item, result)`` as runs finish; after ``cancel``, runs not yet begun end ``cancelled`` unstarted.

    ``on_start`` and ``on_end`` (if given) are called, in the loop's
    thread, as a worker takes a run and as the run leaves it (ended, or
    back in line on another owner's lease, to be taken again once it
    lapses), so a progress display counts the runs in flight as the
    workers hold them, whenever the caller reads.  ``on_end`` comes before
    the run's result is handed over: the caller never gets a result whose
    run still counts as in flight.  ``make_deps(item)`` gives each run its
    deps, in this process.
    """
    done: queue.Queue[Finished | BaseException] = queue.Queue()
    loop = asyncio.new_event_loop()
    loop.set_default_executor(blocking_calls(min(max_in_flight, len(items))))
    # The runs hold this token, not the caller's: it is also how leaving the loop (Ctrl-C) stops them gently.
    stop = CancelToken()
    line = _Line(make_agent, store, items, stop, done, on_start, on_end, make_deps)
    task = loop.create_task(line.main(min(max_in_flight, len(items)), cancel))
    # Set once the loop has stopped for good.  Not ``thread.join``: a join a Ctrl-C interrupts can leave the thread
    # marked stopped while it still runs (CPython 3.11's bpo-45274 handling), and a running loop cannot be closed.
    ended = threading.Event()

    def drive() -> None:
        try:
            while True:
                try:
                    loop.run_until_complete(task)
                    break
                except (KeyboardInterrupt, SystemExit) as exc:
                    # A call of a run's parallel batch raised it, and asyncio let it leave the loop at once: the
                    # loop goes on, so the other runs stop as at a Ctrl-C (the run itself hears it: see _Line.leave).
                    if task.done():
                        raise
                    line.leave(exc)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, which re-raises it
            done.put(exc)
        finally:
            # The loop ends as asyncio.run ends one: its async generators finalised (a PostgreSQL store closes
            # this loop's connections in one) and its worker threads joined.
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                ended.set()

    thread = threading.Thread(target=drive, name="fsm_agent-batch", daemon=True)
    thread.start()
    try:
        for _ in items:
            got = _next(done)
            if isinstance(got, BaseException):
                raise got
            yield got
    finally:
        try:
            # Gently first: each run stops at its next check as Failed/cancelled, checkpointed, its lease given up.
            if not stop.cancelled:  # else stopped already (a cancel, a call's interrupt): its reason stands
                stop.cancel("the batch was interrupted")
            ended.wait(GRACE)
        finally:
            if not ended.is_set():
                # A call that does not return in time (or a second Ctrl-C): cancel the tasks where they wait.
                loop.call_soon_threadsafe(task.cancel)
                ended.wait()
            loop.close()


class _Line:
    """The batch's runs in the loop's thread: workers take them in turn, put back the leased, hand results on."""

    def __init__(
        self,
        make_agent: AgentFactory,
        store: Store,
        items: list[BatchItem],
        stop: CancelToken,
        done: queue.Queue[Finished | BaseException],
        on_start: Callable[[BatchItem], None] | None,
        on_end: Callable[[BatchItem], None] | None,
        make_deps: DepsFactory | None,
    ) -> None:
        self.make_agent, self.store, self.make_deps = make_agent, store, make_deps
        self.stop, self.done, self.on_start, self.on_end = stop, done, on_start, on_end
        self.pending = iter(items)  # one iterator shared by every worker: each item is taken once
        # Runs another owner holds (a crashed driver's), back in line until their leases lapse:
        # (at, index, item, patience).
        self.later: list[tuple[float, int, BatchItem, Patience]] = []
        self.busy = 0  # workers in the middle of an attempt, which may yet put their run back
        self.left: BaseException | None = None  # the KeyboardInterrupt or SystemExit a call raised, once one did

    def take(self) -> tuple[BatchItem, Patience | None] | None:
        """The next run to try: one put back whose lease is due (or any, once stopped), else the next new one."""
        later = self.later
        if later and (self.stop.cancelled or later[0][0] <= time.time()):
            _, _, again, patience = heapq.heappop(later)
            return again, patience
        item = next(self.pending, None)
        return None if item is None else (item, None)

    async def worker(self) -> None:
        """Try runs one at a time until none is left that this worker could ever take."""
        while True:
            got = self.take()
            if got is None:
                if self.stop.cancelled or not (self.later or self.busy):
                    return
                # Only runs waiting on a lease (or in other workers' hands) are left: look again soon.
                await asyncio.sleep(min(_POLL, self.later[0][0] - time.time()) if self.later else _POLL)
                continue
            item, patience = got
            if self.stop.cancelled:
                self.done.put((item, _unstarted(item, self.stop, patience)))
                continue
            if self.on_start is not None:
                self.on_start(item)
            self.busy += 1
            try:
                outcome = await atry_item(self.make_agent, self.store, item, self.stop, patience, self.make_deps)
            except (KeyboardInterrupt, SystemExit) as exc:
                # A call asked the program to leave: the run is left as the driver leaves it (written, unfinished)
                # and the batch stops, the interrupt raised to the caller.
                self.leave(exc)
                continue
            finally:
                self.busy -= 1
                # Before the result is put on the queue: once the caller can read it, the run is out of flight.
                if self.on_end is not None:
                    self.on_end(item)
            if isinstance(outcome, Later):
                # Leased elsewhere: the slot goes to the next run; this one is tried again when the lease lapses.
                heapq.heappush(self.later, (outcome.at, item.index, item, outcome.patience))
            else:
                self.done.put((item, outcome))

    def leave(self, exc: BaseException) -> None:
        """A call raised ``exc`` (``KeyboardInterrupt``, ``SystemExit``): stop every run, and raise it to the caller.

        The runs in flight stop at their next check as a Ctrl-C stops them
        (``Failed``/``cancelled``, checkpointed, their leases given up); the
        caller's thread raises ``exc`` as soon as it reads it, then gives
        them ``GRACE`` seconds, as when it is left by a Ctrl-C of its own.
        """
        if self.left is None:
            self.left = exc
            self.stop.cancel(f"a call raised {type(exc).__name__}")
            self.done.put(exc)

    async def follow(self, cancel: CancelToken | None) -> None:
        """Pass the caller's cancel on to the runs' own token."""
        while cancel is not None and not self.stop.cancelled:
            if cancel.cancelled:
                self.stop.cancel(cancel.why)
            await asyncio.sleep(_POLL)

    async def main(self, workers: int, cancel: CancelToken | None) -> None:
        """``workers`` workers until every run is handed on, the caller's cancel followed meanwhile."""
        watcher = asyncio.ensure_future(self.follow(cancel))
        try:
            await asyncio.gather(*(self.worker() for _ in range(workers)))
        finally:
            watcher.cancel()


def _unstarted(item: BatchItem, stop: CancelToken, patience: Patience | None) -> RunResult:
    """A run the batch stopped before it ran here: never begun, or put back waiting on another owner's lease."""
    if patience is None:
        return failed_result(item, "cancelled", why=stop.why, started=False)
    return failed_result(item, "cancelled", why=stop.why, leased=True)


def _next(done: queue.Queue[Finished | BaseException]) -> Finished | BaseException:
    while True:
        try:
            return done.get(timeout=_POLL)
        except queue.Empty:
            continue
