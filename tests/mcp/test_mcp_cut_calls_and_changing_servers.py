"""MCP tools under cuts, changing servers and odd results: a real server on the SDK, counted on the server's side.

``tests/support/mcp_audit_server.py`` counts each call as it starts and as it
completes; ``tests/support/mcp_raw_server.py`` lists a schema the protocol
forbids.  Nothing of the SDK is mocked (docs/how-to/mcp.md, docs/concepts/exactly-once.md).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.exactly_once_audit import keys_named
from support.sdk import skip_unless_installed
from support.store_cases import durable_calls

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, Session, ToolCall
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

skip_unless_installed("mcp", reason="the mcp extra is not installed: pip install -e '.[mcp]'")

SUPPORT = Path(__file__).resolve().parents[1] / "support"
SERVER = SUPPORT / "mcp_audit_server.py"
RAW = SUPPORT / "mcp_raw_server.py"
PATIENCE = 60.0
DRIVERS = ["sync", "async"]


def _tools(counts: Path) -> Any:
    from fsm_agent.mcp import stdio_tools

    return stdio_tools(sys.executable, [str(SERVER)], {"FSM_AGENT_TEST_COUNTS": str(counts)})


def _counted(counts: Path) -> dict[str, int]:
    return json.loads(counts.read_text()) if counts.exists() else {}


SYNC_TIMEOUT = 2.0
"""The sync driver's cut: its run timeout (a cancel token is checked only between calls there).  bump completes in
milliseconds; hang never does, so the run is cut there, however loaded the machine: from the run's start to bump
counted and hang started on the server took at most 0.25 s in 20 cuts under ``.ci/under-load`` (two CPU hogs on two
cores, other work running; 0.04 s in half of them), so 2 s leaves eight times the worst seen."""


LIFTED = 3600.0
"""The timeout a resume gives a run cut at its own, so the stop is lifted."""


def _started(counts: Path, *keys: str) -> None:
    """Wait until the server counted every one of ``keys``: bump done, hang in flight on the server."""
    deadline = time.monotonic() + PATIENCE
    while any(_counted(counts).get(key, 0) < 1 for key in keys):
        assert time.monotonic() < deadline, f"{keys} never all counted: {_counted(counts)}"
        time.sleep(0.01)


def _durable(target: str, run_id: str, call_id: str) -> None:
    """Wait until the stored run holds ``call_id``'s outcome: the client took it in, so it is not in flight."""
    deadline = time.monotonic() + PATIENCE
    while True:
        with open_store(target) as reader:
            try:
                if call_id in durable_calls(reader.load(run_id)):
                    return
            except KeyError:
                pass
        assert time.monotonic() < deadline, f"{call_id} never became durable in {run_id}"
        time.sleep(0.01)


def _cut(turn: Any, driver: str, counts: Path, durable: tuple[str, str] | None = None) -> BaseException | Any:
    """Run ``turn(driver)`` and cut it in hang: the sync driver at its timeout, the async one by cancelling its task.

    Returns what the cut raised (the task's ``CancelledError``) or the sync run's result.
    """
    if driver == "sync":
        try:
            return turn()
        except AgentLoopError as exc:
            return exc

    async def go() -> BaseException:
        task = asyncio.ensure_future(turn())
        await asyncio.to_thread(_started, counts, "a", "h:started")
        if durable is not None:
            await asyncio.to_thread(_durable, *durable, "b1")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            return exc
        pytest.fail("the cancelled turn returned")

    return asyncio.run(go())


def _drive(agent: Agent, driver: str, text: str) -> Any:
    if driver == "sync":
        return agent.run(text)
    return asyncio.run(agent.arun(text))


class _Batch:
    """Asks, in one reply, for ``bump(a)`` and ``hang(h)``; then answers with what the tool messages said."""

    def __init__(self) -> None:
        self.seen: list[list[Message]] = []

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.seen.append(list(messages))
        if not any(m.role == "tool" for m in messages):
            return tool_turn(tool_call("bump", id="b1", label="a"), tool_call("hang", id="h1", label="h"))
        return reply(" | ".join(m.content for m in messages if m.role == "tool"))


@pytest.mark.subprocess
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_batch_cut_during_an_mcp_call_resumes_without_repeating_the_completed_call(
    tmp_path: Path, cutter: str, resumer: str
) -> None:
    """bump completes, hang is in flight on the server, the run is cancelled; a new store object resumes it."""
    counts = tmp_path / "counts.json"
    target = str(tmp_path / "runs.db")
    with _tools(counts) as tools:
        agent = Agent(_Batch(), tools, timeout=SYNC_TIMEOUT if cutter == "sync" else None)
        with open_store(target) as store:
            if cutter == "sync":
                _cut(lambda: agent.run("go", store=store, run_id="r"), "sync", counts)
            else:
                _cut(lambda: agent.arun("go", store=store, run_id="r"), "async", counts, (target, "r"))
        assert _counted(counts) == {"a": 1, "h:started": 1}

        with open_store(target) as store:
            stored = store.load("r")
            assert (stored["state"], stored["reason"]) == ("Failed", "timeout" if cutter == "sync" else "cancelled")
            assert stored["unfinished"] == "h1"
            resumer_agent = Agent(_Batch(), tools)
            result = _drive_resume(resumer_agent, resumer, stored, store)
    # The completed bump is not sent again; the cut hang is made again (its outcome was never taken in).
    assert _counted(counts) == {"a": 1, "h:started": 2, "h": 1}
    assert result.final == "1 | h finished after 1"
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == ["b1", "h1"]
    # Both of hang's requests named the same run, start and call, so a server could make its effect once.
    named, starts = keys_named(counts)
    assert named == {"a": ["r b1"], "h": ["r h1", "r h1"]}
    assert len(starts) == 1
    assert starts != {"None"}


def _drive_resume(agent: Agent, driver: str, stored: dict[str, Any], store: Any) -> Any:
    if driver == "sync":
        return agent.resume(stored, store=store, retry=True, timeout=LIFTED).finish()

    async def go() -> Any:
        run = await agent.aresume(stored, store=store, retry=True, timeout=LIFTED)
        return await run.afinish()

    return asyncio.run(go())


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stored_session_turn_cut_during_an_mcp_call_keeps_the_completed_call_and_never_repeats_it(
    tmp_path: Path, driver: str
) -> None:
    """A session turn cancelled mid-batch: the next turn sees bump's result once; the server counted bump once."""
    counts = tmp_path / "counts.json"
    target = str(tmp_path / "chat.db")
    with _tools(counts) as tools, open_store(target) as store:
        agent = Agent(_Batch(), tools, timeout=SYNC_TIMEOUT if driver == "sync" else None)
        session = Session(agent, store=store, session_id="chat")
        if driver == "sync":
            cut = _cut(lambda: session.run("go"), "sync", counts)
            assert isinstance(cut, AgentLoopError)
            assert cut.reason == "timeout"
            second = session.run("again")
        else:
            _cut(lambda: session.arun("go"), "async", counts, (target, "chat/1"))
            second = asyncio.run(session.arun("again"))
        again = Session(Agent(FakeModel(), tools), store=store, session_id="chat")
        roles = [(m.role, m.tool_call_id) for m in again.messages]
    assert _counted(counts) == {"a": 1, "h:started": 1}
    assert roles == [
        ("user", None),
        ("assistant", None),
        ("tool", "b1"),
        ("tool", "h1"),
        ("user", None),
        ("assistant", None),
    ]
    assert second.final.startswith("1 | ")
    assert [m.content for m in again.messages if m.role == "user"] == ["go", "again"]
    assert session.messages == again.messages


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_an_mcp_call_cut_by_the_runs_timeout_leaves_the_connection_usable(tmp_path: Path, driver: str) -> None:
    """A hung call given up at the run's timeout: the run stops on timeout, and the next call on the registry works."""
    counts = tmp_path / "counts.json"
    model = FakeModel(tool_turn(tool_call("hang", id="h1", label="t")))
    with _tools(counts) as tools:
        agent = Agent(model, tools, timeout=0.5, on_stop={"timeout": "return"})
        result = _drive(agent, driver, "go")
        assert result.reason == "timeout"
        assert result.evidence.get("unfinished") == "h1"
        after = tools.execute(ToolCall("b", "bump", {"label": "after"}), timeout=PATIENCE)
    assert after.ok, after.content
    assert _counted(counts) == {"t:started": 1, "after": 1}


@pytest.mark.subprocess
def test_content_blocks_of_every_kind_from_a_real_server_become_the_documented_text(tmp_path: Path) -> None:
    with _tools(tmp_path / "counts.json") as tools:
        mixed = tools.execute(ToolCall("m", "mixed", {}))
        shaped = tools.execute(ToolCall("s", "shaped", {}))
        empty = tools.execute(ToolCall("e", "fail_empty", {}))
    assert mixed.ok
    assert mixed.content.split("\n") == [
        "intro",
        "[image: image/png, 67 bytes]",
        "note text",
        "[resource file:///blob.bin: application/x, 3 bytes]",
        "[resource link: file:///big.csv (big.csv)]",
    ]
    assert (shaped.ok, shaped.content) == (True, '{"n":1,"s":"é"}')
    assert not empty.ok
    assert json.loads(empty.content) == {"error": "the MCP tool reported an error without a message"}


class _RetireThenBump:
    """Turn 1: retire bump, answer.  Turn 2: call bump (gone from the server), then answer with what it got."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        last = max(i for i, m in enumerate(messages) if m.role == "user")
        question, answered = messages[last].content, [m for m in messages[last:] if m.role == "tool"]
        if answered:
            return reply(answered[-1].content)
        if question == "retire":
            return tool_turn(tool_call("retire", id="r1", name="bump"))
        return tool_turn(tool_call("bump", id="b1", label="x"))


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_tool_the_server_drops_between_turns_is_a_clear_tool_failure_and_the_session_goes_on(
    tmp_path: Path, driver: str
) -> None:
    counts = tmp_path / "counts.json"
    with _tools(counts) as tools:
        session = Session(Agent(_RetireThenBump(), tools))
        first = session.run("retire") if driver == "sync" else asyncio.run(session.arun("retire"))
        second = session.run("bump") if driver == "sync" else asyncio.run(session.arun("bump"))
    assert first.final == '"retired bump"' or first.final == "retired bump"
    assert "Unknown tool: bump" in second.final
    assert second.steps[0].kind == "tool_call"
    assert "x" not in _counted(counts)
    assert session.turns == 2


@pytest.mark.subprocess
def test_a_tool_with_an_argument_named_as_the_context_parameter_is_registered_and_sent_without_ids(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its calls cannot carry the run's and the call's ids; the server's other tools still do."""
    from fsm_agent.mcp import stdio_tools

    counts = tmp_path / "counts.json"
    with stdio_tools(sys.executable, [str(SERVER), "contextarg"], {"FSM_AGENT_TEST_COUNTS": str(counts)}) as tools:
        assert {"odd", "bump"} <= set(tools)
        model = FakeModel(tool_turn(tool_call("bump", id="b1", label="a")), reply("ok"))
        Agent(model, tools).run("go", run_id="r")
    assert "'odd' has an argument named '_fsm_agent_context', so its calls carry no run or call ids" in caplog.text
    assert keys_named(counts)[0] == {"a": ["r b1"]}


@pytest.mark.subprocess
def test_a_server_listing_a_bad_input_schema_is_one_line_naming_the_schema() -> None:
    """docs/how-to/mcp.md: a server that cannot be started or reached is a ConnectionError, one line long.

    Here the client's SDK refuses the listing (``inputSchema.type`` must be
    ``object``); the error should say so, in one line, every time.
    """
    from fsm_agent.mcp import stdio_tools

    messages = []
    for _ in range(3):
        with pytest.raises(ConnectionError) as info, stdio_tools(sys.executable, [str(RAW)]):
            pass
        messages.append(str(info.value))
    for message in messages:
        assert "\n" not in message, message
        assert "inputSchema" in message, message
