"""One MCP session on an event loop in a thread of its own; tool calls from any thread or loop are handed to it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import re
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple, cast

import anyio
import mcp_types
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from fsm_agent.mcp.results import failure, result_bytes, too_large, tool_message
from fsm_agent.tools import ToolResult


def _unknown() -> str | None:
    return None


class Streams(NamedTuple):
    """What a transport hands the session: its two streams, and what it knows of how the server ended.

    ``ended`` says why the server went away (once it has); ``stopped`` says
    what became of it once the client stopped it (a stdio server's exit
    code and stderr), which is how a start-up that timed out ends.  Each is
    None when unknown.
    """

    read: Any
    write: Any
    ended: Callable[[], str | None] = _unknown
    stopped: Callable[[], str | None] = _unknown


class StartupTimeoutError(ConnectionError, TimeoutError):
    """A server that did not start, answer the handshake or list its tools within ``startup_timeout`` seconds.

    A ``ConnectionError``, as every failure to connect is, and a
    ``TimeoutError``, so either ``except`` catches it; by the time it is
    raised the server was stopped (a stdio server's process ended).
    """


_WAITED_FOR = {
    "open": "it could not be started or reached",
    "initialize": "it did not answer the initialize request",
    "list": "it answered the initialize request but not the tools/list request",
}
"""What did not come, by the step start-up had reached when its time ran out."""

_WENT_AWAY = {
    "open": "it went away as it started",
    "initialize": "it went away before answering the initialize request",
    "list": "it went away before answering the tools/list request",
}
"""What was awaited when the connection was lost, by the step start-up had reached."""


Opener = Callable[[], AbstractAsyncContextManager[Any]]
"""Opens a transport and yields its ``Streams`` (or any ``(read stream, write stream, ...)``)."""

CLOSE_WAIT = 10.0
"""Seconds ``close`` waits for the connection's thread (a stdio server gets 2 to exit, then 2 after SIGTERM)."""

_LOST = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError, ConnectionError)
"""Exceptions that mean the connection itself is gone, not that one call went wrong."""

_EVENT_TOO_LARGE = re.compile(r"exceeded the \d+ byte limit")
"""How the SDK's HTTP transport says an event went over ``max_sse_event_size`` (it ends only that request)."""


def describe(exc: BaseException) -> str:
    """One line for an exception, looking through the single-exception groups anyio wraps errors in.

    A message of several lines (a pydantic ``ValidationError`` names the bad
    field on a line of its own) is joined with ``"; "``, so nothing is cut.
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, MCPError):
        return exc.error.code == mcp_types.CONNECTION_CLOSED
    if isinstance(exc, BaseExceptionGroup):
        return any(_connection_lost(inner) for inner in exc.exceptions)
    return isinstance(exc, _LOST)


class Connection:
    """One MCP session on an event loop in a thread of its own; tool calls from any thread or loop are handed to it."""

    def __init__(
        self, source: str, opener: Opener, max_result_bytes: int | None, startup_timeout: float | None = None
    ) -> None:
        self.source = source
        self._opener = opener
        self._cap = max_result_bytes
        self._startup_timeout = startup_timeout
        self._ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: ClientSession | None = None
        self._stop: asyncio.Event | None = None
        self._ended: Callable[[], str | None] = _unknown
        self._stopped: Callable[[], str | None] = _unknown
        self._step = "open"
        self._lock = threading.Lock()
        self._abandoned = False
        self._startup: tuple[asyncio.AbstractEventLoop, anyio.CancelScope] | None = None
        self._thread = threading.Thread(target=self._serve, name=f"fsm_agent {source}", daemon=True)
        self.gone: str | None = None
        """Why the connection is gone, once it is; every later call fails with it, unsent."""

    def open(self) -> list[Any]:
        """Start the connection's thread, and return the server's tools once the session is initialized.

        Interrupted while waiting (``KeyboardInterrupt``, ``SystemExit``), it
        stops the start-up (and the server) and raises what interrupted it, as
        it is.
        """
        self._thread.start()
        try:
            return self._ready.result()
        except BaseException as exc:
            if not self._ready.done() or self._ready.exception() is not exc:  # the wait itself was interrupted
                self.abandon()
                raise
            self._thread.join(CLOSE_WAIT)
            if isinstance(exc, StartupTimeoutError):
                raise
            # How the server ended says why only when the connection was lost; otherwise the client gave up on it
            # (a listing it refused, say) and stopped the server itself.
            ended = self._ended() if _connection_lost(exc) else None
            why = f"{_WENT_AWAY[self._step]}: {ended}" if ended else describe(exc)
            msg = f"could not connect to {self.source}: {why}"
            raise ConnectionError(msg) from exc

    def abandon(self) -> None:
        """Stop the start-up, or the session it has just opened, from any thread, and wait for the thread to end."""
        self.gone = self.gone or "the connection was abandoned while it started"
        with self._lock:
            self._abandoned = True
            startup = self._startup
        if startup is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                startup[0].call_soon_threadsafe(startup[1].cancel)
        if self._thread.is_alive():
            self._thread.join(CLOSE_WAIT)

    def close(self) -> None:
        """End the session (the transport stops a stdio server) and wait for the thread; later calls fail unsent."""
        self.gone = self.gone or "the connection was closed"
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended with the session
                loop.call_soon_threadsafe(stop.set)
        if self._thread.is_alive():
            self._thread.join(CLOSE_WAIT)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        """The session, start-up bounded by ``startup_timeout``: process or connection, handshake, first listing."""
        deadline = math.inf if self._startup_timeout is None else anyio.current_time() + self._startup_timeout
        scope = anyio.CancelScope(deadline=deadline)
        with self._lock:
            self._startup = (asyncio.get_running_loop(), scope)
            if self._abandoned:
                scope.cancel()
        failed: BaseException | None = None
        try:
            with scope:
                async with self._opener() as streams:
                    if isinstance(streams, Streams):
                        self._ended, self._stopped = streams.ended, streams.stopped
                    self._step = "initialize"
                    async with ClientSession(streams[0], streams[1]) as session:
                        await session.initialize()
                        self._step = "list"
                        tools = await _listed_tools(session)
                        scope.deadline = math.inf  # started: calls have their own deadlines
                        self._loop, self._session, self._stop = asyncio.get_running_loop(), session, asyncio.Event()
                        self._ready.set_result(tools)
                        await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits: the opener, or the next call
            failed = exc
        if not self._ready.done():
            self._ready.set_exception(self._not_started(scope, failed))
        elif failed is not None:
            self.gone = self.gone or f"the session ended: {self._ended() or describe(failed)}"

    def _not_started(self, scope: anyio.CancelScope, failed: BaseException | None) -> BaseException:
        """Why start-up ended without a session: the start-up timeout, an abandoned start, or what went wrong."""
        if scope.cancel_called and not self._abandoned:
            seconds = self._startup_timeout
            stopped = self._stopped()
            what = f"it was stopped: {stopped}" if stopped else "the connection was closed"
            said = f"{_WAITED_FOR[self._step]} within {seconds:g} s (startup_timeout={seconds!r}); {what}"
            error = StartupTimeoutError(f"could not connect to {self.source}: {said}")
            error.__cause__ = failed
            return error
        if failed is None:
            return ConnectionError(f"could not connect to {self.source}: the start-up was abandoned")
        return failed

    async def call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> ToolResult:
        """Call the server's tool ``name`` with ``meta`` as the request's ``_meta``.

        Every outcome but a real cancellation of the caller is a ``ToolResult``.
        """
        if self.gone is not None:
            return failure(f"{self.source} is gone ({self.gone}); the call to {name!r} was not sent")
        loop, session = self._loop, self._session
        if loop is None or session is None:
            return failure(f"{self.source} is not connected; the call to {name!r} was not sent")
        try:
            sent = session.call_tool(name, arguments, meta=cast("mcp_types.RequestParamsMeta", meta))
            future = asyncio.run_coroutine_threadsafe(sent, loop)
        except RuntimeError as exc:  # the connection's loop has ended
            return self._lost(name, exc)
        try:
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the caller was cancelled; wrap_future has cancelled the request too
            return self._lost(name, exc)
        except Exception as exc:  # noqa: BLE001 - the server's or the transport's fault is data for the model
            refused = self._refused(name, exc)
            if refused is not None:
                return refused
            if _connection_lost(exc) or not self._thread.is_alive():
                return self._lost(name, exc)
            return failure(f"{self.source}: the call to {name!r} failed: {describe(exc)}")
        if self._cap is not None and (size := result_bytes(result)) > self._cap:
            return too_large(self.source, name, self._cap, size)
        return tool_message(result)

    def _refused(self, name: str, exc: Exception) -> ToolResult | None:
        """The failure of a call whose result a transport stopped reading at the cap; None for any other error."""
        if self._cap is None or not isinstance(exc, MCPError):
            return None
        data = exc.error.data
        if isinstance(data, dict) and data.get("max_result_bytes") == self._cap:  # the stdio transport's refusal
            size = data.get("size")
            return too_large(self.source, name, self._cap, size if isinstance(size, int) else None)
        if _EVENT_TOO_LARGE.search(exc.error.message):
            return too_large(self.source, name, self._cap)
        return None

    def _lost(self, name: str, exc: BaseException) -> ToolResult:
        why = f"{self._ended() or describe(exc)}, during the call to {name!r}"
        self.gone = self.gone or why
        return failure(f"{self.source} stopped answering ({why}); later calls to it fail without being sent")


async def _listed_tools(session: ClientSession) -> list[Any]:
    """Every tool the server lists, following its pagination cursor."""
    tools: list[Any] = []
    cursor: str | None = None
    while True:
        params = None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor)
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools
