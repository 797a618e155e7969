"""Tools from MCP servers: a real server written with the SDK (``tests/support/mcp_server.py``), over stdio and HTTP.

Nothing of the SDK is mocked: the server runs as a subprocess, and the
client side is ``fsm_agent.mcp`` on the SDK's own client session (over stdio,
on the package's own transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support.sdk import skip_unless_installed

from fsm_agent import Agent, AgentLoopError, ToolCall, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

skip_unless_installed("mcp", reason="the mcp extra is not installed: pip install -e '.[mcp]'")

if TYPE_CHECKING:
    from fsm_agent.mcp import McpTools

SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_server.py"


@pytest.fixture
def counts(tmp_path: Path) -> Path:
    """The file where the server's ``bump`` tool counts its side effects."""
    return tmp_path / "counts.json"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolRegistry]:
    """One stdio connection for the tests that neither kill the server nor count its side effects."""
    with stdio(tmp_path_factory.mktemp("shared") / "counts.json") as tools:
        yield tools


def server_env(counts: Path) -> dict[str, str]:
    return {"FSM_AGENT_TEST_COUNTS": str(counts)}


def stdio(counts: Path) -> McpTools:
    from fsm_agent.mcp import stdio_tools

    return stdio_tools(sys.executable, [str(SERVER)], server_env(counts))


def counted(counts: Path) -> dict[str, int]:
    return json.loads(counts.read_text()) if counts.exists() else {}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@contextlib.contextmanager
def serving_http(counts: Path, *mode: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The test server over streamable HTTP on a loopback port (``mode``: ``json`` for plain JSON answers)."""
    port = _free_port()
    env = {**os.environ, **server_env(counts)}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # uvicorn logs every request
    process = subprocess.Popen([sys.executable, str(SERVER), "http", str(port), *mode], env=env, **quiet)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the MCP test server did not start (exit code {process.poll()})")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy must never see loopback test traffic."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def http_process(counts: Path, no_proxy: None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The test server over streamable HTTP on a loopback port: its MCP endpoint URL and its process."""
    with serving_http(counts) as served:
        yield served


@pytest.fixture
def http_server(http_process: tuple[str, subprocess.Popen[bytes]]) -> str:
    """The HTTP test server's MCP endpoint URL."""
    return http_process[0]


@pytest.mark.subprocess
def test_stdio_registry_holds_the_servers_tools_as_listed(shared: ToolRegistry) -> None:
    """Names, descriptions and input schemas are the server's own, unchanged."""
    tools = shared
    assert list(tools) == ["echo", "add", "forecast", "refuse", "picture", "bump", "crash", "flood"]
    forecast = tools.get("forecast")
    assert forecast is not None
    assert forecast.description == "A made-up forecast, as structured content."
    assert forecast.parameters["properties"]["days"] == {"default": 1, "title": "Days", "type": "integer"}
    assert forecast.parameters["required"] == ["city"]
    assert tools.source == f"MCP server {' '.join([sys.executable, str(SERVER)])!r}"


@pytest.mark.subprocess
def test_text_results_are_the_tool_message_unquoted(shared: ToolRegistry) -> None:
    """Text blocks are the tool message as they are; structured content does not replace the server's text."""
    tools = shared
    assert tools.execute(ToolCall("1", "echo", {"text": "héllo"})).content == "héllo"
    assert tools.execute(ToolCall("2", "add", {"a": 2, "b": 3})).content == "5"
    forecast = tools.execute(ToolCall("3", "forecast", {"city": "Paris"}))
    assert json.loads(forecast.content) == {"city": "Paris", "days": 1, "sky": "clear"}
    picture = tools.execute(ToolCall("4", "picture", {}))
    assert picture.ok
    assert picture.content == "[image: image/png, 67 bytes]"


@pytest.mark.subprocess
def test_is_error_is_a_tool_failure_with_the_servers_text(shared: ToolRegistry) -> None:
    """A result with isError is a failed ToolResult whose message is the registry's error shape."""
    tools = shared
    outcome = tools.execute(ToolCall("1", "refuse", {"why": "not today"}))
    assert not outcome.ok
    assert outcome.error is not None
    assert "not today" in outcome.error
    assert json.loads(outcome.content) == {"error": outcome.error}
    bad = tools.execute(ToolCall("2", "add", {"a": "x"}))  # the server validates its own schema
    assert not bad.ok
    assert "validation error" in (bad.error or "")


@pytest.mark.subprocess
def test_mcp_errors_count_toward_tool_failures(shared: ToolRegistry) -> None:
    """Three failing MCP calls in a row stop the run with tool_failures, the server's text as last_error."""
    model = FakeModel([tool_turn(tool_call("refuse", why=f"no {i}")) for i in range(3)])
    with pytest.raises(AgentLoopError) as info:
        Agent(model, shared, max_consecutive_failures=3).run("go")
    assert info.value.reason == "tool_failures"
    assert "no 2" in info.value.evidence["last_error"]


def test_content_types_map_to_text_as_documented() -> None:
    """Structured content alone, resource links, embedded resources and audio become the documented text."""
    import mcp_types

    from fsm_agent.mcp import tool_message

    only_structured = mcp_types.CallToolResult(content=[], structured_content={"b": 1, "a": "é"})
    assert tool_message(only_structured).content == '{"b":1,"a":"é"}'
    blocks = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(type="text", text="first"),
            mcp_types.ResourceLink(type="resource_link", uri="file:///a.txt", name="a.txt"),
            mcp_types.EmbeddedResource(
                type="resource", resource=mcp_types.TextResourceContents(uri="file:///b.txt", text="inside b")
            ),
            mcp_types.EmbeddedResource(
                type="resource",
                resource=mcp_types.BlobResourceContents(uri="file:///c.bin", blob="AAEC", mime_type="x/bin"),
            ),
            mcp_types.AudioContent(type="audio", data="AAAA", mime_type="audio/wav"),
        ]
    )
    assert tool_message(blocks).content.splitlines() == [
        "first",
        "[resource link: file:///a.txt (a.txt)]",
        "inside b",
        "[resource file:///c.bin: x/bin, 3 bytes]",
        "[audio: audio/wav, 3 bytes]",
    ]
    empty_error = mcp_types.CallToolResult(content=[], is_error=True)
    assert tool_message(empty_error).error == "the MCP tool reported an error without a message"


@pytest.mark.subprocess
def test_a_server_dying_mid_call_fails_that_call_and_later_ones_fast(counts: Path) -> None:
    """The call in flight is a failure naming the server and its exit code; later calls fail at once, unsent."""
    with stdio(counts) as tools:
        lost = tools.execute(ToolCall("1", "crash", {}))
        assert not lost.ok
        assert "stopped answering" in (lost.error or "")
        assert "'crash'" in (lost.error or "")
        assert "the server process exited with code 3" in (lost.error or "")
        started = time.monotonic()
        later = tools.execute(ToolCall("2", "echo", {"text": "anyone?"}))
        assert time.monotonic() - started < 1
        assert "is gone" in (later.error or "")
        assert "was not sent" in (later.error or "")


@pytest.mark.subprocess
def test_a_dead_server_in_a_run_is_a_tool_failure_not_a_crash(counts: Path) -> None:
    """The run goes on after the server dies; its failures stop it with tool_failures."""
    model = FakeModel(tool_turn(tool_call("crash")), tool_turn(tool_call("echo", text="x")), reply("unused"))
    with stdio(counts) as tools, pytest.raises(AgentLoopError) as info:
        Agent(model, tools, max_consecutive_failures=2).run("go")
    assert info.value.reason == "tool_failures"
    assert "was not sent" in info.value.evidence["last_error"]


def test_a_server_that_cannot_start_is_a_connection_error() -> None:
    """Entering the block fails with ConnectionError naming the server."""
    from fsm_agent.mcp import stdio_tools

    with pytest.raises(ConnectionError, match="no-such-mcp-server"), stdio_tools("no-such-mcp-server"):
        pass


@pytest.mark.subprocess
def test_calls_after_the_block_fail_unsent(counts: Path) -> None:
    """Leaving the block closes the session; the registry's tools then fail without reaching the server."""
    with stdio(counts) as tools:
        pass
    outcome = tools.execute(ToolCall("1", "bump", {"key": "late"}))
    assert "connection was closed" in (outcome.error or "")
    assert counted(counts) == {}


@pytest.mark.subprocess
def test_registries_merge_and_clashes_name_both_sources(shared: ToolRegistry, http_server: str) -> None:
    """Local tools, a stdio server and an HTTP server merge; a clash names both sources; a prefix resolves it."""
    from fsm_agent.mcp import http_tools

    local = ToolRegistry()

    @local.register
    def echo(text: str) -> str:
        """Local echo."""
        return text.upper()

    over_stdio = shared
    with http_tools(http_server) as over_http:
        merged = ToolRegistry()
        merged.include(local)
        with pytest.raises(ValueError, match=r"'echo' from MCP server .* clashes with 'echo' from local tools"):
            merged.include(over_stdio)
        assert list(merged) == ["echo"]  # nothing of the refused registry was added
        merged.include(over_stdio, prefix="cli_")
        clash = re.escape(f"'cli_echo' from MCP server {http_server} clashes with 'cli_echo'")
        with pytest.raises(ValueError, match=clash):
            merged.include(over_http, prefix="cli_")
        merged.include(over_http, prefix="web_")
        assert merged.source_of("web_add") == f"MCP server {http_server}"
        assert merged.execute(ToolCall("1", "echo", {"text": "a"})).content == '"A"'
        assert merged.execute(ToolCall("2", "cli_echo", {"text": "b"})).content == "b"
        assert merged.execute(ToolCall("3", "web_echo", {"text": "c"})).content == "c"
        assert {s["name"] for s in merged.schemas()} >= {"echo", "cli_bump", "web_bump"}


@pytest.mark.subprocess
def test_a_run_over_http_with_the_async_driver(http_server: str) -> None:
    """``async with http_tools(...)`` serves ``arun``; a turn's calls run concurrently on one session."""
    from fsm_agent.mcp import http_tools

    model = FakeModel(
        tool_turn(tool_call("add", a=1, b=2), tool_call("echo", text="hi"), tool_call("bump", key="k")),
        reply("done"),
    )

    async def main() -> str:
        async with http_tools(http_server) as tools:
            result = await Agent(model, tools).arun("go")
        return result.final

    assert asyncio.run(main()) == "done"
    answers = [m.content for m in model.seen[1] if m.role == "tool"]
    assert answers == ["3", "hi", "1"]


@pytest.mark.subprocess
def test_side_effects_run_once_across_resume_and_retry(counts: Path) -> None:
    """A resumed run and a retried model call never repeat an MCP call that already ran."""
    model = FakeModel(
        tool_turn(tool_call("bump", key="a")),
        RuntimeError("provider down"),
        tool_turn(tool_call("bump", key="b")),
        reply("finished"),
    )
    with stdio(counts) as tools:
        agent = Agent(model, tools, max_steps=1)
        with pytest.raises(AgentLoopError) as stopped:
            agent.run("go")
        assert stopped.value.reason == "max_steps"
        assert counted(counts) == {"a": 1}
        with pytest.raises(AgentLoopError) as failed:
            agent.resume(stopped.value.result, max_steps=5).finish()
        assert failed.value.reason == "model_error"
        result = agent.resume(failed.value.result, retry=True).finish()
    assert result.final == "finished"
    assert counted(counts) == {"a": 1, "b": 1}


@pytest.mark.subprocess
def test_the_readme_example_runs_offline_against_the_example_server() -> None:
    """``python examples/mcp_agent.py`` lists the example server's tools and answers from its word count."""
    example = Path(__file__).resolve().parents[2] / "examples" / "mcp_agent.py"
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["tools: word_count, shout", "tool said: 6", "answer: It has 6 words."]


@pytest.mark.subprocess
def test_an_http_server_that_goes_away_fails_the_call_and_later_ones_fast(
    http_process: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """Over HTTP too, a server that stopped is a tool failure naming it, and later calls are not sent."""
    from fsm_agent.mcp import http_tools

    url, process = http_process
    with http_tools(url) as tools:
        assert tools.execute(ToolCall("1", "echo", {"text": "hi"})).content == "hi"
        process.terminate()
        process.wait(10)
        lost = tools.execute(ToolCall("2", "echo", {"text": "anyone?"}))
        assert not lost.ok
        assert f"MCP server {url}" in (lost.error or "")
        later = tools.execute(ToolCall("3", "echo", {"text": "still?"}))
        assert "was not sent" in (later.error or "")


def suffixed(plain: str, name: str) -> str:
    """The documented name of a tool whose safe name is too long or taken: 55 characters, ``_``, 8 hex digits."""
    return f"{plain[:55]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


@pytest.mark.subprocess
def test_tool_names_that_meet_for_providers_get_unique_stable_names_and_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``a.b`` and ``a_b``, long names sharing 64 characters, ``ü`` and ``ö``: unique in any order, one warning."""
    from fsm_agent.mcp import stdio_tools

    long_a, long_g = "t" * 64 + "_alpha", "t" * 64 + "_gamma"
    expected = {  # registry name -> the server's name, which is what the tool answers with
        "a_b": "a_b",
        suffixed("a_b", "a.b"): "a.b",
        suffixed(long_a, long_a): long_a,
        suffixed(long_g, long_g): long_g,
        suffixed("_", "ü"): "ü",
        suffixed("_", "ö"): "ö",
    }
    for order in ((), ("reversed",)):
        caplog.clear()
        with caplog.at_level(logging.WARNING), stdio_tools(sys.executable, [str(SERVER), "names", *order]) as tools:
            answers = {name: tools.execute(ToolCall("1", name, {})).content for name in tools}
        assert answers == expected
        [warning] = [record for record in caplog.records if record.name.startswith("fsm_agent")]
        assert warning.levelno == logging.WARNING
        for renamed, original in expected.items():
            assert (f"{original!r} -> {renamed!r}" in warning.getMessage()) == (renamed != original)


@pytest.mark.subprocess
def test_a_result_over_max_result_bytes_is_a_tool_failure_and_the_session_goes_on(counts: Path) -> None:
    """Over stdio, an answer bigger than the cap fails its own call, naming the cap; calls after it are answered."""
    from fsm_agent.mcp import stdio_tools

    with stdio_tools(sys.executable, [str(SERVER)], server_env(counts), max_result_bytes=50_000) as tools:
        assert tools.execute(ToolCall("1", "flood", {"size": 40_000})).ok
        refused = tools.execute(ToolCall("2", "flood", {"size": 200_000}))
        assert not refused.ok
        assert "'flood'" in (refused.error or "")
        assert "over max_result_bytes=50000" in (refused.error or "")
        assert tools.execute(ToolCall("3", "echo", {"text": "still here"})).content == "still here"


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", [(), ("json",)], ids=["event-stream", "plain-json"])
def test_over_http_a_result_over_max_result_bytes_is_a_tool_failure_not_a_lost_server(
    counts: Path, no_proxy: None, mode: tuple[str, ...]
) -> None:
    """Over HTTP, as an event stream or as plain JSON, an answer over the cap fails its call and the server stays."""
    from fsm_agent.mcp import http_tools

    with serving_http(counts, *mode) as (url, _), http_tools(url, max_result_bytes=50_000) as tools:
        assert tools.execute(ToolCall("1", "flood", {"size": 40_000})).ok
        refused = tools.execute(ToolCall("2", "flood", {"size": 200_000}))
        assert not refused.ok
        assert "over max_result_bytes=50000" in (refused.error or "")
        assert tools.execute(ToolCall("3", "echo", {"text": "still here"})).content == "still here"


def test_stdout_lines_are_cut_across_chunks_and_a_skipped_answer_keeps_its_id() -> None:
    """Lines span chunks; a line over the cap keeps only its ends, whose id is read in either SDK's key order."""
    from fsm_agent.mcp.stdio import Lines, Skipped, answered_id

    lines = Lines(1000)
    assert [*lines.feed(b'{"a":1}\n{"b"'), *lines.feed(b":2}\n")] == [b'{"a":1}', b'{"b":2}']
    big = json.dumps("x" * 5000)
    for line, answers in [
        (f'{{"jsonrpc":"2.0","id":7,"result":{{"text":{big}}}}}', 7),  # the Python SDK's order
        (f'{{"result":{{"text":{big}}},"jsonrpc":"2.0","id":"r-8"}}', "r-8"),  # the TypeScript SDK's order
        (f'{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":{big}}}}}', None),
    ]:
        [skipped] = [*lines.feed(line[:3000].encode()), *lines.feed(line[3000:].encode() + b"\n")]
        assert isinstance(skipped, Skipped)
        assert skipped.size == len(line)
        assert answered_id(skipped) == answers


def _cpu_seconds() -> float:
    """CPU time this process (every thread, not the server's) has used: its work, however busy the machine is."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


# CPU seconds this process spent from asking for 24 MB to the next call's answer: 0.015-0.027 s with this package's
# transport, quiet and with two CPU hogs beside it on 2 cores alike; 3.1-4.0 s with the SDK's stdio_client, which
# grows and splits the line again at every chunk (4.1 s of wall clock quiet, 15 s beside the hogs).  Half a second is
# 18x over the first and a sixth of the second.  Wall clock would measure the machine's load instead: the answer
# itself takes 0.12-0.35 s to pass, more on a busier machine, and the next answer comes after it.
_HUGE_ANSWER_CPU = 0.5


@pytest.mark.subprocess
def test_a_call_that_times_out_on_a_huge_answer_does_not_hold_up_the_next_one(counts: Path) -> None:
    """A call timed out (or refused at the cap) while its huge answer arrives leaves the session usable at once.

    Read whole, a 24 MB answer held up every message behind it for seconds of
    the client's CPU; skipped as it arrives, it costs the client a few
    hundredths of a second, so the next call waits only for its bytes to pass.
    """
    with stdio(counts) as tools:
        assert tools.execute(ToolCall("0", "echo", {"text": "warm"})).content == "warm"
        huge = 24_000_000  # over the default cap (10 MiB)
        before = _cpu_seconds()
        assert not tools.execute(ToolCall("1", "flood", {"size": huge}), timeout=0.3).ok
        # The timeout only keeps a hang from blocking the suite: how long the answer takes to pass is the machine's.
        assert tools.execute(ToolCall("2", "echo", {"text": "next"}), timeout=60).content == "next"
        spent = _cpu_seconds() - before
    assert spent < _HUGE_ANSWER_CPU, f"{spent:.2f} s of CPU to get past a {huge}-byte answer"


def test_a_server_that_exits_at_once_is_one_line_with_its_exit_code_and_stderr(tmp_path: Path) -> None:
    """Entering the block fails with one line: the server exited, its exit code, the last lines of its stderr."""
    from fsm_agent.mcp import stdio_tools

    say = "import sys; print('starting', file=sys.stderr); print('bad config: no token', file=sys.stderr)"
    script = f"{say}; sys.exit(7)"
    with (
        (tmp_path / "stderr.txt").open("w+") as errlog,
        pytest.raises(ConnectionError) as info,
        stdio_tools(sys.executable, ["-c", script], errlog=errlog),
    ):
        pass
    message = str(info.value)
    assert "\n" not in message
    assert "exited with code 7" in message
    assert message.endswith("starting | bad config: no token")
    assert (tmp_path / "stderr.txt").read_text() == "starting\nbad config: no token\n"  # it still reaches errlog
