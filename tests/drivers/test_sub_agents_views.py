"""Sub-agents as the viewer's JSON and OpenTelemetry show them: parent and child runs linked, child spans nested."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from starlette.testclient import TestClient
from support.sdk import skip_unless_installed
from support.ui_runs import finished, paused

from fsm_agent import Agent, Message, ModelResponse, SqliteStore, ToolRegistry
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn
from fsm_agent.ui import create_app

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs the extras: there a missing one fails the imports below
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")
    skip_unless_installed("opentelemetry.sdk", reason="the otel extra: pip install 'fsm-agent[otel]'")

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    Traced = tuple[InMemorySpanExporter, TracerProvider]

BASE = "http://127.0.0.1:8765"
QUESTION = "capital of France?"


class Researcher:
    """A child's model that holds no script, so concurrent runs of it cannot take each other's turns.

    Its first reply calls ``tool`` (``echo`` by default) with the question; once a tool answered, it answers.
    """

    def __init__(self, tool: str = "echo") -> None:
        self.tool = tool

    def complete(self, messages: Sequence[Message], tools: Any) -> ModelResponse:
        """A tool call for a question, the answer once the tool result is in."""
        question = next(m.content for m in messages if m.role == "user")
        if messages[-1].role == "tool":
            return reply(f"found: {question}")
        arguments = {"text": question} if self.tool == "echo" else {}
        return tool_turn(tool_call(self.tool, **arguments))


def researcher(registry: ToolRegistry | None = None, tool: str = "echo") -> Agent:
    """A child agent that calls one tool and answers."""
    return Agent(Researcher(tool), registry or demo_registry())


def parent_of(child: Agent, *calls: str, **options: Any) -> Agent:
    """A parent whose one turn calls ``research`` (``child``) once per call id, then answers."""
    registry = demo_registry()
    registry.register(child.as_tool("research", "Answers one research question."))
    turn = tool_turn(*(tool_call("research", id=call, input=f"{QUESTION} ({call})") for call in calls))
    return Agent(FakeModel(turn, reply("It is Paris.")), registry, **options)


# --- the viewer ------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    """A store holding run ``p1`` whose call ``c1`` ran a sub-agent, stored as ``p1/c1``."""
    with SqliteStore(tmp_path / "runs.db") as opened:
        parent_of(researcher(), "c1").run("q", store=opened, run_id="p1")
        yield opened


def client(store: Any) -> TestClient:
    """A test client for a read-only viewer over ``store``."""
    return TestClient(create_app(store), base_url=BASE)


def test_a_parent_s_sub_agent_call_names_the_child_run_and_where_it_stands(store: SqliteStore) -> None:
    """The call's dispatch and tool_done edges name run p1/c1; the run lists it with its state and reason."""
    run = client(store).get("/api/run", params={"id": "p1"}).json()
    linked = [(m["source"], m["dest"], m["child"]) for m in run["moments"] if m["child"] is not None]
    assert linked == [("Dispatch", "ExecuteTool", "p1/c1"), ("ExecuteTool", "AwaitModel", "p1/c1")]
    assert run["children"] == [
        {
            "run_id": "p1/c1",
            "call_id": "c1",
            "tool": "research",
            "stored": True,
            "state": "Done",
            "reason": "done",
            "paused": False,
        }
    ]
    assert (run["parent_run_id"], run["parent_call_id"]) == (None, None)


def test_a_sub_agent_s_run_names_its_parent_run_and_call(store: SqliteStore) -> None:
    """Run p1/c1's page data says it is the sub-agent run of call c1 in run p1."""
    run = client(store).get("/api/run", params={"id": "p1/c1"}).json()
    assert (run["parent_run_id"], run["parent_call_id"], run["children"]) == ("p1", "c1", [])
    assert run["final"] == f"found: {QUESTION} (c1)"


def test_a_sub_agent_run_the_store_no_longer_has_is_named_without_a_state(store: SqliteStore) -> None:
    """With p1/c1 deleted, p1's call still names it (from its step), marked as not stored, with no state."""
    assert store.delete("p1/c1")
    run = client(store).get("/api/run", params={"id": "p1"}).json()
    assert run["children"] == [
        {
            "run_id": "p1/c1",
            "call_id": "c1",
            "tool": "research",
            "stored": False,
            "state": None,
            "reason": None,
            "paused": False,
        }
    ]
    assert run["moments"][3]["child"] == "p1/c1"


def _seen_while_the_child_runs(tmp_path: Path, every: str) -> dict[str, Any]:
    """The parent's page, fetched by the child's tool while the child run is under way."""
    seen: list[dict[str, Any]] = []
    with SqliteStore(tmp_path / "runs.db", every) as opened:  # type: ignore[arg-type]
        viewer = client(opened)
        tools = ToolRegistry()

        @tools.register
        def look() -> str:
            """Look at the parent's page while this child run is under way."""
            seen.append(viewer.get("/api/run", params={"id": "p1"}).json())
            return "looked"

        parent_of(researcher(tools, tool="look"), "c1").run("q", store=opened, run_id="p1")
    (during,) = seen
    return during


def test_a_sub_agent_call_in_flight_links_to_the_child_run_under_way(tmp_path: Path) -> None:
    """every="transition": while the child runs (no step names it), the parent's page finds p1/c1, in ExecuteTool."""
    during = _seen_while_the_child_runs(tmp_path, "transition")
    assert during["state"] == "ExecuteTool"
    assert during["moments"][-1]["child"] == "p1/c1"
    assert [(c["run_id"], c["call_id"], c["tool"], c["state"]) for c in during["children"]] == [
        ("p1/c1", "c1", "research", "ExecuteTool")
    ]


def test_with_a_write_per_call_the_parent_page_lists_the_child_its_last_reply_asked_for(tmp_path: Path) -> None:
    """every="call": the parent is stored as of the reply asking for the sub-agent; its page still lists p1/c1."""
    during = _seen_while_the_child_runs(tmp_path, "call")
    assert during["state"] == "CheckTruncation"  # the stored run lags the run object until the call returns
    assert [(c["run_id"], c["call_id"], c["tool"], c["stored"]) for c in during["children"]] == [
        ("p1/c1", "c1", "research", True)
    ]


def test_a_run_merely_named_like_a_pending_call_s_child_is_not_taken_for_one(tmp_path: Path) -> None:
    """A run stored as q/call_mail, not made by q's paused call call_mail, is not listed as q's sub-agent run."""
    with SqliteStore(tmp_path / "runs.db") as opened:
        call_id = paused(opened, [], run_id="q")
        finished(opened, run_id=f"q/{call_id}")
        run = client(opened).get("/api/run", params={"id": "q"}).json()
    assert run["pending"][0]["id"] == call_id
    assert run["children"] == []
    assert all(moment["child"] is None for moment in run["moments"])


def test_following_a_parent_run_sends_its_sub_agent_runs_too(store: SqliteStore) -> None:
    """The followed run's digest (server-sent events) carries the same sub-agent links as /api/run."""
    with client(store).stream("GET", "/api/events", params={"id": "p1"}) as response:
        text = "".join(response.iter_text())
    first = json.loads(next(line for line in text.splitlines() if line.startswith("data: {"))[len("data: ") :])
    assert [(c["run_id"], c["state"]) for c in first["children"]] == [("p1/c1", "Done")]


# --- OpenTelemetry ---------------------------------------------------------------------------


@pytest.fixture
def traced() -> Traced:
    """The SDK's in-memory exporter behind a tracer provider."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


def tree(spans: Sequence[ReadableSpan]) -> list[str]:
    """The spans as indented lines in start order, with the run, call and nesting attributes; one trace only."""
    assert len({span.context.trace_id for span in spans if span.context}) == 1
    by_parent: dict[int | None, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        by_parent.setdefault(span.parent.span_id if span.parent else None, []).append(span)
    keys = {
        "gen_ai.conversation.id": "run",
        "gen_ai.tool.call.id": "call",
        "fsm_agent.child_run_id": "child",
        "fsm_agent.parent_run_id": "parent",
    }
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in by_parent.get(parent, []):
            attributes = span.attributes or {}
            shown = " ".join(f"{label}={attributes[key]!s}" for key, label in keys.items() if key in attributes)
            lines.append(f"{'  ' * depth}{span.name} {shown}".rstrip())
            walk(span.context.span_id if span.context else None, depth + 1)

    walk(None, 0)
    return lines


NESTED = [
    "invoke_agent run=p1",
    "  chat",
    "  execute_tool research call=c1 child=p1/c1",
    "    invoke_agent research run=p1/c1 parent=p1",
    "      chat",
    "      execute_tool echo",
    "      chat",
    "  chat",
]
"""A parent run with one sub-agent call: the child's run span under the call's tool span, in the same trace."""


def _without_call_ids(lines: list[str]) -> list[str]:
    """The tree with the child's own (generated) tool call ids left out."""
    return [line.split(" call=")[0] if "execute_tool echo" in line else line for line in lines]


@pytest.mark.parametrize("timeout", [None, 30.0], ids=["no-timeout", "timeout-worker-thread"])
def test_a_sub_agent_s_run_span_nests_under_the_parent_s_tool_span_on_the_sync_driver(
    traced: Traced, timeout: float | None
) -> None:
    """instrument(parent) traces the child too; its invoke_agent span is the execute_tool span's child."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    parent = parent_of(researcher(), "c1", timeout=timeout)
    instrument(parent, provider)
    assert parent.run("q", run_id="p1").ok
    assert _without_call_ids(tree(exporter.get_finished_spans())) == NESTED


def test_a_sub_agent_s_run_span_nests_under_the_parent_s_tool_span_on_the_async_driver(traced: Traced) -> None:
    """On the async driver too, the child's invoke_agent span is the parent's execute_tool span's child."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    parent = parent_of(researcher(), "c1")
    instrument(parent, provider)
    assert asyncio.run(parent.arun("q", run_id="p1")).ok
    assert _without_call_ids(tree(exporter.get_finished_spans())) == NESTED


def test_two_concurrent_sub_agent_calls_of_one_async_turn_each_nest_under_their_own_tool_span(
    traced: Traced,
) -> None:
    """Two children of one turn run at once (they meet at a barrier); each run span sits under its own call's span."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    barrier = threading.Barrier(2, timeout=10)
    tools = ToolRegistry()

    @tools.register
    def meet() -> str:
        """Wait until the other child run is here too (only possible if both run at once)."""
        barrier.wait()
        return "met"

    parent = parent_of(researcher(tools, tool="meet"), "c1", "c2")
    instrument(parent, provider)
    result = asyncio.run(parent.arun("q", run_id="p1"))
    assert result.ok
    assert [m.content for m in result.messages if m.role == "tool"] == [
        f'"found: {QUESTION} (c1)"',
        f'"found: {QUESTION} (c2)"',
    ]
    spans = exporter.get_finished_spans()
    calls = {str((s.attributes or {})["gen_ai.tool.call.id"]): s for s in spans if s.name == "execute_tool research"}
    runs = [s for s in spans if s.name == "invoke_agent research"]
    assert sorted(calls) == ["c1", "c2"]
    assert len(runs) == 2
    for run in runs:
        call_id = str((run.attributes or {})["gen_ai.conversation.id"]).removeprefix("p1/")
        call = calls[call_id]
        assert run.parent is not None
        assert call.context is not None
        assert run.parent.span_id == call.context.span_id
        assert (call.attributes or {})["fsm_agent.child_run_id"] == f"p1/{call_id}"
    assert max(s.start_time or 0 for s in runs) < min(s.end_time or 0 for s in runs)  # they overlapped


@pytest.mark.parametrize("order", ["child-first", "parent-first"])
def test_a_sub_agent_the_user_instruments_too_is_traced_once_under_its_own_name(traced: Traced, order: str) -> None:
    """instrument(child) before or after instrument(parent): one child run span, named as the user said, nested."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    child = researcher()
    parent = parent_of(child, "c1")
    if order == "child-first":
        instrument(child, provider, agent_name="scholar")
        instrument(parent, provider)
    else:
        instrument(parent, provider)
        instrument(child, provider, agent_name="scholar")
    parent.run("q", run_id="p1")
    lines = _without_call_ids(tree(exporter.get_finished_spans()))
    assert lines == [line.replace("invoke_agent research", "invoke_agent scholar") for line in NESTED]


def test_a_sub_agent_registered_after_instrument_is_traced_at_its_first_call(traced: Traced) -> None:
    """A sub-agent tool added to the registry after instrument(parent) is instrumented when the parent calls it."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    registry = demo_registry()
    parent = Agent(FakeModel(tool_turn(tool_call("research", id="c1", input=QUESTION)), reply("Paris")), registry)
    instrument(parent, provider)
    registry.register(researcher().as_tool("research", "Answers one research question."))
    parent.run("q", run_id="p1")
    assert _without_call_ids(tree(exporter.get_finished_spans())) == NESTED


def test_a_sub_agent_s_own_sub_agent_nests_two_levels_down(traced: Traced) -> None:
    """Grandchild p1/c1/<call> runs under the child's execute_tool span, which runs under the parent's."""
    from fsm_agent.otel import instrument

    exporter, provider = traced
    tools = demo_registry()
    tools.register(researcher().as_tool("deeper", "Looks deeper."))
    child = Agent(FakeModel(tool_turn(tool_call("deeper", id="d1", input="why?")), reply("because")), tools)
    parent = parent_of(child, "c1")
    instrument(parent, provider)
    parent.run("q", run_id="p1")
    assert _without_call_ids(tree(exporter.get_finished_spans())) == [
        "invoke_agent run=p1",
        "  chat",
        "  execute_tool research call=c1 child=p1/c1",
        "    invoke_agent research run=p1/c1 parent=p1",
        "      chat",
        "      execute_tool deeper call=d1 child=p1/c1/d1",
        "        invoke_agent deeper run=p1/c1/d1 parent=p1/c1",
        "          chat",
        "          execute_tool echo",
        "          chat",
        "      chat",
        "  chat",
    ]
