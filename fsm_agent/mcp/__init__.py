"""Tools from Model Context Protocol servers, as a ``ToolRegistry`` (optional extra: ``pip install 'fsm-agent[mcp]'``).

``with stdio_tools("python", ["server.py"]) as tools:`` starts a server as a
subprocess and talks to it over stdin/stdout; ``http_tools(url)`` connects
to a streamable-HTTP server.  Both are also async context managers.  Either
way the registry holds the server's tools with their descriptions and input
schemas exactly as the server lists them, and their names too when providers
accept them (1-64 letters, digits, ``_`` and ``-``).  Any other name has each
other character replaced by ``_``; one that is then too long or another
tool's name gets a hash suffix instead (``fsm_agent.mcp.names`` has the rule),
with a warning on the ``fsm_agent.mcp`` logger.  The server is always called
by its own name.  Merge several into one registry with
``ToolRegistry.include`` (a clash is a ``ValueError`` naming both sources
unless a ``prefix`` is given).

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
- A result over ``max_result_bytes`` (default ``DEFAULT_MAX_RESULT_BYTES``,
  10 MiB) is a tool failure saying so, and the session goes on.  Over stdio
  the rest of its line is skipped unread; over HTTP the SDK stops reading an
  event at the cap, and a plain JSON answer is checked once read.

A server that dies or stops answering makes the call in flight a tool failure
saying so (for a stdio server: its exit code and the last lines of its
stderr); every later call to it fails at once with that reason, without
being sent.  A server that cannot be started or connected to is a
``ConnectionError`` when the context manager is entered, one line long (a
stdio server that exits at once: its exit code and the last lines of its
stderr).  Start-up (the process started or the server reached, the
``initialize`` handshake, the first ``tools/list``) is bounded by
``startup_timeout`` (default ``DEFAULT_STARTUP_TIMEOUT``, 30 s; ``None``
waits without limit): a server that does not answer in time is stopped and
the block raises ``StartupTimeoutError`` (a ``ConnectionError`` and a
``TimeoutError``) saying what did not come.  A ``KeyboardInterrupt`` or a
cancelled task during start-up stops it too, and is raised as it is.

Each call's request names the run, its start and the call in its ``_meta``
(``RUN_ID_KEY``, ``START_ID_KEY``, ``CALL_ID_KEY``): a call cut in flight and
made again when the run is resumed carries the same three, so a server can
key its effect by them and make it once, as a local tool does with its
``call_id`` parameter; a run started again under its id has a new start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from fsm_agent.tools import RunContext, ToolRegistry, ToolResult

try:
    from mcp import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client  # the SDK's own client with its MCP timeouts
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    msg = "fsm_agent.mcp needs the mcp package (2.x): pip install 'fsm-agent[mcp]'"
    raise ImportError(msg) from exc

from fsm_agent.mcp.connection import Connection, Opener, StartupTimeoutError, Streams
from fsm_agent.mcp.names import provider_names, replaced
from fsm_agent.mcp.results import tool_message
from fsm_agent.mcp.stdio import StdioServer

__all__ = [
    "CALL_ID_KEY",
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_STARTUP_TIMEOUT",
    "RUN_ID_KEY",
    "START_ID_KEY",
    "McpTools",
    "StartupTimeoutError",
    "http_tools",
    "stdio_tools",
    "tool_message",
]

DEFAULT_MAX_RESULT_BYTES = 10 * 1024 * 1024
"""The default cap on one result, 10 MiB: room for a large screenshot in base64, and read in a fraction of a second.

The registry's ``max_output_chars`` then cuts what the model sees; this cap
bounds what is read at all.
"""

DEFAULT_STARTUP_TIMEOUT = 30.0
"""Seconds a server gets to start, answer the handshake and list its tools: the SDK's own server took 1.5 s here.

A server that downloads something first (``npx`` a package, say) may need
more; pass ``startup_timeout=`` then.
"""

logger = logging.getLogger("fsm_agent.mcp")


def _max_result_bytes(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        msg = f"max_result_bytes must be an integer >= 1, or None for no cap, got {value!r}"
        raise ValueError(msg)
    return value


def _startup_timeout(value: Any) -> float | None:
    """Seconds > 0 and finite, or None; anything else is refused before any process starts or anything is sent."""
    if value is None:
        return None
    said = f"startup_timeout must be a number of seconds > 0, or None to wait without limit, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(said)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(said)
    return float(value)


def _args(args: Any) -> list[str]:
    """The server's arguments as a list of strings, or a TypeError before any process starts.

    A str is itself a sequence of str: ``"server.py"`` would start the
    command with the arguments ``s e r v e r . p y``.
    """
    listed = None if isinstance(args, (str, bytes)) or not isinstance(args, Iterable) else list(args)
    if listed is None or not all(isinstance(arg, str) for arg in listed):
        msg = f'args must be a list of strings (one per argument, as in ["server.py"]), got {args!r}'
        raise TypeError(msg)
    return listed


def _caller(connection: Connection, name: str, schema: Mapping[str, Any]) -> Callable[..., Any]:
    """The registry's function for the server's tool ``name``: it sends the call with the run's and the call's ids.

    A tool whose own schema has a property named as the context parameter
    (``CONTEXT``) is sent without them, its argument as it is.
    """
    if CONTEXT in (schema.get("properties") or {}):
        message = "%s: tool %r has an argument named %r, so its calls carry no run or call ids"
        logger.warning(message, connection.source, name, CONTEXT)

        async def call_mcp_tool_unkeyed(**arguments: Any) -> ToolResult:
            return await connection.call(name, arguments, {})

        return call_mcp_tool_unkeyed

    async def call_mcp_tool(_fsm_agent_context: RunContext[Any], **arguments: Any) -> ToolResult:
        return await connection.call(name, arguments, call_keys(_fsm_agent_context))

    return call_mcp_tool


CONTEXT = "_fsm_agent_context"
"""The name of the ``RunContext`` parameter each server tool's function declares (``_caller``)."""


def call_keys(context: RunContext[Any]) -> dict[str, Any]:
    """The request ``_meta`` naming the run, its start and the call: the same when a resume makes a cut call again.

    A server keys an effect by the three (a call id is unique only within
    one start of its run) to make it once (``docs/how-to/mcp.md``).
    """
    keys = {RUN_ID_KEY: context.run_id, START_ID_KEY: context.start_id, CALL_ID_KEY: context.call_id}
    return {key: value for key, value in keys.items() if value}


RUN_ID_KEY = "fsm-agent/run_id"
"""The ``_meta`` key of each tool call's request that holds the run's id (none for a run without one)."""
START_ID_KEY = "fsm-agent/start_id"
"""The ``_meta`` key that holds the run's start (``RunContext.start_id``): new when a run starts again under its id."""
CALL_ID_KEY = "fsm-agent/call_id"
"""The ``_meta`` key of each tool call's request that holds the call's id (``ToolCall.id``)."""


class McpTools:
    """A connection to one MCP server; ``with``/``async with`` yields its tools as a ``ToolRegistry``.

    Leaving the block closes the session (and stops a stdio server); tools
    of the registry called after that fail without being sent.  A result
    over ``max_result_bytes`` (``None``: no cap) fails its call.  Entering
    waits ``startup_timeout`` seconds at most (``None``: no limit) for the
    server's tools, then raises ``StartupTimeoutError``.
    """

    def __init__(
        self,
        source: str,
        opener: Opener,
        *,
        max_result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES,
        startup_timeout: float | None = DEFAULT_STARTUP_TIMEOUT,
    ) -> None:
        self.source = source
        self._opener = opener
        self._max_result_bytes = _max_result_bytes(max_result_bytes)
        self._startup_timeout = _startup_timeout(startup_timeout)
        self._connection: Connection | None = None

    def __enter__(self) -> ToolRegistry:
        return self._enter(self._begin())

    def _begin(self) -> Connection:
        """The block's connection, not yet open; a second block on the same object is refused."""
        if self._connection is not None:
            msg = f"the connection to {self.source} is already open; make a new one for another block"
            raise RuntimeError(msg)
        self._connection = Connection(self.source, self._opener, self._max_result_bytes, self._startup_timeout)
        return self._connection

    def _enter(self, connection: Connection) -> ToolRegistry:
        """Open ``connection`` and register the server's tools (blocking: the async side runs it on a thread)."""
        listed = connection.open()
        registry = ToolRegistry(source=self.source)
        try:
            self._register(registry, connection, listed)
        except BaseException:
            connection.close()
            raise
        return registry

    def _register(self, registry: ToolRegistry, connection: Connection, listed: list[Any]) -> None:
        """Each listed tool under its name for providers (``fsm_agent.mcp.names``); a hash suffix is warned of."""
        first = {tool.name: tool for tool in reversed(listed)}  # a name listed twice: its first listing
        names = provider_names(list(first))
        for tool in listed:
            if first[tool.name] is tool:
                registry.register(
                    _caller(connection, tool.name, tool.input_schema),
                    name=names[tool.name],
                    description=tool.description or "",
                    parameters=tool.input_schema,
                )
        renamed = sorted(f"{old!r} -> {new!r}" for old, new in names.items() if new != replaced(old))
        if len(first) < len(listed):
            renamed.append(f"{len(listed) - len(first)} listed twice (the first listing kept)")
        if renamed:
            logger.warning("%s: tool names made unique for providers: %s", self.source, "; ".join(renamed))

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._connection is not None:
            self._connection.close()

    async def __aenter__(self) -> ToolRegistry:
        """``__enter__`` on a worker thread; a task cancelled meanwhile stops the start-up before it is cancelled.

        Without that, the thread would go on and open a connection nobody
        holds, leaving the server running.
        """
        connection = self._begin()
        entering = asyncio.ensure_future(asyncio.to_thread(self._enter, connection))
        try:
            return await asyncio.shield(entering)
        except asyncio.CancelledError:
            await asyncio.to_thread(connection.abandon)  # the server stopped, the thread ended
            with contextlib.suppress(Exception):
                await entering  # done now: its ConnectionError, or a registry whose connection is closed
            raise

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
    max_result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES,
    startup_timeout: float | None = DEFAULT_STARTUP_TIMEOUT,
) -> McpTools:
    """The tools of an MCP server started as ``command args...``, spoken to over its stdin and stdout.

    ``env`` is added to the SDK's small default environment (``PATH``,
    ``HOME`` and the like; the server does not inherit everything).  The
    server's stderr goes to ``errlog`` (default ``sys.stderr``; any text
    stream), and its last lines explain a server that exits.  A result over
    ``max_result_bytes`` (default ``DEFAULT_MAX_RESULT_BYTES``, 10 MiB;
    ``None`` for no cap) is skipped as it arrives and fails its call.
    Starting the process, the ``initialize`` handshake and the first
    ``tools/list`` must be done within ``startup_timeout`` seconds (``None``:
    no limit), or the process is stopped and entering the block raises
    ``StartupTimeoutError``.
    """
    arguments = _args(args)
    timeout = _startup_timeout(startup_timeout)
    parameters = StdioServerParameters(command=command, args=arguments, env=None if env is None else dict(env), cwd=cwd)
    log = sys.stderr if errlog is None else errlog
    cap = _max_result_bytes(max_result_bytes)

    def open_stdio() -> contextlib.AbstractAsyncContextManager[Any]:
        if sys.platform == "win32":  # pragma: no cover - the SDK's transport ends a process tree with a Job object
            return stdio_client(parameters, errlog=log)  # (no exit code; the cap is checked once a result is read)
        return StdioServer(parameters, log, cap).connect()

    source = f"MCP server {' '.join([command, *arguments])!r}"
    return McpTools(source, open_stdio, max_result_bytes=cap, startup_timeout=timeout)


def http_tools(
    url: str,
    headers: Mapping[str, str] | None = None,
    *,
    max_result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES,
    startup_timeout: float | None = DEFAULT_STARTUP_TIMEOUT,
) -> McpTools:
    """The tools of an MCP server at ``url`` (streamable HTTP); ``headers`` go with every request (auth, ...).

    A result over ``max_result_bytes`` (default ``DEFAULT_MAX_RESULT_BYTES``,
    10 MiB; ``None`` for no cap) fails its call: the SDK stops reading an
    event stream at the cap, and a plain JSON answer is checked once read.
    The ``initialize`` handshake and the first ``tools/list`` must be
    answered within ``startup_timeout`` seconds (``None``: no limit), or
    entering the block raises ``StartupTimeoutError``.
    """
    sent = dict(headers or {})
    cap = _max_result_bytes(max_result_bytes)
    timeout = _startup_timeout(startup_timeout)

    @contextlib.asynccontextmanager
    async def open_http() -> AsyncIterator[Streams]:
        async with (
            create_mcp_http_client(headers=sent) as client,
            streamable_http_client(url, http_client=client, max_sse_event_size=cap) as streams,
        ):
            yield Streams(streams[0], streams[1])

    return McpTools(f"MCP server {url}", open_http, max_result_bytes=cap, startup_timeout=timeout)
