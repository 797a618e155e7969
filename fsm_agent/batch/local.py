"""The local executor: every run of the batch in this process, on the async driver, at most ``max_in_flight`` at once.

Agent runs mostly wait (on the model, on tools), so one event loop keeps
hundreds of them going on one core.  The loop runs in a thread of its own
and hands results over a queue, so the caller's thread stays free to draw a
progress bar and to receive Ctrl-C.  On Ctrl-C (or the caller dropping the
iterator) each run in flight stops at its next check, as ``Failed``/
``cancelled`` with its lease given up, and the next pass over the batch
resumes it; a run still waiting on a call after ``GRACE`` seconds (or at a
second Ctrl-C) has its task cancelled where it waits.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator

from fsm_agent.batch.items import BatchItem
from fsm_agent.batch.worker import AgentFactory, arun_item, failed_result
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
) -> Iterator[Finished]:
    """Yield ``(item, result)`` as runs finish; after ``cancel``, runs not yet begun end ``cancelled`` unstarted.

    ``on_start`` (if given) is called, in the loop's thread, as each run
    begins, so a progress display can count the runs in flight.
    """
    done: queue.Queue[Finished | BaseException] = queue.Queue()
    loop = asyncio.new_event_loop()
    pending = iter(items)
    # The runs hold this token, not the caller's: it is also how leaving the loop (Ctrl-C) stops them gently.
    stop = CancelToken()

    async def worker() -> None:
        for item in pending:  # one iterator shared by every worker: each item is taken once
            if stop.cancelled:
                done.put((item, failed_result(item, "cancelled", why=stop.why, started=False)))
                continue
            if on_start is not None:
                on_start(item)
            done.put((item, await arun_item(make_agent, store, item, stop)))

    async def follow() -> None:
        while cancel is not None and not stop.cancelled:
            if cancel.cancelled:
                stop.cancel(cancel.why)
            await asyncio.sleep(_POLL)

    async def main() -> None:
        watcher = asyncio.ensure_future(follow())
        try:
            await asyncio.gather(*(worker() for _ in range(min(max_in_flight, len(items)))))
        finally:
            watcher.cancel()

    task = loop.create_task(main())

    def drive() -> None:
        try:
            loop.run_until_complete(task)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, which re-raises it
            done.put(exc)

    thread = threading.Thread(target=drive, name="fsm_agent-batch", daemon=True)
    thread.start()
    try:
        for _ in items:
            got = _next(done)
            if isinstance(got, BaseException):
                raise got
            yield got
    finally:
        # Gently first: each run stops at its next check as Failed/cancelled, checkpointed, its lease given up.
        stop.cancel("the batch was interrupted")
        try:
            thread.join(GRACE)
        finally:
            if thread.is_alive():
                # A call that does not return in time (or a second Ctrl-C): cancel the tasks where they wait.
                loop.call_soon_threadsafe(task.cancel)
                thread.join()
            loop.close()


def _next(done: queue.Queue[Finished | BaseException]) -> Finished | BaseException:
    while True:
        try:
            return done.get(timeout=_POLL)
        except queue.Empty:
            continue
