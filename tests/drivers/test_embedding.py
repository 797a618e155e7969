"""Embedding the loop in apps: hooks, event streams, the async driver, parallel tool calls, logs and serialisation."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

import fsm_agent
from fsm_agent import (
    TABLE,
    Agent,
    AgentLoopError,
    ModelResponse,
    RunResult,
    ToolCall,
    ToolRegistry,
    TransitionEvent,
)
from fsm_agent.definition.triggers import INTERRUPTED
from fsm_agent.observe.events import read_log
from fsm_agent.testing import (
    CounterModel,
    FakeModel,
    LoopingModel,
    demo_registry,
    edge_id,
    edges,
    reply,
    tool_call,
    tool_turn,
)

# --- both drivers run the same scenarios -------------------------------------------------------------------

Scenario = Callable[[], tuple[Any, ToolRegistry, dict[str, Any]]]
SCENARIOS: dict[str, tuple[Scenario, str, int]] = {
    "A_max_steps": (lambda: (CounterModel(), demo_registry(), {"max_steps": 3}), "max_steps", 3),
    "B_repeated_action": (
        lambda: (LoopingModel(ToolCall("c1", "echo", {"text": "ping"})), demo_registry(), {}),
        "repeated_action",
        1,
    ),
    "C_max_tokens": (
        lambda: (FakeModel([reply("我先算加法得", stop_reason="max_tokens")]), demo_registry(), {}),
        "max_tokens",
        0,
    ),
    "D_tool_failures": (
        lambda: (FakeModel([tool_turn(tool_call("fail", reason=str(i))) for i in range(3)]), demo_registry(), {}),
        "tool_failures",
        3,
    ),
    "E_done": (
        lambda: (
            FakeModel([tool_turn(tool_call("add", a=2, b=3), tool_call("add", a=1, b=1)), reply("5")]),
            demo_registry(),
            {},
        ),
        "done",
        3,
    ),
    "model_error": (lambda: (FakeModel([RuntimeError("down")]), demo_registry(), {}), "model_error", 0),
}


def _drive(driver: str, model: Any, registry: ToolRegistry, options: dict[str, Any]) -> RunResult:
    try:
        if driver == "sync":
            return fsm_agent.run(model, registry, "q", **options)
        return asyncio.run(fsm_agent.arun(model, registry, "q", **options))
    except AgentLoopError as exc:
        return exc.result


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_both_drivers_reach_the_same_outcome(driver: str, name: str) -> None:
    """The async driver passes the same scenarios as the sync one: same reason, steps and trace."""
    make, reason, steps = SCENARIOS[name]
    result = _drive(driver, *make())
    reference = _drive("sync", *make())
    assert (result.reason, len(result.steps)) == (reason, steps)
    assert edges(result) == edges(reference)
    assert [(m.role, m.content) for m in result.messages] == [(m.role, m.content) for m in reference.messages]


def test_async_driver_prefers_acomplete_and_threads_a_sync_complete() -> None:
    """An async model's acomplete is awaited; a sync-only model runs in a worker thread, off the event loop."""
    threads: list[str] = []

    class Both:
        def complete(self, messages: object, tools: object) -> ModelResponse:
            raise AssertionError("acomplete must be preferred")

        async def acomplete(self, messages: object, tools: object) -> ModelResponse:
            return reply("async answer")

    class SyncOnly:
        def complete(self, messages: object, tools: object) -> ModelResponse:
            threads.append(threading.current_thread().name)
            return reply("sync answer")

    assert asyncio.run(fsm_agent.arun(Both(), demo_registry(), "q")).final == "async answer"
    assert asyncio.run(fsm_agent.arun(SyncOnly(), demo_registry(), "q")).final == "sync answer"
    assert threads
    assert threads[0] != threading.main_thread().name


# --- hooks -------------------------------------------------------------------------------------------------


def _record_all(agent: Agent) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []
    for name in fsm_agent.observe.events.HOOK_NAMES:
        agent.on(name, lambda event, name=name: seen.append((name, event)))
    return seen


def test_hooks_fire_in_order_around_every_transition_and_call() -> None:
    """before/after model and tool calls, then leave, enter, transition for each edge, in run order."""
    agent = Agent(FakeModel([tool_turn(tool_call("echo", text="x")), reply("fin")]), demo_registry())
    seen = _record_all(agent)
    agent.run("q")
    assert [name for name, _ in seen] == [
        "before_model",
        "after_model",
        *("leave:AwaitModel", "enter:CheckTruncation", "transition"),
        *("leave:CheckTruncation", "enter:Dispatch", "transition"),
        *("leave:Dispatch", "enter:ExecuteTool", "transition"),
        "before_tool",
        "after_tool",
        *("leave:ExecuteTool", "enter:AwaitModel", "transition"),
        "before_model",
        "after_model",
        *("leave:AwaitModel", "enter:CheckTruncation", "transition"),
        *("leave:CheckTruncation", "enter:Dispatch", "transition"),
        *("leave:Dispatch", "enter:Done", "transition"),
    ]
    events = [e for name, e in seen if name == "transition"]
    assert events[0].response is not None
    assert events[0].response.stop_reason == "tool_use"
    assert events[2].tool_call is not None
    assert events[2].tool_call.name == "echo"
    assert (events[3].tool_result, events[3].tool_error) == ('"x"', None)
    assert events[-1].result is not None
    assert events[-1].result.final == "fin"
    assert events[3].counters["tool_calls"][0] == 1


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_hooks_and_streams_carry_every_transition_on_every_path(driver: str, name: str) -> None:
    """On each scenario, in both drivers, transition hooks and the stream see exactly the trace, in order."""
    model, registry, options = SCENARIOS[name][0]()
    agent = Agent(model, registry, **options)
    hooked: list[TransitionEvent] = []
    failed: list[TransitionEvent] = []
    agent.on("transition", hooked.append)
    agent.on("failed", failed.append)
    result = _drive_agent(driver, agent)
    assert [e.transition for e in hooked] == list(result.trace)
    assert [e.reason for e in failed] == ([] if result.ok else [result.reason])
    assert hooked[-1].result == result
    model, registry, options = SCENARIOS[name][0]()
    streamed = _stream(driver, Agent(model, registry, **options))
    assert [e.transition for e in streamed] == list(result.trace)


def _drive_agent(driver: str, agent: Agent) -> RunResult:
    try:
        return agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    except AgentLoopError as exc:
        return exc.result


def _stream(driver: str, agent: Agent) -> list[TransitionEvent]:
    got: list[TransitionEvent] = []

    async def collect() -> None:
        async for event in agent.astream("q"):
            got.append(event)

    with contextlib.suppress(AgentLoopError):
        if driver == "sync":
            got.extend(agent.stream("q"))
        else:
            asyncio.run(collect())
    return got


def test_failed_hook_gets_reason_and_evidence() -> None:
    """A transition into Failed calls the failed hook with the reason and its evidence."""
    agent = Agent(CounterModel(), demo_registry(), max_steps=2)
    failures: list[TransitionEvent] = []
    agent.on("failed", failures.append)
    with pytest.raises(AgentLoopError):
        agent.run("q")
    (event,) = failures
    assert (event.dest, event.reason) == ("Failed", "max_steps")
    assert event.evidence is not None
    assert event.evidence["limit"] == 2
    assert event.result is not None
    assert event.result.reason == "max_steps"


def test_hook_events_are_read_only() -> None:
    """Observers get frozen records: they cannot change what the run recorded."""
    agent = Agent(FakeModel([reply("x")]), demo_registry())

    @agent.on("transition")
    def tamper(event: TransitionEvent) -> None:
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            event.dest = "Failed"  # type: ignore[misc]

    assert agent.run("q").ok


def test_raising_hook_is_logged_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """Without strict_hooks a hook's exception is logged with logging and ignored."""
    agent = Agent(FakeModel([tool_turn(tool_call("echo", text="x")), reply("fin")]), demo_registry())
    agent.on("enter:ExecuteTool", lambda event: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="fsm_agent"):
        result = agent.run("q")
    assert result.final == "fin"
    assert any("enter:ExecuteTool" in r.getMessage() and r.exc_info for r in caplog.records)


def test_strict_hook_error_stops_the_run_at_the_next_transition() -> None:
    """With strict_hooks the run stops in Failed/hook_error, the hook's exception as cause."""
    agent = Agent(FakeModel([tool_turn(tool_call("echo", text="x")), reply("fin")]), demo_registry(), strict_hooks=True)
    boom = ValueError("observer bug")

    def fail(event: object) -> None:
        raise boom

    agent.on("enter:ExecuteTool", fail)
    with pytest.raises(AgentLoopError) as info:
        agent.run("q")
    assert info.value.reason == "hook_error"
    assert info.value.__cause__ is boom
    assert info.value.evidence["error"] == "observer bug"
    assert edges(info.value.result)[-1] == "ExecuteTool->Failed[hook_error]"
    # The hook fired on entering ExecuteTool; the next transition is the one after that state's tool call.
    assert len(info.value.result.steps) == 1


def test_strict_hook_error_does_not_discard_a_complete_answer() -> None:
    """Dispatch->Done stays first: an answer that arrived survives a hook error raised on the way."""
    agent = Agent(FakeModel([reply("the answer")]), demo_registry(), strict_hooks=True)
    agent.on("enter:Dispatch", lambda event: 1 / 0)
    assert agent.run("q").final == "the answer"


def test_strict_hook_error_in_after_model_stops_before_truncation_check() -> None:
    """A strict hook raising in after_model stops the run on the very next edge."""
    agent = Agent(FakeModel([reply("x")]), demo_registry(), strict_hooks=True)
    agent.on("after_model", lambda event: 1 / 0)
    with pytest.raises(AgentLoopError) as info:
        agent.run("q")
    assert edges(info.value.result) == ["AwaitModel->Failed[hook_error]"]


def test_unknown_hook_name_is_rejected() -> None:
    """A typo in a hook name fails at registration, listing the valid names."""
    with pytest.raises(ValueError, match="unknown hook 'enter:Nowhere'"):
        Agent(FakeModel([]), demo_registry()).on("enter:Nowhere", print)


# --- streams -----------------------------------------------------------------------------------------------


def test_stream_yields_one_event_per_transition_and_ends_on_done() -> None:
    """The stream carries the trace, event by event; the last event holds the result."""
    agent = Agent(FakeModel([tool_turn(tool_call("echo", text="x")), reply("fin")]), demo_registry())
    hooked: list[TransitionEvent] = []
    agent.on("transition", hooked.append)
    streamed = list(agent.stream("q"))
    assert streamed[-1].result is not None
    assert [e.transition for e in streamed] == list(streamed[-1].result.trace)
    assert [e.seq for e in streamed] == list(range(len(streamed)))
    assert [e.to_dict() for e in streamed] == [e.to_dict() for e in hooked]


def test_stream_raises_after_yielding_the_failed_event() -> None:
    """On a stop the Failed transition is yielded, then AgentLoopError is raised like run."""
    got: list[TransitionEvent] = []
    with pytest.raises(AgentLoopError) as info:
        got.extend(Agent(CounterModel(), demo_registry(), max_steps=1).stream("q"))
    assert got[-1].dest == "Failed"
    assert got[-1].reason == info.value.reason == "max_steps"


def test_astream_matches_stream() -> None:
    """The async stream yields the same edges as the sync one."""

    async def collect() -> list[str]:
        agent = Agent(FakeModel([tool_turn(tool_call("echo", text="x")), reply("fin")]), demo_registry())
        return [edge_id(e.transition) async for e in agent.astream("q")]

    agent = Agent(FakeModel([tool_turn(tool_call("echo", text="x")), reply("fin")]), demo_registry())
    assert asyncio.run(collect()) == [edge_id(e.transition) for e in agent.stream("q")]


# --- parallel tool calls -----------------------------------------------------------------------------------


def test_calls_of_one_turn_run_concurrently_and_messages_keep_the_asked_order() -> None:
    """Three calls that each wait for all three to start can only finish together; order is as asked."""
    registry = ToolRegistry()
    barrier = threading.Barrier(3, timeout=5)
    finished: list[str] = []

    @registry.register
    def meet(name: str, delay_rank: int) -> str:
        """Wait until all three calls are running, then finish in reverse order."""
        barrier.wait()
        finished.append(name)
        return name

    calls = [tool_call("meet", id=f"m{i}", name=f"n{i}", delay_rank=i) for i in range(3)]
    result = asyncio.run(fsm_agent.arun(FakeModel([tool_turn(*calls), reply("met")]), registry, "q"))
    assert result.final == "met"
    tool_messages = [m for m in result.messages if m.role == "tool"]
    assert [m.tool_call_id for m in tool_messages] == ["m0", "m1", "m2"]
    assert sorted(finished) == ["n0", "n1", "n2"]
    trace = edges(result)
    assert trace.count("Dispatch->ExecuteTool") == 3
    assert trace.count("ExecuteTool->Dispatch[has_pending_calls]") == 2


def test_guard_at_call_k_lets_earlier_calls_finish_then_stops() -> None:
    """With a cap of 2 and four calls, calls 1-2 run, call 3 stops the run, call 4 never runs."""
    ran: list[int] = []
    registry = ToolRegistry()
    registry.register(lambda n: ran.append(n) or n, name="work")
    calls = [tool_call("work", id=f"w{i}", n=i) for i in range(4)]
    with pytest.raises(AgentLoopError) as info:
        asyncio.run(fsm_agent.arun(FakeModel([tool_turn(*calls)]), registry, "q", max_tool_calls=2))
    assert info.value.reason == "max_tool_calls"
    assert sorted(ran) == [0, 1]
    assert [c.id for c in info.value.result.pending] == ["w2", "w3"]
    assert edges(info.value.result)[-1] == "Dispatch->Failed[max_tool_calls]"


def test_after_tool_stop_in_a_batch_is_recorded_after_every_call_that_ran() -> None:
    """Two failures stop the run mid-batch, yet the later calls that ran keep their tool messages."""
    calls = [tool_call("fail", id=f"f{i}", reason=str(i)) for i in range(2)] + [tool_call("echo", id="ok", text="y")]
    with pytest.raises(AgentLoopError) as info:
        asyncio.run(fsm_agent.arun(FakeModel([tool_turn(*calls)]), demo_registry(), "q", max_consecutive_failures=2))
    result = info.value.result
    assert result.reason == "tool_failures"
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == ["f0", "f1", "ok"]
    assert info.value.evidence["also_ran"] == ["ok"]
    assert result.pending == ()
    assert edges(result)[-1] == "ExecuteTool->Failed[tool_failures]"


def test_max_concurrency_limits_calls_in_flight() -> None:
    """max_concurrency=1 runs the calls of a turn one at a time."""
    in_flight = 0
    peak = 0
    lock = threading.Lock()
    registry = ToolRegistry()

    @registry.register
    def track(n: int) -> int:
        """Count calls running at once."""
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        threading.Event().wait(0.01)
        with lock:
            in_flight -= 1
        return n

    calls = [tool_call("track", n=i) for i in range(4)]
    asyncio.run(fsm_agent.arun(FakeModel([tool_turn(*calls), reply("ok")]), registry, "q", max_concurrency=1))
    assert peak == 1


# --- cancellation of the driving task ----------------------------------------------------------------------


async def _cancelled_when(run: fsm_agent.AgentRun, ready: Callable[[], bool]) -> fsm_agent.AgentRun:
    """Cancel the task driving ``run`` to its end as soon as ``ready()``; the CancelledError must come out."""
    task = asyncio.ensure_future(run.afinish())
    while not ready():
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return run


def test_cancelling_the_task_records_failed_cancelled_then_propagates() -> None:
    """Cancelling arun while the model call is in flight leaves a Failed/cancelled run with everything so far."""

    class Slow:
        def __init__(self) -> None:
            self.calls = 0

        def complete(self, messages: object, tools: object) -> ModelResponse:
            raise AssertionError("unused")

        async def acomplete(self, messages: object, tools: object) -> ModelResponse:
            self.calls += 1
            if self.calls == 1:
                return tool_turn(tool_call("echo", text="first"))
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

    model = Slow()
    run = asyncio.run(_cancelled_when(Agent(model, demo_registry()).start("q"), lambda: model.calls >= 2))
    assert (run.state, run.result.reason) == ("Failed", "cancelled")
    assert edges(run.result)[-1] == "AwaitModel->Failed[cancelled]"
    assert run.result.messages[-1].content == '"first"'


@pytest.mark.parametrize("watched", [False, True], ids=["unwatched", "watched"])
def test_cancelling_the_task_mid_batch_keeps_the_finished_calls_and_a_resume_runs_only_the_rest(watched: bool) -> None:
    """ExecuteTool->Failed[cancelled] mid-batch: calls that finished never run again, the one cut runs once more.

    A run nobody watches is driven by a loop of its own; both loops must keep the same calls.
    """
    ran: collections.Counter[str] = collections.Counter()
    registry = ToolRegistry()

    @registry.register
    async def quick(n: int) -> int:
        """Return n at once."""
        ran[f"quick{n}"] += 1
        return n

    @registry.register
    async def slow() -> str:
        """Hang the first time, answer the second."""
        ran["slow"] += 1
        if ran["slow"] == 1:
            await asyncio.sleep(3600)
        return "late"

    calls = [tool_call("quick", n=1), tool_call("slow"), tool_call("quick", n=2)]
    agent = Agent(FakeModel([tool_turn(*calls), reply("ok")]), registry)
    seen: list[object] = []

    run = agent.start("q", observers=[seen.append] if watched else [])
    asyncio.run(_cancelled_when(run, lambda: ran["slow"] >= 1 and ran["quick2"] >= 1))
    assert edges(run.result)[-1] == "ExecuteTool->Failed[cancelled]"
    assert run.result.evidence["unfinished"] == calls[1].id
    assert bool(seen) is watched
    result = asyncio.run(agent.resume(run.result).afinish())
    assert result.final == "ok"
    assert ran == {"quick1": 1, "slow": 2, "quick2": 1}
    assert [m.content for m in result.messages if m.role == "tool"] == ["1", '"late"', "2"]


def test_interrupted_edges_exist_out_of_await_model_dispatch_and_execute_tool() -> None:
    """The table has a cancelled edge on the interrupted trigger out of each state that waits: on a call, or on a
    typed answer's check (Dispatch)."""
    sources = {str(r.source) for r in TABLE.rows if r.trigger == INTERRUPTED and r.reason == "cancelled"}
    assert sources == {"AwaitModel", "Dispatch", "ExecuteTool"}


# --- logs and serialisation --------------------------------------------------------------------------------


def test_jsonl_log_has_one_readable_line_per_transition(tmp_path: Path) -> None:
    """run(..., log=path) writes the trace as JSON Lines that read_log turns back into transitions."""
    path = tmp_path / "run.jsonl"
    result = fsm_agent.run(
        FakeModel([tool_turn(tool_call("echo", text="x")), reply("fin")]), demo_registry(), "q", log=path
    )
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(result.trace)
    assert json.loads(lines[3])["tool_result"] == '"x"'
    assert read_log(path) == result.trace


def test_read_log_names_a_bad_line(tmp_path: Path) -> None:
    """A corrupted log line is reported with its file and line number."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"source": "AwaitModel"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a transition line"):
        read_log(path)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_result_round_trips_through_json_losslessly(name: str) -> None:
    """to_json then from_json gives an equal RunResult: messages, steps, trace, reason, evidence, usage."""
    make, _, _ = SCENARIOS[name]
    result = _drive("sync", *make())
    again = RunResult.from_json(result.to_json())
    assert again == result
    assert again.snapshot == result.snapshot
    assert again.to_dict()["version"] == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"format": "fsm_agent.RunResult", "version": 99}, "unsupported RunResult format"),
        ({"format": "something else", "version": 1}, "unsupported RunResult format"),
        ({"format": "fsm_agent.RunResult", "version": 1, "messages": []}, "malformed RunResult dict: KeyError"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_from_dict_rejects_wrong_versions_and_shapes(data: object, message: str) -> None:
    """A result of another version or shape is a clear ValueError, never a half-built result."""
    with pytest.raises(ValueError, match=message):
        RunResult.from_dict(data)


def test_diagram_overlay_accepts_a_log_and_a_result_file(tmp_path: Path) -> None:
    """The run-path diagram reads a JSON Lines log and a RunResult JSON file and highlights the same edges."""
    from fsm_agent.cli.diagram import load_run
    from fsm_agent.render.model import diagram_edges

    log = tmp_path / "run.jsonl"
    with pytest.raises(AgentLoopError) as info:
        fsm_agent.run(CounterModel(), demo_registry(), "q", max_steps=2, log=log)
    saved = tmp_path / "run.json"
    saved.write_text(info.value.result.to_json(), encoding="utf-8")
    taken = {
        source: [(e.index, e.count, e.final) for e in diagram_edges(TABLE, load_run(source)) if e.count]
        for source in (log, saved)
    }
    assert taken[log] == taken[saved]
    assert sum(count for _, count, _ in taken[log]) == len(info.value.result.trace)
    assert load_run(log).reason == "max_steps"


# --- async tools and per-tool timeouts ---------------------------------------------------------------------


def _async_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    async def fetch(url: str, delay: float = 0.0) -> str:
        """Pretend to fetch a page, asynchronously."""
        await asyncio.sleep(delay)
        return f"page {url}"

    @registry.register
    def block(seconds: float) -> str:
        """A sync tool that blocks its thread."""
        threading.Event().wait(seconds)
        return "unblocked"

    return registry


def test_async_tools_run_in_both_drivers() -> None:
    """An async def tool is awaited by the async driver and run on its own loop by the sync one."""
    script = [tool_turn(tool_call("fetch", url="a")), reply("ok")]
    sync = fsm_agent.run(FakeModel(script), _async_registry(), "q")
    asyn = asyncio.run(fsm_agent.arun(FakeModel(script), _async_registry(), "q"))
    assert [m.content for m in sync.messages if m.role == "tool"] == ['"page a"']
    assert [m.content for m in asyn.messages if m.role == "tool"] == ['"page a"']


def test_sync_driver_runs_an_async_tool_even_inside_a_running_loop() -> None:
    """Calling the sync driver from async code still completes an async tool (on a loop in another thread)."""

    async def main() -> RunResult:
        return fsm_agent.run(FakeModel([tool_turn(tool_call("fetch", url="b")), reply("ok")]), _async_registry(), "q")

    assert [m.content for m in asyncio.run(main()).messages if m.role == "tool"] == ['"page b"']


def test_tool_timeout_turns_an_overrun_into_a_failure_in_both_drivers() -> None:
    """A tool past tool_timeout becomes an error result that counts toward tool_failures."""
    script = [tool_turn(tool_call("fetch", url="slow", delay=5), tool_call("block", seconds=5)), reply("ok")]
    for drive in (fsm_agent.run, lambda *a, **k: asyncio.run(fsm_agent.arun(*a, **k))):
        result = drive(FakeModel(list(script)), _async_registry(), "q", tool_timeout=0.05, max_consecutive_failures=3)
        errors = [json.loads(m.content)["error"] for m in result.messages if m.role == "tool"]
        assert errors == ["tool 'fetch' timed out after 0.05 s", "tool 'block' timed out after 0.05 s"]
        assert result.steps[1].counters["failures"] == [2, 3]


def test_invalid_tool_timeout_is_rejected() -> None:
    """tool_timeout must be a positive finite number of seconds."""
    with pytest.raises(ValueError, match="tool_timeout must be None or a finite number of seconds > 0"):
        Agent(FakeModel([]), demo_registry(), tool_timeout=0)


def test_eight_async_calls_of_a_turn_are_all_in_flight_at_once() -> None:
    """The eight async calls of one turn overlap: all eight are running before any finishes."""
    registry = ToolRegistry()
    running: list[int] = []
    peak = 0

    @registry.register
    async def probe(n: int) -> int:
        """Stay in flight for a few loop iterations."""
        nonlocal peak
        running.append(n)
        peak = max(peak, len(running))
        for _ in range(5):
            await asyncio.sleep(0)
        running.remove(n)
        return n

    calls = [tool_call("probe", n=i) for i in range(8)]
    asyncio.run(fsm_agent.arun(FakeModel([tool_turn(*calls), reply("ok")]), registry, "q"))
    assert peak == 8
