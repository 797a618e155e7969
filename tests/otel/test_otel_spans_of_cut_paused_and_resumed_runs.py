"""OpenTelemetry spans of runs that pause, are cut mid-batch, retried, finalized, refused by their store, resumed.

Real SDK spans: an in-memory exporter keeps the finished ones and a span
processor of this file keeps every span started and not yet ended, so a
span left open is seen directly.  Each tool counts its executions, and the
``execute_tool`` spans are compared with them: one span per execution, the
finished ones not marked unfinished.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support.counted_calls import Counted, drive, finish
from support.sdk import skip_unless_installed
from support.spans import Spans, attributes

from fsm_agent import Agent, RunResult, SqliteStore, Usage
from fsm_agent.persist.store import StoreError
from fsm_agent.persist.summary import Entry
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

skip_unless_installed("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan


def traced(agent: Agent, spans: Spans, **options: Any) -> Any:
    from fsm_agent.otel import instrument

    return instrument(agent, spans.provider, **options)


def edges_of(span: ReadableSpan) -> list[tuple[str, str, str]]:
    return [(e.attributes["source"], e.attributes["trigger"], e.attributes["dest"]) for e in span.events]  # type: ignore[index]


def edges(result: RunResult) -> list[tuple[str, str, str]]:
    return [(t.source, t.trigger, t.dest) for t in result.trace]


def unfinished_calls(spans: Spans) -> set[str]:
    return {
        call for call, found in spans.tools().items() if any(attributes(s).get("fsm_agent.unfinished") for s in found)
    }


# --- a run paused for approval --------------------------------------------------------------------------------


def _approving(tools: Counted, *answers: Any) -> Agent:
    return Agent(FakeModel(*answers), tools.registry, approve={"send"})


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_paused_run_resumed_by_the_same_agent_is_two_spans_split_at_the_pause(
    spans: Spans, tmp_path: Path, driver: str
) -> None:
    """The rule does not depend on who resumes: the span ends at the pause, the resume is a new span marked resumed."""
    tools = Counted()
    agent = _approving(tools, tool_turn(tool_call("send", id="s1", to="ops")), reply("sent"))
    traced(agent, spans)
    with SqliteStore(tmp_path / "runs.db") as store:
        paused = drive(agent, driver, store=store, run_id="p1")
        assert paused.reason == "paused"
        assert spans.named("execute_tool") == []
        result = finish(agent.resume(store.load("p1"), approvals={"s1": True}, store=store), driver)
    assert result.final == "sent"
    paused_span, resumed_span = spans.named("invoke_agent")
    assert edges_of(paused_span) + edges_of(resumed_span) == edges(result)
    assert edges_of(paused_span) == edges(paused)  # up to the pause, its last edge into ExecuteTool
    assert attributes(paused_span).get("fsm_agent.paused") is True
    assert "fsm_agent.resumed" not in attributes(paused_span)
    assert attributes(resumed_span).get("fsm_agent.resumed") is True
    assert "fsm_agent.paused" not in attributes(resumed_span)
    assert attributes(resumed_span)["fsm_agent.stop_reason"] == "done"
    assert {attributes(s)["gen_ai.conversation.id"] for s in (paused_span, resumed_span)} == {"p1"}
    (tool,) = spans.named("execute_tool")
    assert tool.parent is not None
    assert tool.parent.span_id == resumed_span.context.span_id
    assert attributes(tool)["gen_ai.tool.call.id"] == "s1"
    assert tools.ran == Counter({"s1": 1})
    spans.all_ended_once()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_paused_run_resumed_by_a_new_agent_leaves_no_span_open(spans: Spans, tmp_path: Path, driver: str) -> None:
    """The process that paused the run may never see it again: its run span must still end (and be exported)."""
    tools = Counted()
    first = _approving(tools, tool_turn(tool_call("send", id="s1", to="ops")))
    traced(first, spans)
    with SqliteStore(tmp_path / "runs.db") as store:
        assert drive(first, driver, store=store, run_id="p1").reason == "paused"
    second = _approving(tools, reply("sent"))
    traced(second, spans)
    with SqliteStore(tmp_path / "runs.db") as store:
        result = finish(second.resume(store.load("p1"), approvals={"s1": True}, store=store), driver)
    assert result.final == "sent"
    assert tools.ran == Counter({"s1": 1})
    spans.all_ended_once()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_paused_run_resumed_by_a_new_agent_has_a_span_marked_resumed(
    spans: Spans, tmp_path: Path, driver: str
) -> None:
    tools = Counted()
    first = _approving(tools, tool_turn(tool_call("send", id="s1", to="ops")))
    traced(first, spans)
    with SqliteStore(tmp_path / "runs.db") as store:
        assert drive(first, driver, store=store, run_id="p1").reason == "paused"
    second = _approving(tools, reply("sent"))
    traced(second, spans)
    with SqliteStore(tmp_path / "runs.db") as store:
        finish(second.resume(store.load("p1"), approvals={"s1": True}, store=store), driver)
    paused, resumed = spans.named("invoke_agent")  # the first agent's, ended at the pause, then the new agent's
    assert attributes(paused).get("fsm_agent.paused") is True
    assert "fsm_agent.resumed" not in attributes(paused)
    assert attributes(resumed)["gen_ai.conversation.id"] == "p1"
    assert attributes(resumed).get("fsm_agent.resumed") is True


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_paused_run_decided_and_finished_by_the_same_handle_is_split_at_the_pause(spans: Spans, driver: str) -> None:
    """No store, no new agent: the pause still ends the span, and the same run object's going on is a new one."""
    tools = Counted()
    agent = _approving(tools, tool_turn(tool_call("send", id="s1", to="ops")), reply("sent"))
    traced(agent, spans)
    run = agent.start("q", run_id="h1")
    assert finish(run, driver).reason == "paused"
    (paused,) = spans.named("invoke_agent")  # exported at the pause, before any decision
    assert attributes(paused).get("fsm_agent.paused") is True
    assert "fsm_agent.stop_reason" not in attributes(paused)
    assert paused.status.status_code.name == "UNSET"  # a pause is no error
    run.decide({"s1": True})
    result = finish(run, driver)
    assert result.final == "sent"
    first, second = spans.named("invoke_agent")
    assert first.context.span_id == paused.context.span_id
    assert edges_of(first) + edges_of(second) == edges(result)
    assert attributes(second).get("fsm_agent.resumed") is True
    assert attributes(second)["fsm_agent.stop_reason"] == "done"
    spans.all_ended_once()


def test_a_run_driven_step_by_step_ends_its_span_at_the_step_that_paused_it(spans: Spans) -> None:
    tools = Counted()
    agent = _approving(tools, tool_turn(tool_call("send", id="s1", to="ops")), reply("sent"))
    traced(agent, spans)
    run = agent.start("q")
    while not run.paused:
        assert spans.named("invoke_agent") == []
        run.advance()
    (paused,) = spans.named("invoke_agent")
    assert attributes(paused).get("fsm_agent.paused") is True
    assert spans.open == {}
    spans.all_ended_once()


def test_a_fresh_run_span_is_not_marked_resumed_nor_paused(spans: Spans) -> None:
    tools = Counted()
    agent = Agent(FakeModel(tool_turn(tool_call("quick", id="q1", n=1)), reply("done")), tools.registry)
    traced(agent, spans)
    assert agent.run("q").final == "done"
    (run,) = spans.named("invoke_agent")
    assert "fsm_agent.resumed" not in attributes(run)
    assert "fsm_agent.paused" not in attributes(run)


# --- stops in the middle of a parallel batch ------------------------------------------------------------------


@pytest.mark.parametrize("stop", ["tool_failures", "hook_error"])
def test_calls_that_ran_beside_a_mid_batch_stop_end_as_finished(spans: Spans, stop: str) -> None:
    tools = Counted()
    if stop == "tool_failures":
        calls = (
            tool_call("fail", id="f1", reason="a"),
            tool_call("fail", id="f2", reason="b"),
            tool_call("quick", id="q3", n=3),
        )
        agent = Agent(FakeModel(tool_turn(*calls)), tools.registry, max_consecutive_failures=2)
    else:
        calls = tuple(tool_call("quick", id=f"q{n}", n=n) for n in (1, 2, 3))
        agent = Agent(FakeModel(tool_turn(*calls)), tools.registry, strict_hooks=True)
        agent.on("before_tool", lambda event: 1 / (event.tool_call.id != "q1"))
    traced(agent, spans)
    result = drive(agent, "async")
    assert result.reason == stop
    assert "q3" in result.evidence["also_ran"]
    spans.all_ended_once()
    assert Counter({call: len(found) for call, found in spans.tools().items()}) == tools.ran
    assert unfinished_calls(spans) == set()
    (q3,) = spans.tools()["q3"]
    assert q3.status.status_code.name == "UNSET"


def test_a_cancelled_batch_resumed_has_one_span_per_execution(spans: Spans) -> None:
    """q1 and q2 finished before the cut, s1 was cut in flight and made again by the resume."""
    tools = Counted()
    tools.hang.add("s1")
    calls = (tool_call("quick", id="q1", n=1), tool_call("slow", id="s1"), tool_call("quick", id="q2", n=2))
    agent = Agent(FakeModel(tool_turn(*calls), reply("x")), tools.registry)
    traced(agent, spans)
    run = agent.start("q")

    async def main() -> None:
        task = asyncio.ensure_future(run.afinish())
        for _ in range(1000):
            if "q2" in run.position.calls.ran:
                break
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert run.result.reason == "cancelled"
    assert unfinished_calls(spans) == {"s1"}
    tools.hang.clear()
    result = finish(agent.resume(run.result), "async")
    assert result.final == "x"
    spans.all_ended_once()
    assert Counter({call: len(found) for call, found in spans.tools().items()}) == tools.ran
    assert tools.ran == Counter({"q1": 1, "q2": 1, "s1": 2})
    first, second = spans.named("invoke_agent")
    assert edges_of(first) + edges_of(second) == edges(result)
    assert attributes(second)["fsm_agent.resumed"] is True


# --- a Ctrl-C in one call of a batch ------------------------------------------------------------------------------


def _ctrl_c_batch(spans: Spans) -> tuple[Agent, Counted]:
    tools = Counted()
    calls = (tool_call("quick", id="q1", n=1), tool_call("ctrl_c", id="k1"), tool_call("quick", id="q2", n=2))
    agent = Agent(FakeModel(tool_turn(*calls), reply("x")), tools.registry)
    traced(agent, spans)
    return agent, tools


def test_a_ctrl_c_in_a_batch_leaves_no_span_open(spans: Spans) -> None:
    agent, tools = _ctrl_c_batch(spans)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(agent.arun("q"))
    spans.all_ended_once()
    (run,) = spans.named("invoke_agent")
    assert attributes(run)["fsm_agent.unfinished"] is True
    assert run.status.status_code.name == "ERROR"
    assert Counter({call: len(found) for call, found in spans.tools().items()}) == tools.ran


def test_a_ctrl_c_in_a_batch_ends_the_calls_that_finished_as_finished(spans: Spans) -> None:
    agent, _ = _ctrl_c_batch(spans)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(agent.arun("q"))
    assert unfinished_calls(spans) == {"k1"}


def test_a_ctrl_c_in_a_batch_names_the_interrupt_on_the_run_span(spans: Spans) -> None:
    agent, _ = _ctrl_c_batch(spans)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(agent.arun("q"))
    (run,) = spans.named("invoke_agent")
    assert attributes(run)["error.type"] == "KeyboardInterrupt"


# --- retried, finalized, refused by the store ------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_model_call_retried_after_an_error_has_one_chat_span_per_call(spans: Spans, driver: str) -> None:
    model = FakeModel(
        tool_turn(tool_call("echo", id="e1", text="a"), usage=Usage(3, 1)), RuntimeError("down"), reply("ok")
    )
    agent = Agent(model, demo_registry())
    traced(agent, spans)
    stopped = drive(agent, driver)
    assert stopped.reason == "model_error"
    result = finish(agent.resume(stopped, retry=True), driver)
    assert result.final == "ok"
    spans.all_ended_once()
    chats = spans.named("chat")
    assert [span.status.status_code.name for span in chats] == ["UNSET", "ERROR", "UNSET"]
    assert attributes(chats[1])["error.type"] == "RuntimeError"
    first, second = spans.named("invoke_agent")
    assert attributes(first)["error.type"] == "model_error"
    assert attributes(second)["fsm_agent.resumed"] is True
    assert edges_of(first) + edges_of(second) == edges(result)
    for chat in chats:
        assert chat.parent is not None
    assert [chat.parent.span_id for chat in chats] == [  # type: ignore[union-attr]
        first.context.span_id,
        first.context.span_id,
        second.context.span_id,
    ]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_finalize_call_is_a_chat_span_of_the_run_and_counts_in_its_tokens(spans: Spans, driver: str) -> None:
    model = FakeModel(
        tool_turn(tool_call("echo", id="e1", text="a"), tool_call("echo", id="e2", text="b"), usage=Usage(5, 1)),
        reply("final", usage=Usage(7, 2)),
    )
    agent = Agent(model, demo_registry(), max_tool_calls=1, on_stop={"max_tool_calls": "finalize"})
    traced(agent, spans)
    result = drive(agent, driver)
    assert result.final == "final"
    spans.all_ended_once()
    (run,) = spans.named("invoke_agent")
    chats = spans.named("chat")
    assert [attributes(chat)["gen_ai.usage.input_tokens"] for chat in chats] == [5, 7]
    assert attributes(run)["gen_ai.usage.input_tokens"] == result.usage.input_tokens == 12
    assert attributes(run)["fsm_agent.stop_reason"] == "max_tool_calls"
    assert edges_of(run) == edges(result)
    assert [attributes(s)["gen_ai.tool.call.id"] for s in spans.named("execute_tool")] == ["e1"]


class RefusingStore(SqliteStore):
    """A SQLite store that refuses its ``refuse``-th journal append (sync or async), as a full disk would."""

    refuse = 0
    appends = 0

    def _count(self) -> None:
        self.appends += 1
        if self.appends == self.refuse:
            raise StoreError(str(self.path), "database or disk is full")

    def append(self, entry: Entry, *, owner: str) -> None:
        self._count()
        super().append(entry, owner=owner)

    async def aappend(self, entry: Entry, *, owner: str) -> None:
        self._count()
        await super().aappend(entry, owner=owner)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_run_whose_store_refused_a_write_ends_its_spans_and_a_new_owner_starts_one(
    spans: Spans, tmp_path: Path, driver: str
) -> None:
    path = tmp_path / "runs.db"
    tools = Counted()
    first = Agent(FakeModel(tool_turn(tool_call("quick", id="q1", n=1)), reply("never")), tools.registry)
    traced(first, spans)
    with RefusingStore(path, every="transition") as store:
        store.refuse = 6  # ExecuteTool -> AwaitModel, after q1 ran (it and the reply were written before their hooks)
        run = first.start("q", store=store, run_id="r1")
        with pytest.raises(StoreError):
            finish(run, driver)
        stored = store.load("r1")
        store.renew("r1", owner=run._journal.owner, seq=stored["stored_seq"], release=True)
    spans.all_ended_once()
    (cut,) = spans.named("invoke_agent")
    assert attributes(cut)["fsm_agent.unfinished"] is True
    assert attributes(cut)["error.type"] == "StoreError"
    (q1,) = spans.tools()["q1"]
    assert "fsm_agent.unfinished" not in attributes(q1)  # it ran and returned; only its write was refused
    second = Agent(FakeModel(reply("done")), tools.registry)
    traced(second, spans)
    with SqliteStore(path, every="transition") as store:
        result = finish(second.resume(store.load("r1"), store=store), driver)
    assert result.final == "done"
    spans.all_ended_once()
    cut, resumed = spans.named("invoke_agent")
    assert edges_of(cut) + edges_of(resumed) == edges(result)
    # q1's outcome was kept before the refused write: the new owner takes it in, no span and no call again
    assert Counter({call: len(found) for call, found in spans.tools().items()}) == tools.ran == Counter({"q1": 1})
    # resumed after an unfinished exit, not from Failed: its span is still marked so, and the first one is not
    assert attributes(resumed).get("fsm_agent.resumed") is True
    assert "fsm_agent.resumed" not in attributes(cut)


# --- a sub-agent cut with its parent's batch --------------------------------------------------------------------


def test_a_sub_agent_cut_with_its_parents_batch_ends_its_spans_under_the_calling_tool_span(spans: Spans) -> None:
    started = asyncio.Event()

    class Hanging:
        model = "hanging-1"

        def complete(self, messages: object, tools: object) -> Any:
            raise AssertionError("acomplete is awaited")

        async def acomplete(self, messages: object, tools: object) -> Any:
            started.set()
            await asyncio.Event().wait()

    tools = Counted()
    child = Agent(Hanging(), demo_registry())
    registry = tools.registry
    registry.register(child.as_tool("helper", "Ask the helper."))
    calls = (tool_call("quick", id="q1", n=1), tool_call("helper", id="h1", input="go"))
    parent = Agent(FakeModel(tool_turn(*calls), reply("x")), registry)
    traced(parent, spans, agent_name="boss")
    run = parent.start("q")

    async def main() -> None:
        task = asyncio.ensure_future(run.afinish())
        waiting = asyncio.ensure_future(started.wait())
        await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
        assert started.is_set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert run.result.reason == "cancelled"
    spans.all_ended_once()
    (helper_run,) = spans.named("invoke_agent helper")
    (h1,) = spans.tools()["h1"]
    assert helper_run.parent is not None
    assert helper_run.parent.span_id == h1.context.span_id
    assert attributes(helper_run)["fsm_agent.stop_reason"] == "cancelled"
    (helper_chat,) = spans.named("chat hanging-1")
    assert attributes(helper_chat)["fsm_agent.unfinished"] is True
    assert unfinished_calls(spans) == {"h1"}
