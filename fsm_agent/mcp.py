"""Tools from Model Context Protocol servers, as a ``ToolRegistry`` (optional extra: ``pip install 'fsm-agent[mcp]'``).

``with stdio_tools("python", ["server.py"]) as tools:`` starts a server as a
subprocess and talks to it over stdin/stdout; ``http_tools(url)`` connects
to a streamable-HTTP server.  Both are also async context managers.  Either
way the registry holds the server's tools with their names, descriptions
and input schemas exactly as the server lists them (a name providers would
reject has each character other than letters, digits, ``_`` and ``-``
replaced by ``_``; the server still gets its own name).  Merge several into
one registry with ``ToolRegistry.include`` (a clash is a ``ValueError``
naming both sources unless a ``prefix`` is given).

Why a thread: an MCP session is async and bound to the event loop it was
opened on, while the registry's tools are called by the sync driver (no loop,
or a throwaway loop per call) and by the async driver (the caller's loop).
The session therefore lives on an event loop in a thread of its own, and
each tool call is handed to it; one registry then serves both drivers and
any number of runs at once.

What a result becomes (the tool message the model sees):

- ``isError`` is a tool failure, so it counts toward ``tool_failures``: the
  message is ``{"error": <the result's text>}``, as for a local tool's
  failure (and the Anthropic adapter marks it ``is_error``).
- Otherwise the content blocks, in order, one per line: text as it is; an
  image or audio block as ``[image: image/png, 67 bytes]`` (the tool message
  is text, so the bytes are not sent); a resource link as
  ``[resource link: <uri> (<name>)]``; an embedded text resource as its text,
  a binary one as ``[resource <uri>: <mime type>, N bytes]``.
- Structured content is used, as compact JSON, only when there are no
  content blocks: the protocol asks servers to put the same data into a text
  block, and that text is what the server meant a model to read.

A server that dies or stops answering makes the call in flight a tool failure
saying so; every later call to it fails at once with that reason, without
being sent.  A server that cannot be started or connected to is a
``ConnectionError`` when the context manager is entered.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import json
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from fsm_agent.tools import ToolRegistry, ToolResult

try:
    import anyio
    import mcp_types
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client  # the SDK's own client with its MCP timeouts
    from mcp.shared.exceptions import MCPError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    msg = "fsm_agent.mcp needs the mcp package (2.x): pip install 'fsm-agent[mcp]'"
    raise ImportError(msg) from exc

__all__ = ["McpTools", "http_tools", "stdio_tools"]

Opener = Callable[[], AbstractAsyncContextManager[Any]]
"""Opens a transport and yields its (read stream, write stream, ...)."""

_CLOSE_WAIT = 10.0
"""Seconds ``close`` waits for the connection's thread (the SDK's own shutdown of a server takes about 2)."""

_LOST = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError, ConnectionError)
"""Exceptions that mean the connection itself is gone, not that one call went wrong."""

_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def _failure(message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": message}, ensure_ascii=False), message)


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking through the single-exception groups anyio wraps errors in."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, MCPError):
        return exc.error.code == mcp_types.CONNECTION_CLOSED
    if isinstance(exc, BaseExceptionGroup):
        return any(_connection_lost(inner) for inner in exc.exceptions)
    return isinstance(exc, _LOST)


def _byte_count(data: str) -> int:
    try:
        return len(base64.b64decode(data))
    except (binascii.Error, ValueError):
        return len(data)


def _block_text(block: Any) -> str:
    """The text one content block contributes to the tool message (see the module's doc)."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_byte_count(block.data)} bytes]"
    if kind == "resource_link":
        name = getattr(block, "name", None)
        return f"[resource link: {block.uri}" + (f" ({name})]" if name else "]")
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return text
        mime = getattr(resource, "mime_type", None) or "binary"
        return f"[resource {resource.uri}: {mime}, {_byte_count(getattr(resource, 'blob', ''))} bytes]"
    return f"[{kind} content]"


def tool_message(result: Any) -> ToolResult:
    """The ``ToolResult`` of one MCP ``CallToolResult``: its text, and a failure when ``isError`` is set."""
    blocks = list(result.content or ())
    structured = result.structured_content
    if not blocks and structured is not None:
        text = json.dumps(structured, ensure_ascii=False, separators=(",", ":"))
    else:
        text = "\n".join(_block_text(block) for block in blocks)
    if result.is_error:
        return _failure(text or "the MCP tool reported an error without a message")
    return ToolResult(text)


class _Connection:
    """One MCP session on an event loop in a thread of its own; tool calls from any thread or loop are handed to it."""

    def __init__(self, source: str, opener: Opener) -> None:
        self.source = source
        self._opener = opener
        self._ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: ClientSession | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, name=f"fsm_agent {source}", daemon=True)
        self.gone: str | None = None
        """Why the connection is gone, once it is; every later call fails with it, unsent."""

    def open(self) -> list[Any]:
        """Start the connection's thread, and return the server's tools once the session is initialized."""
        self._thread.start()
        try:
            return self._ready.result()
        except BaseException as exc:
            self._thread.join(_CLOSE_WAIT)
            msg = f"could not connect to {self.source}: {_describe(exc)}"
            raise ConnectionError(msg) from exc

    def close(self) -> None:
        """End the session (the SDK stops a stdio server) and wait for the thread; later calls fail unsent."""
        self.gone = self.gone or "the connection was closed"
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended with the session
                loop.call_soon_threadsafe(stop.set)
        if self._thread.is_alive():
            self._thread.join(_CLOSE_WAIT)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        try:
            async with self._opener() as streams, ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                tools = await _listed_tools(session)
                self._loop, self._session, self._stop = asyncio.get_running_loop(), session, asyncio.Event()
                self._ready.set_result(tools)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits: the opener, or the next call
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                self.gone = self.gone or f"the session ended: {_describe(exc)}"

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call the server's tool ``name``; every outcome but a real cancellation of the caller is a ``ToolResult``."""
        if self.gone is not None:
            return _failure(f"{self.source} is gone ({self.gone}); the call to {name!r} was not sent")
        loop, session = self._loop, self._session
        if loop is None or session is None:
            return _failure(f"{self.source} is not connected; the call to {name!r} was not sent")
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
            if _connection_lost(exc) or not self._thread.is_alive():
                return self._lost(name, exc)
            return _failure(f"{self.source}: the call to {name!r} failed: {_describe(exc)}")
        return tool_message(result)

    def _lost(self, name: str, exc: BaseException) -> ToolResult:
        why = f"{_describe(exc)}, during the call to {name!r}"
        self.gone = self.gone or why
        return _failure(f"{self.source} stopped answering ({why}); later calls to it fail without being sent")


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


def _caller(connection: _Connection, name: str) -> Callable[..., Any]:
    async def call_mcp_tool(**arguments: Any) -> ToolResult:
        return await connection.call(name, arguments)

    return call_mcp_tool


class McpTools:
    """A connection to one MCP server; ``with``/``async with`` yields its tools as a ``ToolRegistry``.

    Leaving the block closes the session (and stops a stdio server); tools
    of the registry called after that fail without being sent.
    """

    def __init__(self, source: str, opener: Opener) -> None:
        self.source = source
        self._opener = opener
        self._connection: _Connection | None = None

    def __enter__(self) -> ToolRegistry:
        if self._connection is not None:
            msg = f"the connection to {self.source} is already open; make a new one for another block"
            raise RuntimeError(msg)
        connection = self._connection = _Connection(self.source, self._opener)
        listed = connection.open()
        registry = ToolRegistry(source=self.source)
        try:
            for tool in listed:
                registry.register(
                    _caller(connection, tool.name),
                    name=_BAD_NAME_CHARS.sub("_", tool.name)[:64],
                    description=tool.description or "",
                    parameters=tool.input_schema,
                )
        except BaseException:
            connection.close()
            raise
        return registry

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._connection is not None:
            self._connection.close()

    async def __aenter__(self) -> ToolRegistry:
        return await asyncio.to_thread(self.__enter__)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.__exit__, exc_type, exc, tb)


def stdio_tools(
    command: str,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    cwd: str | Path | None = None,
    errlog: TextIO | None = None,
) -> McpTools:
    """The tools of an MCP server started as ``command args...``, spoken to over its stdin and stdout.

    ``env`` is added to the SDK's small default environment (``PATH``,
    ``HOME`` and the like; the server does not inherit everything).  The
    server's stderr goes to ``errlog`` (default ``sys.stderr``).
    """
    parameters = StdioServerParameters(
        command=command, args=list(args), env=None if env is None else dict(env), cwd=cwd
    )
    log = sys.stderr if errlog is None else errlog

    def open_stdio() -> AbstractAsyncContextManager[Any]:
        return stdio_client(parameters, errlog=log)

    return McpTools(f"MCP server {' '.join([command, *args])!r}", open_stdio)


def http_tools(url: str, headers: Mapping[str, str] | None = None) -> McpTools:
    """The tools of an MCP server at ``url`` (streamable HTTP); ``headers`` go with every request (auth, ...)."""
    sent = dict(headers or {})

    @contextlib.asynccontextmanager
    async def open_http() -> AsyncIterator[Any]:
        async with (
            create_mcp_http_client(headers=sent) as client,
            streamable_http_client(url, http_client=client) as streams,
        ):
            yield streams

    return McpTools(f"MCP server {url}", open_http)
