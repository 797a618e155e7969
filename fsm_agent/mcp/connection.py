"""One MCP session on an event loop in a thread of its own; tool calls from any thread or loop are handed to it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple

import anyio
import mcp_types
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from fsm_agent.mcp.results import failure, result_bytes, too_large, tool_message
from fsm_agent.tools import ToolResult


def _unknown() -> str | None:
    return None


class Streams(NamedTuple):
    """What a transport hands the session: its two streams, and why the server went away once it has (or None)."""

    read: Any
    write: Any
    ended: Callable[[], str | None] = _unknown


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

    def __init__(self, source: str, opener: Opener, max_result_bytes: int | None) -> None:
        self.source = source
        self._opener = opener
        self._cap = max_result_bytes
        self._ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: ClientSession | None = None
        self._stop: asyncio.Event | None = None
        self._ended: Callable[[], str | None] = _unknown
        self._thread = threading.Thread(target=self._serve, name=f"fsm_agent {source}", daemon=True)
        self.gone: str | None = None
        """Why the connection is gone, once it is; every later call fails with it, unsent."""

    def open(self) -> list[Any]:
        """Start the connection's thread, and return the server's tools once the session is initialized."""
        self._thread.start()
        try:
            return self._ready.result()
        except BaseException as exc:
            self._thread.join(CLOSE_WAIT)
            # How the server ended says why only when the connection was lost; otherwise the client gave up on it
            # (a listing it refused, say) and stopped the server itself.
            ended = self._ended() if _connection_lost(exc) else None
            msg = f"could not connect to {self.source}: {ended or describe(exc)}"
            raise ConnectionError(msg) from exc

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
        try:
            async with self._opener() as streams:
                if isinstance(streams, Streams):
                    self._ended = streams.ended
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    tools = await _listed_tools(session)
                    self._loop, self._session, self._stop = asyncio.get_running_loop(), session, asyncio.Event()
                    self._ready.set_result(tools)
                    await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits: the opener, or the next call
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                self.gone = self.gone or f"the session ended: {self._ended() or describe(exc)}"

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call the server's tool ``name``; every outcome but a real cancellation of the caller is a ``ToolResult``."""
        if self.gone is not None:
            return failure(f"{self.source} is gone ({self.gone}); the call to {name!r} was not sent")
        loop, session = self._loop, self._session
        if loop is None or session is None:
            return failure(f"{self.source} is not connected; the call to {name!r} was not sent")
        try:
            future = asyncio.run_coroutine_threadsafe(session.call_tool(name, arguments), loop)
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
