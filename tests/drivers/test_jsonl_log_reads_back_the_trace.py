"""A run's JSON Lines log reads back (``read_log``) to exactly its trace: after a stop, a resume, a fork, a crash.

Both drivers. The log's lines also carry the payload exactly, lone
surrogates and astral characters included, and a run cut off by a
``KeyboardInterrupt`` or a cancelled task leaves in the file every
transition it made.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, RunResult, ToolRegistry
from fsm_agent.observe.events import JsonlLog, read_log
from fsm_agent.testing import CounterModel, FakeModel, demo_registry, reply, tool_call, tool_turn

ODD = "😀 \ud83d 𝄞 \udc00"


def drive(agent: Agent, driver: str, log: Path) -> RunResult:
    try:
        return agent.run("q", log=log) if driver == "sync" else asyncio.run(agent.arun("q", log=log))
    except AgentLoopError as stop:
        return stop.result


def finish(run: Any, driver: str) -> RunResult:
    try:
        return run.finish() if driver == "sync" else asyncio.run(run.afinish())
    except AgentLoopError as stop:
        return stop.result


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_payload_reads_back_exactly(tmp_path: Path, driver: str) -> None:
    """Replies and tool results with astral characters and lone surrogates come back from the file unchanged."""
    model = FakeModel(tool_turn(tool_call("echo", id="e1", text=ODD), content=ODD), reply(f"said {ODD}"))
    log = tmp_path / "run.jsonl"
    result = drive(Agent(model, demo_registry()), driver, log)
    assert result.final == f"said {ODD}"
    assert read_log(log) == result.trace
    entries = lines(log)
    assert [entry["seq"] for entry in entries] == list(range(len(result.trace)))
    contents = [entry["response"]["content"] for entry in entries if "response" in entry]
    assert contents == [m.content for m in result.messages if m.role == "assistant"]
    results = [entry["tool_result"] for entry in entries if "tool_result" in entry]
    assert results == [m.content for m in result.messages if m.role == "tool"]
    assert json.loads(results[0]) == ODD


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_resumed_run_appended_to_its_log_reads_back_to_its_whole_trace(tmp_path: Path, driver: str) -> None:
    model = FakeModel(
        tool_turn(tool_call("echo", id="e1", text="a")), tool_turn(tool_call("echo", id="e2", text="b")), reply("ok")
    )
    agent = Agent(model, demo_registry(), max_steps=1)
    log = tmp_path / "run.jsonl"
    stopped = drive(agent, driver, log)
    assert stopped.reason == "max_steps"
    assert read_log(log) == stopped.trace
    appended = JsonlLog(log)
    try:
        result = finish(agent.resume(stopped, max_steps=4, observers=[appended]), driver)
    finally:
        appended.close()
    assert result.ok
    assert result.trace[len(stopped.trace)].trigger == "resume"
    assert read_log(log) == result.trace
    assert [entry["seq"] for entry in lines(log)] == list(range(len(result.trace)))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_logged_after_its_sources_first_lines_reads_back_to_its_trace(tmp_path: Path, driver: str) -> None:
    source_log = tmp_path / "source.jsonl"
    source = drive(
        Agent(
            FakeModel(
                tool_turn(tool_call("echo", id="e1", text="a")),
                tool_turn(tool_call("echo", id="e2", text="b")),
                reply("x"),
            ),
            demo_registry(),
        ),
        driver,
        source_log,
    )
    at = 3
    fork_log = tmp_path / "fork.jsonl"
    kept = source_log.read_text(encoding="utf-8").splitlines(keepends=True)[: at + 1]
    fork_log.write_text("".join(kept), encoding="utf-8")
    appended = JsonlLog(fork_log)
    try:
        run = Agent(FakeModel(reply("forked")), demo_registry()).fork(source, at, observers=[appended])
        result = finish(run, driver)
    finally:
        appended.close()
    assert result.final == "forked"
    assert read_log(fork_log) == result.trace
    assert [entry["seq"] for entry in lines(fork_log)] == list(range(len(result.trace)))


def _ctrl_c_registry() -> ToolRegistry:
    registry = demo_registry()

    @registry.register
    def ctrl_c() -> str:
        """A Ctrl-C while the tool runs."""
        raise KeyboardInterrupt

    return registry


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_run_cut_by_a_keyboard_interrupt_leaves_every_transition_it_made(tmp_path: Path, driver: str) -> None:
    model = FakeModel(
        tool_turn(tool_call("echo", id="e1", text="a")), tool_turn(tool_call("ctrl_c", id="k1")), reply("never")
    )
    agent = Agent(model, _ctrl_c_registry())
    log = tmp_path / "run.jsonl"
    kept = JsonlLog(log)
    run = agent.start("q", observers=[kept])
    try:
        with pytest.raises(KeyboardInterrupt):
            run.finish() if driver == "sync" else asyncio.run(run.afinish())
    finally:
        kept.close()
    assert not run.done
    assert read_log(log) == tuple(run.trace)
    assert run.trace[-1].dest == "ExecuteTool"
    assert [t.dest for t in run.trace].count("ExecuteTool") == 2
    # With log= the file is closed by the run, and holds the same edges.
    other = tmp_path / "other.jsonl"
    with pytest.raises(KeyboardInterrupt):
        drive(Agent(FakeModel(*model.responses), _ctrl_c_registry()), driver, other)
    assert read_log(other) == tuple(run.trace)


def test_a_cancelled_task_leaves_its_cancelled_edge_in_the_log(tmp_path: Path) -> None:
    class Hanging(CounterModel):
        async def acomplete(self, messages: Any, tools: Any) -> Any:
            if self.n >= 2:
                await asyncio.sleep(3600)
            return self.complete(messages, tools)

    log = tmp_path / "run.jsonl"
    model = Hanging()
    kept = JsonlLog(log)
    run = Agent(model, demo_registry()).start("q", observers=[kept])

    async def main() -> None:
        task = asyncio.ensure_future(run.afinish())
        for _ in range(1000):
            if model.n >= 2 and run.state == "AwaitModel":
                break
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
    finally:
        kept.close()
    assert run.result.reason == "cancelled"
    assert read_log(log) == run.result.trace
    assert lines(log)[-1]["evidence"] == json.loads(json.dumps(run.result.evidence, default=str))
