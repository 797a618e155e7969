"""``Agent.stream``/``astream``: a run's transition events and, between them, a streaming model's text as it comes.

A model call holds the driver until the whole reply is in, so text arriving
during it can be handed on at once only if the run is driven elsewhere: the
sync stream drives it on a worker thread, the async stream in a task, and
both pass every event through one queue in the order it happened (the
text of a reply before the ``replied`` transition that takes it in).  A model
that cannot stream needs neither: its run is driven in place, one
transition at a time, with no thread and no task.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from fsm_agent.errors import RunStateError
from fsm_agent.observe.events import TextDelta, TransitionEvent

if TYPE_CHECKING:
    from fsm_agent.drivers.agent_run import AgentRun

StreamEvent = TransitionEvent | TextDelta
"""What ``Agent.stream`` yields."""

_END = object()
_STEPPED = object()


class _Raised:
    """What the driving thread raised, to be raised again in the reading thread."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def events(run: AgentRun, feed: queue.SimpleQueue[Any]) -> Iterator[StreamEvent]:
    """Drive ``run`` (watched with ``feed.put`` as observer), yielding what it puts there; then ``finish()`` it.

    Ended however it ends, ``run`` is told to hand its feed nothing more: it may be streamed again.
    """
    told = feed.put
    _begin(run)
    run._watched_by(told)  # noqa: SLF001 - the stream's own observer
    try:
        yield from _events(run, feed, told)
    finally:
        run._unwatched_by(told, told)  # noqa: SLF001 - as above
        run._streamed = False  # noqa: SLF001 - as above


_TAKING = threading.Lock()
"""Held while a stream takes a run (``_begin``): two streams begun at once see each other."""


def _begin(run: AgentRun) -> None:
    """Take ``run`` for a stream; a ``RunStateError`` if another stream of it is being read.

    Why: each stream drives the run, so two read at once would each make
    the run's next call.
    """
    with _TAKING:
        if run._streamed:  # noqa: SLF001 - the stream's own mark
            msg = f"run {run.run_id} is being streamed already: read one stream of a run at a time"
            raise RunStateError(msg)
        run._streamed = True  # noqa: SLF001 - as above


def _going(run: AgentRun) -> bool:
    """Whether a stream drives ``run`` on: it has not ended or paused, or the transition that did is not yet written.

    A transition whose store write failed (``RunBase._closing``) is
    announced once it is written, when the run is driven again: a stream
    read again after the store's error reads it then.
    """
    return not (run.done or run.paused) or run._closing is not None  # noqa: SLF001 - whether its write is owed


def _events(run: AgentRun, feed: queue.SimpleQueue[Any], told: Any) -> Iterator[StreamEvent]:
    if not callable(getattr(run.agent.model, "complete_stream", None)):
        try:
            while _going(run):
                run.advance()
                while not feed.empty():
                    yield feed.get_nowait()
        except GeneratorExit:
            run._end_cut()  # noqa: SLF001 - the reader stopped reading: nobody drives the run on
            raise
        run.finish()
        return
    run.on_text(told)
    go = threading.Semaphore(0)
    stopped = False

    def drive() -> None:
        try:
            while _going(run):
                run.advance()
                feed.put(_STEPPED)
                go.acquire()  # as lazy as a plain generator: the next transition waits until it is asked for
                if stopped:
                    run._end_cut()  # noqa: SLF001 - the reader stopped reading: nobody drives the run on
                    return
        except BaseException as exc:  # noqa: BLE001 - raised again in the reading thread
            feed.put(_Raised(exc))
        finally:
            feed.put(_END)

    driver = threading.Thread(target=drive, name=f"fsm_agent stream {run.run_id}", daemon=True)
    driver.start()
    try:
        while (item := feed.get()) is not _END:
            if item is _STEPPED:
                go.release()
            elif isinstance(item, _Raised):
                raise item.error
            else:
                yield item
    except GeneratorExit:
        # The reader stopped reading (it broke out of its loop, or closed this): the transition in progress ends,
        # then the run stops cancelled (drive), and only then does close() return, as it does with no thread: a
        # store holds the run ended and let go by the time the reader's next line runs.
        stopped = True
        go.release()
        if driver is not threading.current_thread():  # closed from a hook of the run itself: it ends as it returns
            driver.join()
        raise
    finally:
        # Also on an interrupt or an error: the run stops at its next step (drive), nobody waiting for it.
        stopped = True
        go.release()
    run.finish()


async def aevents(run: AgentRun, feed: deque[StreamEvent]) -> AsyncGenerator[StreamEvent, None]:
    """The async twin of ``events``: ``run`` watched with ``feed.append`` as observer, told no more at the end."""
    told: Callable[[Any], None] = feed.append
    _begin(run)
    run._watched_by(told)  # noqa: SLF001 - the stream's own observer
    text: Callable[[TextDelta], None] | None = None
    try:
        if not callable(getattr(run.agent.model, "acomplete_stream", None)):
            try:
                while _going(run):
                    await run.aadvance()
                    while feed:
                        yield feed.popleft()
            except GeneratorExit:
                await run._aend_cut()  # noqa: SLF001 - the reader stopped reading: nobody drives the run on
                raise
            await run.afinish()
            return
        import asyncio  # as in drivers.aio: import fsm_agent loads no asyncio

        arrived = asyncio.Event()
        loop, here = asyncio.get_running_loop(), threading.get_ident()

        def heard(delta: TextDelta) -> None:
            feed.append(delta)
            if threading.get_ident() == here:
                arrived.set()
            else:  # a model streaming from a thread of its own: an asyncio.Event is set from its loop only
                loop.call_soon_threadsafe(arrived.set)

        text = heard
        run.on_text(text)
        try:
            while _going(run):
                step = asyncio.ensure_future(run.aadvance())
                try:
                    while not step.done():
                        waiter = asyncio.ensure_future(arrived.wait())
                        await asyncio.wait({step, waiter}, return_when=asyncio.FIRST_COMPLETED)
                        waiter.cancel()
                        arrived.clear()
                        while feed:
                            yield feed.popleft()
                except BaseException:
                    # The reader stopped or was cancelled: the run records the call cut off, as a cancelled arun would.
                    if step.cancel():
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await step
                    elif not step.cancelled():
                        # Ended: what it raised is taken, not raised again.  A Ctrl-C in it has left the loop already
                        # (asyncio.run then cancels this task); raised here again, it would cut asyncio.run's shutdown.
                        step.exception()
                    raise
                step.result()
                while feed:
                    yield feed.popleft()
        except GeneratorExit:
            await run._aend_cut()  # noqa: SLF001 - the reader stopped between calls: nobody drives the run on
            raise
        await run.afinish()
    finally:
        run._unwatched_by(told, text)  # noqa: SLF001 - as above
        run._streamed = False  # noqa: SLF001 - as above
