"""The stdio transport: an MCP server as a subprocess, spoken to over its stdin and stdout.

Why not the SDK's ``stdio_client``: it grows a line by string concatenation
and splits all of it again at every chunk, so a 50 MB answer took minutes to
read and held up every message behind it (the call after one that timed out
timed out too); it cannot stop reading a line at a size; and it keeps the
process to itself, so a server that exits at once is only "Connection
closed".  Here a line is cut out in linear time; a line over the cap is
skipped as it arrives, keeping only its ends, and the call it answers fails
instead; and once stdout ends, the exit code and the last lines of stderr say
why.  Shutdown is the SDK's and the spec's: close stdin, wait, then end the
process group.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import re
import signal
from collections.abc import AsyncIterator, Iterator
from typing import NamedTuple, TextIO

import anyio
import mcp_types
from anyio.abc import ByteReceiveStream, ByteSendStream, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from fsm_agent.mcp.connection import Streams

logger = logging.getLogger("fsm_agent.mcp")

_ENDS = 256
"""Bytes kept from each end of a skipped line: enough for its JSON-RPC envelope (``jsonrpc``, ``id``)."""

_GRACE = 2.0
"""Seconds a server gets to exit once its stdin is closed, and again after SIGTERM (the SDK's figures)."""

_EXIT_WAIT = 1.0
"""Seconds to wait, once stdout has ended, for the exit code and the rest of stderr."""

_STDERR_KEPT = 4096
_STDERR_LINES = 5

_PIPE_GONE = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError)

# A skipped line answers a call when it starts like an answer: the Python SDK writes jsonrpc, id, result;
# the TypeScript SDK writes result, jsonrpc, id (so the id is at its end).
_ID = rb'(-?\d+|"(?:[^"\\]|\\.)*")'
_VERSION = rb'(?:\s*"jsonrpc"\s*:\s*"2\.0"\s*,)?'
_ID_FIRST = re.compile(
    rb"\s*\{" + _VERSION + rb'\s*"id"\s*:\s*' + _ID + rb"\s*," + _VERSION + rb'\s*"(?:result|error)"'
)
_ANSWER_FIRST = re.compile(rb"\s*\{" + _VERSION + rb'\s*"(?:result|error)"\s*:')
_ID_LAST = re.compile(rb'"id"\s*:\s*' + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$')
_METHOD_FIRST = re.compile(rb"\s*\{" + _VERSION + rb'(?:\s*"id"\s*:\s*' + _ID + rb"\s*,)?" + _VERSION + rb'\s*"method"')


class Skipped(NamedTuple):
    """A line over the cap: its size and its ends, the rest unread."""

    size: int
    head: bytes
    tail: bytes


class Lines:
    """The server's stdout cut into lines in linear time; a line over ``cap`` bytes keeps only its ends."""

    def __init__(self, cap: int | None) -> None:
        self._cap = cap
        self._line = bytearray()
        self._size = 0
        self._tail = b""
        self._over = False

    def feed(self, chunk: bytes) -> Iterator[bytes | Skipped]:
        """The lines ``chunk`` completes (without their newline), in order."""
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._add(chunk[start:end])
            yield self._take()
            start = end + 1
        self._add(chunk[start:])

    def _add(self, piece: bytes) -> None:
        self._size += len(piece)
        if not self._over and (self._cap is None or self._size <= self._cap):
            self._line += piece
        elif not self._over:  # the line just went over the cap: keep its head, start its tail
            self._over = True
            self._tail = (bytes(self._line[-_ENDS:]) + piece)[-_ENDS:]
            self._line += piece[: max(0, _ENDS - len(self._line))]
            del self._line[_ENDS:]
        else:
            self._tail = (self._tail + piece)[-_ENDS:]

    def _take(self) -> bytes | Skipped:
        line = bytes(self._line)
        taken = Skipped(self._size, line, self._tail) if self._over else line
        self._line, self._size, self._tail, self._over = bytearray(), 0, b"", False
        return taken


def answered_id(skipped: Skipped) -> int | str | None:
    """The id of the request a skipped line answers, when it reads as an answer (see the patterns above)."""
    found = _ID_FIRST.match(skipped.head)
    if found is None and _ANSWER_FIRST.match(skipped.head):
        found = _ID_LAST.search(skipped.tail)
    if found is None:
        return None
    value = json.loads(found.group(1))
    return value if isinstance(value, int | str) else None


def exit_note(code: int | None, stderr: bytes) -> str:
    """One line on how the server process ended: its exit code (or signal) and the last lines of its stderr."""
    if code is None:
        said = "the server process closed its end of the connection but is still running"
    elif code < 0:
        try:
            said = f"the server process was killed by {signal.Signals(-code).name}"
        except ValueError:
            said = f"the server process was killed by signal {-code}"
    else:
        said = f"the server process exited with code {code}"
    text = stderr.decode("utf-8", "replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()][-_STDERR_LINES:]
    return f"{said}; the last lines of its stderr: {' | '.join(lines)}" if lines else f"{said}, with nothing on stderr"


class StdioServer:
    """One run of a server process: the streams the session talks over, and how the process ended once it has."""

    def __init__(self, parameters: StdioServerParameters, errlog: TextIO, max_bytes: int | None) -> None:
        self._parameters = parameters
        self._errlog = errlog
        self._cap = max_bytes
        self._stderr = b""
        self.ended: str | None = None
        """Why the server went away (how the process ended, or what it sent), once it has."""
        self.stopped: str | None = None
        """How the process ended once the client stopped it (its exit code or signal, the end of its stderr)."""

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Streams]:
        """Start the process; on leaving, close its stdin, wait, then end its process group."""
        p = self._parameters
        process = await anyio.open_process(
            [p.command, *p.args], env=get_default_environment() | (p.env or {}), cwd=p.cwd, start_new_session=True
        )
        stdin, stdout, stderr = process.stdin, process.stdout, process.stderr
        if stdin is None or stdout is None or stderr is None:  # pragma: no cover - open_process makes all three pipes
            msg = "the server process was started without pipes"
            raise RuntimeError(msg)
        to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        to_server, from_session = anyio.create_memory_object_stream[SessionMessage](0)
        stderr_done = anyio.Event()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._read_stderr, stderr, stderr_done)
            tasks.start_soon(self._read_stdout, process, stdout, to_session, stderr_done)
            tasks.start_soon(self._write_stdin, process, stdin, from_session, to_session, stderr_done)
            try:
                yield Streams(from_server, to_server, lambda: self.ended, lambda: self.stopped)
            finally:
                with anyio.CancelScope(shield=True):  # a cancelled caller must not leave the server running
                    await _stop(process, stdin, stderr_done)
                    self.stopped = exit_note(process.returncode, self._stderr)
                    for stream in (to_session, from_server, to_server, from_session):
                        stream.close()
                tasks.cancel_scope.cancel()  # a child of the server may still hold a pipe open

    async def _read_stdout(
        self,
        process: Process,
        stdout: ByteReceiveStream,
        sink: MemoryObjectSendStream[SessionMessage | Exception],
        stderr_done: anyio.Event,
    ) -> None:
        lines = Lines(self._cap)
        with contextlib.suppress(*_PIPE_GONE):  # our own shutdown closed the pipe
            async for chunk in stdout:
                for line in lines.feed(chunk):
                    item = self._item(line, sink)
                    if item is not None:
                        # A session that is gone leaves only the draining, so the server can exit.
                        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                            await sink.send(item)
        await self._finish(process, sink, stderr_done)

    def _item(
        self, line: bytes | Skipped, sink: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> SessionMessage | Exception | None:
        """What one line of stdout is for the session: a message, a parse error, or nothing."""
        if isinstance(line, Skipped):
            return self._refusal(line, sink)
        if not line.strip():
            return None
        try:
            return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:  # the session's message handler sees it, as with the SDK's transport
            # A server that prints to its stdout breaks the protocol; say so where someone can see it.
            logger.warning("an MCP server wrote a line that is not a JSON-RPC message: %.120r", line)
            return exc

    def _refusal(
        self, line: Skipped, sink: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> SessionMessage | None:
        """An error answering the call a skipped line answered; a skipped line that answers nothing known is dropped."""
        said = f"{line.size}-byte message over max_result_bytes={self._cap}"
        request_id = answered_id(line)
        if request_id is not None:
            data = {"max_result_bytes": self._cap, "size": line.size}
            error = mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message=f"a {said}", data=data)
            return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
        if _METHOD_FIRST.match(line.head):  # a notification or a request of the server's: no call waits for it
            logger.warning("an MCP server sent a %s that is not an answer; it was dropped", said)
            return None
        # A call may wait for it, and would wait for ever: end the session, so every waiting call fails.
        self.ended = self.ended or f"the server sent a {said} whose request could not be read"
        sink.close()
        return None

    async def _finish(
        self, process: Process, sink: MemoryObjectSendStream[SessionMessage | Exception], stderr_done: anyio.Event
    ) -> None:
        """Note how the server ended, then end the session's stream: the note is there before anyone asks."""
        if self.ended is None:
            with anyio.move_on_after(_EXIT_WAIT):
                await stderr_done.wait()
                while process.returncode is None:
                    await anyio.sleep(0.01)
            self.ended = self.ended or exit_note(process.returncode, self._stderr)
        sink.close()

    async def _write_stdin(
        self,
        process: Process,
        stdin: ByteSendStream,
        source: MemoryObjectReceiveStream[SessionMessage],
        sink: MemoryObjectSendStream[SessionMessage | Exception],
        stderr_done: anyio.Event,
    ) -> None:
        try:
            async with source:
                async for message in source:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send(text.encode() + b"\n")
        except _PIPE_GONE:  # the server stopped reading: say how it ended, if it did, then end the session
            await self._finish(process, sink, stderr_done)

    async def _read_stderr(self, stderr: ByteReceiveStream, done: anyio.Event) -> None:
        """Pass the server's stderr on to ``errlog``, keeping its end for the note on how the server ended."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            with contextlib.suppress(*_PIPE_GONE):
                async for chunk in stderr:
                    self._stderr = (self._stderr + chunk)[-_STDERR_KEPT:]
                    self._echo(decoder.decode(chunk))
            self._echo(decoder.decode(b"", final=True))
        finally:
            done.set()

    def _echo(self, text: str) -> None:
        if text:
            with contextlib.suppress(OSError, ValueError):  # a closed errlog must not end the connection
                self._errlog.write(text)
                self._errlog.flush()


async def _stop(process: Process, stdin: ByteSendStream, stderr_done: anyio.Event) -> None:
    """Close stdin, give the server time to exit, then end its process group; every wait is bounded.

    Once it has exited, what it wrote to stderr last is read before the pipe
    is closed (a child that keeps the pipe open gets ``_EXIT_WAIT``).
    """
    with contextlib.suppress(*_PIPE_GONE):
        await stdin.aclose()
    if not await _exited(process, _GRACE):
        await terminate_posix_process_tree(process, _GRACE)  # POSIX only: stdio_tools uses the SDK's on Windows
        if not await _exited(process, _GRACE):
            logger.warning("MCP server process %d is still alive after SIGKILL; leaving it", process.pid)
    if process.returncode is not None:
        with anyio.move_on_after(_EXIT_WAIT):
            await stderr_done.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            with contextlib.suppress(*_PIPE_GONE):
                await pipe.aclose()


async def _exited(process: Process, within: float) -> bool:
    """Whether the process exited within ``within`` seconds (polled: ``wait`` would also wait for its pipes)."""
    with anyio.move_on_after(within):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None
