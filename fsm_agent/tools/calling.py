"""How a tool function is actually called: sync or async, in this thread, a worker thread or a loop of its own.

Nothing here classifies an outcome: values and exceptions are handed back as
they are, for the registry to turn into a ``ToolResult``.  The arguments a
tool receives are its own copy (``own_arguments``), so a tool that changes
them cannot change the ``ToolCall`` kept in the run's history.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from fsm_agent.tools.schema import ToolFunction

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


def call_sync(function: ToolFunction, arguments: dict[str, Any]) -> Any:
    """Call a tool from sync code; an awaitable result is run to completion on an event loop of its own."""
    value = function(**arguments)
    if not inspect.isawaitable(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(value))
    # Called from inside a running loop (a sync driver within async code): use a loop on another thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _awaited(value)).result()


def in_daemon_thread(function: ToolFunction, arguments: dict[str, Any], name: str) -> asyncio.Future[Any]:
    """Run a sync tool in a thread of its own, so one abandoned at its deadline never holds up the event loop's exit.

    (``asyncio.to_thread`` uses the loop's executor, whose threads
    ``asyncio.run`` waits for when it closes.)
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def work() -> None:
        try:
            value, error = call_sync(function, arguments), None
        except BaseException as exc:  # noqa: BLE001 - handed back to the loop below
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop may be closed by the time an abandoned call ends
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name=f"fsm_agent tool {name}", daemon=True).start()
    return future


def within_deadline(work: Callable[[], T], timeout: float, name: str) -> T:
    """``work()`` in a daemon thread of its own, abandoned with ``DeadlineError`` once ``timeout`` seconds pass.

    Python cannot kill a thread, so an abandoned ``work`` runs on; its outcome
    is dropped.  Whatever ``work`` raises in time is raised here.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed back to the calling thread below
            outcome["error"] = exc

    worker = threading.Thread(target=run, name=f"fsm_agent {name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise DeadlineError
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value


def call_with_deadline(function: ToolFunction, arguments: dict[str, Any], timeout: float, name: str) -> Any:
    """``call_sync`` of a tool, abandoned with ``DeadlineError`` once ``timeout`` seconds pass."""
    return within_deadline(lambda: call_sync(function, arguments), timeout, f"tool {name}")
