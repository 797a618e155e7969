"""Connecting to an MCP server is bounded by ``startup_timeout``: real server processes that never answer, or die.

``tests/support/mcp_startup_server.py`` holds the servers that go wrong (no
SDK, so each starts in about 0.04 s here), and writes its pid, so a test can
check the process is gone; ``tests/support/mcp_server.py`` is the real SDK
server for the path that works.  Each promise is checked through ``with`` and
``async with`` (and ``Agent.run`` and ``Agent.arun`` where a tool is called).
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support.sdk import skip_unless_installed

from fsm_agent import Agent
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

skip_unless_installed("mcp", reason="the mcp extra is not installed: pip install -e '.[mcp]'")

if TYPE_CHECKING:
    from fsm_agent.mcp import McpTools

SUPPORT = Path(__file__).resolve().parents[1] / "support"
STARTUP = SUPPORT / "mcp_startup_server.py"
SDK_SERVER = SUPPORT / "mcp_server.py"
DRIVERS = ["sync", "async"]

SHORT = 1.0
"""The start-up timeout of the tests that expect it to expire: their servers never answer, so any figure would do."""

BOUND = 30.0
"""How long such a test may take: SHORT, then at most 2 s for the server to exit once its stdin closes and 2 s after
SIGTERM (the package's grace), so 30 s is over five times that, for a busy machine.  A server that never answers
would keep a connection without a timeout waiting for ever, so returning at all shows it did not wait for it."""

SDK_STARTUP = 60.0
"""The start-up timeout given the SDK's server: it was up in 1.4-1.7 s here (mostly importing the SDK), so 60 s is
over 35 times that."""


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The folder a start-up server writes its pid and what it was asked into."""
    return tmp_path


def server(mode: str, state: Path, **options: Any) -> McpTools:
    from fsm_agent.mcp import stdio_tools

    return stdio_tools(sys.executable, [str(STARTUP), mode, str(state)], errlog=io.StringIO(), **options)


def asked(state: Path) -> dict[str, int]:
    path = state / "asked.json"
    return json.loads(path.read_text()) if path.exists() else {}


def enter(tools: McpTools, driver: str) -> list[str]:
    """Enter the block the way ``driver`` does and return the tools' names."""
    if driver == "sync":
        with tools as registry:
            return list(registry)

    async def entered() -> list[str]:
        async with tools as registry:
            return list(registry)

    return asyncio.run(entered())


def failure(tools: McpTools, driver: str) -> tuple[BaseException, float]:
    """What entering the block raised, and how long it took."""
    started = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        enter(tools, driver)
    return info.value, time.monotonic() - started


def gone(pid: int) -> bool:
    """Whether the process has ended and been reaped (a zombie still has its /proc entry)."""
    return not Path(f"/proc/{pid}").exists()


def connection_threads(tools: McpTools) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == f"fsm_agent {tools.source}"]


def assert_nothing_left(tools: McpTools, state: Path) -> None:
    """The server process is gone, and so is the connection's thread (its event loop ran and closed there)."""
    pid = int((state / "pid").read_text())
    assert gone(pid), f"the server process {pid} is still there"
    assert connection_threads(tools) == []


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_server_that_never_answers_initialize_fails_at_startup_timeout_and_is_stopped(
    state: Path, driver: str
) -> None:
    """A clear error naming the server, the timeout and the missing answer; the process is stopped, nothing left."""
    from fsm_agent.mcp import StartupTimeoutError

    tools = server("silent", state, startup_timeout=SHORT)
    error, took = failure(tools, driver)
    assert took < BOUND
    assert isinstance(error, StartupTimeoutError)
    assert isinstance(error, TimeoutError)
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"could not connect to {tools.source}: ")
    assert "it did not answer the initialize request within 1 s (startup_timeout=1.0)" in message
    assert "it was stopped: the server process exited with code 0" in message  # once its stdin was closed
    assert message.endswith("the last lines of its stderr: silent server: waiting for a licence key")
    assert asked(state) == {"initialize": 1}
    assert_nothing_left(tools, state)


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_server_that_ignores_its_stdin_closing_is_terminated(state: Path, driver: str) -> None:
    """One that neither answers nor reads is ended with SIGTERM after its grace, and the error says so."""
    tools = server("deaf", state, startup_timeout=SHORT)
    error, took = failure(tools, driver)
    assert took < BOUND
    assert "did not answer the initialize request within 1 s" in str(error)
    assert "the server process was killed by SIGTERM" in str(error)
    assert_nothing_left(tools, state)


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_server_that_never_lists_its_tools_fails_at_startup_timeout(state: Path, driver: str) -> None:
    """The first tools/list is part of start-up too: the error names it as what did not come."""
    tools = server("unlisted", state, startup_timeout=SHORT)
    error, took = failure(tools, driver)
    assert took < BOUND
    assert "it answered the initialize request but not the tools/list request within 1 s" in str(error)
    assert asked(state) == {"initialize": 1, "notifications/initialized": 1, "tools/list": 1}
    assert_nothing_left(tools, state)


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_server_dying_mid_handshake_is_reported_at_once_with_its_stderr(state: Path, driver: str) -> None:
    """No wait for the timeout: the error says the server went away during initialize, its exit code and stderr."""
    from fsm_agent.mcp import StartupTimeoutError

    tools = server("dies", state, startup_timeout=120.0)
    error, took = failure(tools, driver)
    assert took < BOUND  # against a timeout of 120 s
    assert not isinstance(error, StartupTimeoutError)
    message = str(error)
    assert f"could not connect to {tools.source}: it went away before answering the initialize request: " in message
    assert "the server process exited with code 5" in message
    assert message.endswith("waiting for a licence key | fatal: cannot open the database /nonexistent/db")
    assert asked(state) == {"initialize": 1}
    assert_nothing_left(tools, state)


def _tool_run(driver: str, tools: McpTools, model: FakeModel) -> str:
    """A run that calls one of the server's tools, on ``driver``, with the block entered the same way."""
    if driver == "sync":
        with tools as registry:
            return str(Agent(model, registry).run("go").final)

    async def run() -> str:
        async with tools as registry:
            result = await Agent(model, registry).arun("go")
            return str(result.final)

    return asyncio.run(run())


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_the_timeout_ends_with_startup_a_call_may_take_longer(state: Path, driver: str) -> None:
    """Once the tools are listed the deadline is lifted: a 3 s call on a server given 2 s to start is answered.

    The server starts in about 0.04 s here, so 2 s is 50 times that.
    """
    model = FakeModel(tool_turn(tool_call("wait", seconds=3.0)), reply("done"))
    assert _tool_run(driver, server("slow", state, startup_timeout=2.0), model) == "done"
    assert len(model.seen) == 2
    assert model.seen[1][-1].content == "waited"
    tool_calls = {key: n for key, n in asked(state).items() if key.startswith(("tools/call", "call "))}
    assert list(tool_calls.values()) == [1, 1]  # one tools/call, counted once by its request id


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("timeout", ["default", SDK_STARTUP])
def test_an_sdk_server_works_with_the_timeout_in_place(tmp_path: Path, driver: str, timeout: Any) -> None:
    """The normal path: the SDK's server starts, lists, and its tool runs exactly once per call."""
    from fsm_agent.mcp import stdio_tools

    counts = tmp_path / "counts.json"
    options = {} if timeout == "default" else {"startup_timeout": timeout}
    tools = stdio_tools(sys.executable, [str(SDK_SERVER)], {"FSM_AGENT_TEST_COUNTS": str(counts)}, **options)
    model = FakeModel(tool_turn(tool_call("bump", key="once")), reply("done"))
    assert _tool_run(driver, tools, model) == "done"
    assert len(model.seen) == 2
    assert json.loads(counts.read_text()) == {"once": 1}
    assert connection_threads(tools) == []


BAD = [
    (0, ValueError, "got 0"),
    (-1.5, ValueError, "got -1.5"),
    (math.nan, ValueError, "got nan"),
    (math.inf, ValueError, "None to wait without limit, got inf"),
    ("10", TypeError, "got '10'"),
    (True, TypeError, "got True"),
]


@pytest.mark.parametrize(("value", "kind", "said"), BAD, ids=[repr(case[0]) for case in BAD])
@pytest.mark.parametrize("entry", ["stdio_tools", "http_tools"])
def test_a_bad_startup_timeout_is_refused_before_anything_starts(
    state: Path, value: Any, kind: type[Exception], said: str, entry: str
) -> None:
    """Zero, negative, NaN, infinite or not a number: refused when the tools are asked for, no process started."""
    import fsm_agent.mcp as mcp

    def ask() -> object:
        if entry == "stdio_tools":
            return mcp.stdio_tools(sys.executable, [str(STARTUP), "silent", str(state)], startup_timeout=value)
        return mcp.http_tools("http://127.0.0.1:9/mcp", startup_timeout=value)

    with pytest.raises(kind, match="startup_timeout must be a number of seconds > 0") as info:
        ask()
    assert str(info.value).endswith(said)
    assert not (state / "pid").exists()


def test_none_waits_without_limit_and_is_accepted() -> None:
    """``None`` is the one way to ask for no limit (as ``max_result_bytes=None`` is no cap); nothing starts yet."""
    from fsm_agent.mcp import http_tools, stdio_tools

    assert stdio_tools("no-such-mcp-server", startup_timeout=None).source == "MCP server 'no-such-mcp-server'"
    assert http_tools("http://127.0.0.1:9/mcp", startup_timeout=None).source == "MCP server http://127.0.0.1:9/mcp"


def _when_started(state: Path, then: Callable[[], None]) -> threading.Thread:
    """A thread that waits for the server to write its pid, then calls ``then``."""

    def watch() -> None:
        deadline = time.monotonic() + SDK_STARTUP
        while not (state / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        then()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


@pytest.fixture
def interruptible() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the main thread for this test, whatever handler was there before."""
    assert threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.subprocess
@pytest.mark.usefixtures("interruptible")
def test_ctrl_c_during_startup_propagates_and_stops_the_server(state: Path) -> None:
    """KeyboardInterrupt while waiting for the handshake is raised as it is, and the start-up is stopped with it."""
    tools = server("silent", state)  # the default timeout, 30 s, is never reached
    watcher = _when_started(state, lambda: os.kill(os.getpid(), signal.SIGINT))
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), tools:
        pass
    watcher.join()
    assert time.monotonic() - started < BOUND
    assert_nothing_left(tools, state)


@pytest.mark.subprocess
def test_cancelling_async_startup_stops_the_server(state: Path) -> None:
    """A task cancelled in ``async with`` during start-up is cancelled, and leaves no server, thread or task behind."""
    tools = server("silent", state)  # the default timeout, 30 s, is never reached

    async def main() -> None:
        async def enter_block() -> None:
            async with tools:
                pytest.fail("the block was entered")

        task = asyncio.create_task(enter_block())
        loop = asyncio.get_running_loop()
        _when_started(state, lambda: loop.call_soon_threadsafe(task.cancel))
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [other for other in asyncio.all_tasks() if other is not asyncio.current_task()] == []

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < BOUND
    assert_nothing_left(tools, state)


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_an_http_server_that_never_answers_fails_at_startup_timeout(
    state: Path, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over HTTP too: the error names the URL, the timeout and the request; the connection is closed."""
    import subprocess

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)  # a proxy must never see loopback test traffic

    from fsm_agent.mcp import StartupTimeoutError, http_tools

    listener = subprocess.Popen([sys.executable, str(STARTUP), "http", str(state)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + SDK_STARTUP
        while not (state / "port").exists():
            assert listener.poll() is None, "the listener exited"
            assert time.monotonic() < deadline, "the listener did not start"
            time.sleep(0.01)
        url = f"http://127.0.0.1:{(state / 'port').read_text()}/mcp"
        tools = http_tools(url, startup_timeout=SHORT)
        error, took = failure(tools, driver)
        assert took < BOUND
        assert isinstance(error, StartupTimeoutError)
        assert str(error) == (
            f"could not connect to MCP server {url}: it did not answer the initialize request within 1 s "
            "(startup_timeout=1.0); the connection was closed"
        )
        assert asked(state)["connection"] >= 1
        assert connection_threads(tools) == []
    finally:
        listener.terminate()
        listener.wait(BOUND)
