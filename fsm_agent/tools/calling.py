"""How a tool function is actually called: sync or async, in this thread, a worker thread or a loop of its own.

Nothing here classifies an outcome: values and exceptions are handed back as
they are, for the registry to turn into a ``ToolResult``.  The arguments a
tool receives are its own copy (``own_arguments``), so a tool that changes
them cannot change the ``ToolCall`` kept in the run's history.  ``asyncio``
and ``concurrent.futures`` are imported by the functions that use them, so
``import fsm_agent`` loads neither.
"""

from __future__ import annotations

import contextvars
import copy
import inspect
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fsm_agent.tools.context import under_deadline
from fsm_agent.tools.schema import ToolFunction

if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import Future

T = TypeVar("T")

_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


def own_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``arguments`` that shares nothing mutable with them, so the tool can change it freely.

    Arguments of scalars only (the common case) need just a new top-level
    dict; anything nested is deep-copied.
    """
    for value in arguments.values():
        if type(value) not in _IMMUTABLE:
            return copy.deepcopy(dict(arguments))
    return dict(arguments)


class DeadlineError(Exception):
    """Work run by ``within_deadline`` passed its timeout (kept apart from a ``TimeoutError`` it raised itself)."""


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class ToolExit(Exception):
    """A ``GeneratorExit`` a sync tool raised on a worker thread, carried back to the event loop as an ``Exception``.

    asyncio throws a future's exception into the task's outermost coroutine,
    and Python closes every coroutine in between on a thrown
    ``GeneratorExit`` instead of letting their ``except`` clauses see it: the
    tool's failure would escape the run.  ``original`` is what the tool raised.
    """

    def __init__(self, original: GeneratorExit) -> None:
        super().__init__(*original.args)
        self.original = original


def call_in_thread(function: ToolFunction, arguments: dict[str, Any]) -> Any:
    """``call_sync`` on a worker thread of the async driver, a ``GeneratorExit`` handed back as ``ToolExit``."""
    try:
        return call_sync(function, arguments)
    except GeneratorExit as exc:
        raise ToolExit(exc) from exc


def call_sync(function: ToolFunction, arguments: dict[str, Any]) -> Any:
    """Call a tool from sync code; an awaitable result is run to completion on an event loop of its own."""
    value = function(**arguments)
    return settle(value) if inspect.isawaitable(value) else value  # the common case without a frame more


def settle(value: Any) -> Any:
    """``value``, or if it is awaitable, what it gives once run to completion from sync code."""
    if not inspect.isawaitable(value):
        return value
    import asyncio
    import concurrent.futures

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(value))
    # Called from inside a running loop (a sync driver within async code): use a loop on another thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _awaited(value)).result()


class _DaemonWorkers:
    """Daemon threads that are reused: handing work to an idle one costs far less than starting a thread.

    Daemon, so a call abandoned at its deadline never holds up the
    interpreter's exit (``concurrent.futures`` pools are joined at exit).  A
    worker whose work is abandoned becomes idle again when the work ends; idle
    workers stay, as many as were ever busy at once.
    """

    def __init__(self) -> None:
        self._idle: queue.SimpleQueue[queue.SimpleQueue[Callable[[], None]]] = queue.SimpleQueue()

    def start(self, work: Callable[[], None]) -> None:
        """Run ``work()`` on an idle worker (a new one if none is idle); ``work`` reports its own outcome.

        ``work`` runs in a copy of the caller's ``contextvars`` context, as
        ``asyncio.to_thread`` does: a tool or an output check on a worker
        still finds its run (``run_context()``).
        """
        context = contextvars.copy_context()
        try:
            inbox = self._idle.get_nowait()
        except queue.Empty:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="fsm_agent worker", daemon=True).start()
        inbox.put(lambda: context.run(work))

    def submit(self, work: Callable[[], T]) -> Future[T]:
        """Run ``work()`` on an idle worker; its outcome arrives in the future (which the event loop can await)."""
        from concurrent.futures import Future

        future: Future[T] = Future()

        def report() -> None:
            if not future.set_running_or_notify_cancel():
                return  # cancelled before it started (an async caller gave up): nothing to run
            try:
                value = work()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)
            else:
                future.set_result(value)

        self.start(report)
        return future

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            work = inbox.get()
            work()
            del work  # an idle worker must not keep the last outcome alive
            self._idle.put(inbox)


WORKERS = _DaemonWorkers()
"""The process's reusable daemon workers, for calls that may be abandoned at a deadline."""


def in_daemon_worker(function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """``function(*args)`` on a daemon worker, to await: one abandoned at its deadline never holds up the loop's exit.

    (``asyncio.to_thread`` uses the loop's executor, whose threads
    ``asyncio.run`` waits for when it closes.)
    """
    import asyncio

    return asyncio.wrap_future(WORKERS.submit(lambda: function(*args)))


WAKE = 0.25
"""Seconds a caller waiting for a worker sleeps at most before it looks at pending signals (a Ctrl-C)."""


class Handoff(Generic[T]):
    """``work()`` running on a daemon worker: ``wait`` for it as long as you like, then take its ``result``.

    The caller waits on one lock the worker releases.  A ``Future`` waits on
    a condition instead, whose lock the woken caller must take back from the
    worker: that second wake-up doubled the cost of each hand-off
    (``make bench``).
    """

    __slots__ = ("_done", "_outcome")

    def __init__(self, work: Callable[[], T]) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._outcome: tuple[T, None] | tuple[None, BaseException] | None = None

        def report() -> None:
            try:
                self._outcome = (work(), None)
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread by result()
                self._outcome = (None, exc)
            finally:
                self._done.release()

        WORKERS.start(report)

    def wait(self, timeout: float | None) -> bool:
        """Wait until the work ended (True) or ``timeout`` seconds passed (False); None waits as long as it takes.

        In slices of at most ``WAKE`` seconds: a Ctrl-C the OS handed another
        thread (the worker's) is run by Python in the main thread only when it
        next runs Python code, so a caller blocked for the whole wait would
        take it only once the work ended, and the work would go on meanwhile.
        """
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAKE if end is None else min(WAKE, max(end - time.monotonic(), 0.0))
            if self._done.acquire(timeout=left):
                self._done.release()  # so a later wait() or result() sees it ended too
                return True
            if end is not None and time.monotonic() >= end:
                return False

    def result(self) -> T:
        """What the ended work returned; what it raised is raised here."""
        self.wait(None)
        value, error = self._outcome  # type: ignore[misc]  # wait() returned, so the work reported
        if error is not None:
            raise error
        return value  # type: ignore[return-value]  # no error, so work() returned it


def within_deadline(work: Callable[[], T], timeout: float, name: str) -> T:
    """``work()`` on a daemon worker, abandoned with ``DeadlineError`` once ``timeout`` seconds pass.

    Python cannot kill a thread, so an abandoned ``work`` runs on; its outcome
    is dropped.  Whatever ``work`` raises in time is raised here.
    """
    handoff = Handoff(work)
    if not handoff.wait(timeout):
        raise DeadlineError(f"{name} still running after {timeout:g} s")
    return handoff.result()


async def awaited_within(work: Awaitable[T], timeout: float, name: str) -> T:
    """``await work``, given up with ``DeadlineError`` once ``timeout`` seconds pass: ``within_deadline`` on a loop.

    A ``TimeoutError`` the work raised itself is raised as it is: only the
    deadline's own expiry is the ``DeadlineError``.
    """
    import asyncio

    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await work
    except TimeoutError:
        if not deadline.expired():
            raise
        raise DeadlineError(f"{name} still running after {timeout:g} s") from None


def call_with_deadline(function: ToolFunction, arguments: dict[str, Any], timeout: float, name: str) -> Any:
    """``call_sync`` of a tool, abandoned with ``DeadlineError`` once ``timeout`` seconds pass."""
    return within_deadline(lambda: call_sync(function, arguments), timeout, f"tool {name}")


def started(function: ToolFunction, arguments: dict[str, Any], timeout: float | None) -> Awaitable[Any]:
    """The call of a tool as something to await: an async tool itself, a sync one on a worker thread.

    With a ``timeout``, or in a run with a deadline, the thread is a daemon
    worker, so one abandoned at its deadline never holds up the event loop's
    exit.
    """
    if inspect.iscoroutinefunction(function):
        return function(**arguments)  # type: ignore[no-any-return]
    if timeout is None and not under_deadline():
        import asyncio

        return asyncio.to_thread(call_in_thread, function, arguments)
    return in_daemon_worker(call_in_thread, function, arguments)
