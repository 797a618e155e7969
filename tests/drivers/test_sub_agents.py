"""Agents that call agents: a child run bounded by its parent, stored beside it, never run twice.

Tools count their calls in parent and child alike; every behaviour runs on
both drivers, and the crash tests kill the process (``os._exit``) on both
stores.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.children_of_a_start import child_start_of
from support.store_cases import Ticks, dying_store, in_child, tick_registry

from fsm_agent import (
    Agent,
    AgentLoopError,
    CancelToken,
    Message,
    ModelResponse,
    RunLeasedError,
    RunResult,
    SqliteStore,
    ToolRegistry,
    Usage,
)
from fsm_agent.jsontext import input_digest
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, ManualClock, demo_registry, edges, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

DRIVERS = ["sync", "async"]


def finish(agent: Agent, driver: str, **options: Any) -> RunResult:
    """Run ``agent`` on the sync or the async driver."""
    if driver == "sync":
        return agent.run("plan a trip", **options)
    return asyncio.run(agent.arun("plan a trip", **options))


def _parent(child: Agent, script: list[Any], *, on_child_stop: str = "error", **options: Any) -> Agent:
    registry = demo_registry()
    registry.register(child.as_tool("research", "Answers one research question.", on_child_stop=on_child_stop))  # type: ignore[arg-type]
    return Agent(FakeModel(script), registry, **options)


def told(result: RunResult) -> str:
    """What the sub-agent's tool call told the parent's model."""
    return next(m.content for m in result.messages if m.role == "tool" and m.tool_call_id == "c1")


def _asks(question: str = "capital of France?", call_id: str = "c1", usage: Usage | None = None) -> ModelResponse:
    return tool_turn(tool_call("research", id=call_id, input=question), usage=usage)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_sub_agent_answers_as_a_tool_and_the_parent_step_names_its_run(driver: str) -> None:
    """The child's answer is the tool's JSON result; the step names the run <parent id>/<call id>."""
    child_model = FakeModel(reply("Paris"))
    child = Agent(child_model, ToolRegistry())
    result = finish(_parent(child, [_asks(), reply("It is Paris.")]), driver, run_id="trip")
    assert result.final == "It is Paris."
    assert told(result) == '"Paris"'
    assert result.steps[0].child == "trip/c1"
    assert child_model.seen[0][-1].content == "capital of France?"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_typed_child_returns_its_output_as_the_tools_json(driver: str) -> None:
    """A child with an output_type hands the parent its validated output, not its text."""
    point = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    child = Agent(FakeModel(reply('{"x": "1"}'), reply('```json\n{"x": 1}\n```')), ToolRegistry(), output_type=point)
    result = finish(_parent(child, [_asks(), reply("done")]), driver)
    assert json.loads(told(result)) == {"x": 1}


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_child_using_80_of_the_parents_100_tokens_makes_the_parent_stop_on_token_budget(driver: str) -> None:
    """The child's tokens are the parent's: 20 of its own plus 80 of the child's spend the budget of 100."""
    child = Agent(
        FakeModel(tool_turn(tool_call("echo", text="a"), usage=Usage(30, 10)), reply("x", usage=Usage(30, 10))),
        demo_registry(),
    )
    parent = _parent(child, [_asks(usage=Usage(10, 10)), reply("never")], token_budget=100)
    with pytest.raises(AgentLoopError) as caught:
        finish(parent, driver)
    result = caught.value.result
    assert edges(result)[-1] == "ExecuteTool->Failed[token_budget]"
    assert (result.evidence["tokens"], result.usage) == (100, Usage(70, 30))


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_child_gets_only_what_is_left_of_the_parents_budget(driver: str) -> None:
    """The child's budget is what the parent has left (150 of 200); its stop is a tool error, then the parent's."""
    script = [tool_turn(tool_call("echo", text=str(i)), usage=Usage(20, 20)) for i in range(5)]
    child = Agent(FakeModel(script), demo_registry())
    parent = _parent(child, [_asks(usage=Usage(30, 20)), reply("never")], token_budget=200)
    with pytest.raises(AgentLoopError) as caught:
        finish(parent, driver)
    result = caught.value.result
    stop = json.loads(told(result))
    assert (stop["reason"], stop["evidence"]["budget"], stop["evidence"]["tokens"]) == ("token_budget", 150, 160)
    assert (result.reason, result.evidence["tokens"]) == ("token_budget", 210)


@pytest.mark.parametrize("driver", DRIVERS)
class Slow:
    """A tool that takes ``seconds`` unless released, and counts its calls."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0

    def wait(self) -> str:
        """Wait a while."""
        self.calls += 1
        time.sleep(self.seconds)
        return "late"


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_parent_deadline_bounds_a_slow_child(driver: str) -> None:
    """The child's timeout is what is left of the parent's: neither runs past the parent's deadline."""
    slow = Slow(3.0)
    registry = ToolRegistry()
    registry.register(slow.wait)
    child = Agent(FakeModel(tool_turn(tool_call("wait")), reply("never")), registry, timeout=60)
    parent = _parent(child, [_asks(), reply("never")], timeout=0.5)
    with pytest.raises(AgentLoopError) as caught:
        finish(parent, driver)
    result = caught.value.result
    assert result.reason == "timeout"
    assert slow.calls == 1
    if result.evidence.get("unfinished") == "c1":
        return  # the parent's deadline cut the call in flight, child run and all
    stop = json.loads(told(result))  # or the child stopped at its own deadline, the parent's, first
    assert stop["reason"] == "timeout"
    assert 0 < stop["evidence"]["timeout"] <= 0.5


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_childs_timeout_and_budget_are_what_the_parent_has_left(tmp_path: Path, driver: str) -> None:
    """4 of the parent's 10 seconds and 30 of its 100 tokens gone: the child runs under 6 s and 70 tokens."""
    clock = ManualClock()
    registry = ToolRegistry()

    def pass_time(seconds: float) -> str:
        """Let time pass on the parent's clock."""
        clock.advance(seconds)
        return "later"

    registry.register(pass_time)
    registry.register(Agent(FakeModel(reply("Paris")), ToolRegistry(), timeout=60).as_tool("research", "Looks up."))
    script = [tool_turn(tool_call("pass_time", seconds=4), usage=Usage(20, 10)), _asks(), reply("done")]
    parent = Agent(FakeModel(script), registry, clock=clock, timeout=10, token_budget=100)
    with SqliteStore(tmp_path / "runs.db") as store:
        finish(parent, driver, store=store, run_id="trip")
        limits = store.load("trip/c1")["limits"]
    assert (limits["timeout"], limits["token_budget"]) == (pytest.approx(6, abs=0.01), 70)


@pytest.mark.parametrize("driver", DRIVERS)
def test_cancelling_the_parent_stops_the_child(driver: str) -> None:
    """One cancel token: cancelled while the child works, the child stops cancelled, then the parent."""
    token = CancelToken()
    ran: list[str] = []
    registry = ToolRegistry()

    def press_stop(why: str) -> str:
        """Someone presses stop while the child is at work."""
        ran.append(why)
        token.cancel("the user left")
        return "ok"

    registry.register(press_stop)
    child = Agent(FakeModel(tool_turn(tool_call("press_stop", why="now")), reply("never")), registry)
    with pytest.raises(AgentLoopError) as caught:
        finish(_parent(child, [_asks(), reply("never")]), driver, cancel=token)
    result = caught.value.result
    assert result.reason == "cancelled"
    assert [c.id for c in result.pending] == ["c1"]
    assert result.evidence["unfinished"] == "c1"
    assert ran == ["now"]


def test_cancelling_the_parents_task_cancels_the_child_run() -> None:
    """On the async driver, cancelling the task awaiting the parent cancels the child in flight; both record it."""
    started = threading.Event()

    class Hanging:
        async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
            raise AssertionError("the async driver uses acomplete")

    child = Agent(Hanging(), ToolRegistry())
    parent = _parent(child, [_asks(), reply("never")])

    async def go() -> tuple[Any, Any]:
        run = parent.start("plan a trip", run_id="p")
        task = asyncio.ensure_future(run.afinish())
        while not started.is_set():
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return run.result, run

    result, _ = asyncio.run(go())
    assert result.reason == "cancelled"
    assert result.evidence["unfinished"] == "c1"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_child_that_stops_is_a_tool_error_the_parents_failure_counter_counts(driver: str) -> None:
    """on_child_stop="error": the stop's reason and evidence reach the model as a tool error, counted as a failure."""
    child = Agent(FakeModel(ConnectionError("child model down")), ToolRegistry())
    parent = _parent(child, [_asks(), reply("never")], max_consecutive_failures=1)
    with pytest.raises(AgentLoopError) as caught:
        finish(parent, driver)
    result = caught.value.result
    assert edges(result)[-1] == "ExecuteTool->Failed[tool_failures]"
    stop = json.loads(told(result))
    assert (stop["reason"], stop["evidence"]["error"]) == ("model_error", "child model down")
    assert result.evidence["last_error"].startswith("sub-agent 'research' stopped (model_error)")


@pytest.mark.parametrize("driver", DRIVERS)
def test_execute_tool_to_failed_child_stopped_passes_the_childs_stop_on(driver: str) -> None:
    """on_child_stop="raise": ExecuteTool->Failed[child_stopped], with the child's run, reason and evidence."""
    child = Agent(FakeModel(ConnectionError("child model down")), ToolRegistry())
    parent = _parent(child, [_asks(), reply("never")], on_child_stop="raise")
    with pytest.raises(AgentLoopError) as caught:
        finish(parent, driver, run_id="trip")
    result = caught.value.result
    assert edges(result)[-1] == "ExecuteTool->Failed[child_stopped]"
    evidence = result.evidence
    assert (evidence["child_run_id"], evidence["reason"]) == ("trip/c1", "model_error")
    assert evidence["evidence"]["error"] == "child model down"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stored_child_is_linked_to_its_parent(tmp_path: Path, driver: str) -> None:
    """With a store, the child is stored as <parent>/<call>, names its parent, and the parent's step names it."""
    child = Agent(FakeModel(reply("Paris")), ToolRegistry())
    with SqliteStore(tmp_path / "runs.db") as store:
        finish(_parent(child, [_asks(), reply("It is Paris.")]), driver, store=store, run_id="trip")
        stored_child, stored_parent = store.load("trip/c1"), store.load("trip")
    assert (stored_child["parent_run_id"], stored_child["state"], stored_child["final"]) == ("trip", "Done", "Paris")
    assert stored_parent["steps"][0]["child"] == "trip/c1"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_finished_stored_child_is_read_back_not_run_again(tmp_path: Path, driver: str) -> None:
    """A parent that finds its call's child finished in the store (it died after the child) takes that answer."""
    child_model = FakeModel(reply("Paris"))
    child = Agent(child_model, ToolRegistry())
    with SqliteStore(tmp_path / "runs.db") as store:
        parent = _parent(child, [_asks(), reply("It is Paris.")]).start("trip", store=store, run_id="trip")
        link = {"parent_run_id": "trip", "parent_call_id": "c1", "input_digest": input_digest("capital of France?")}
        done = child._begin(  # the child this parent began, as its driver begins it; then the parent died
            "capital of France?", None, (), store, "trip/c1", parent=link, start_id=child_start_of(parent, "c1")
        )
        done._open_store(new=True)
        done.finish()
        result = parent.finish() if driver == "sync" else asyncio.run(parent.afinish())
    assert told(result) == '"Paris"'
    assert len(child_model.seen) == 1
    assert result.steps[0].child == "trip/c1"


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_unfinished_stored_child_goes_on_from_its_own_checkpoint(tmp_path: Path, driver: str) -> None:
    """A child cut after its tool call is resumed, not restarted: its completed call does not run again."""
    calls: list[str] = []
    registry = ToolRegistry()

    def look_up(city: str) -> str:
        """Look one city up."""
        calls.append(city)
        return "capital"

    registry.register(look_up)
    script = [tool_turn(tool_call("look_up", id="l1", city="Paris")), reply("Paris")]
    with SqliteStore(tmp_path / "runs.db", lease=0.2) as store:
        child = Agent(FakeModel(script[1:]), registry)
        parent = _parent(child, [_asks(), reply("It is Paris.")]).start("trip", store=store, run_id="trip")
        link = {"parent_run_id": "trip", "parent_call_id": "c1", "input_digest": input_digest("capital of France?")}
        cut = Agent(FakeModel(script), registry)._begin(  # as this parent's driver begins its child
            "capital of France?", None, (), store, "trip/c1", parent=link, start_id=child_start_of(parent, "c1")
        )
        cut._open_store(new=True)
        while not cut.steps:
            cut.advance()  # the call ran and is checkpointed; then its process died, holding the lease
        time.sleep(0.3)
        result = parent.finish() if driver == "sync" else asyncio.run(parent.afinish())
    assert told(result) == '"Paris"'
    assert calls == ["Paris"]
    assert result.steps[0].child == "trip/c1"  # taken over, not run again under another id


def test_as_tool_refuses_a_missing_description_and_an_unknown_stop_policy() -> None:
    """The parent's model knows the tool only by its description; on_child_stop is error or raise."""
    agent = Agent(FakeModel(), ToolRegistry())
    with pytest.raises(ValueError, match="as_tool needs a description"):
        agent.as_tool("research", " ")
    with pytest.raises(ValueError, match="on_child_stop must be 'error' or 'raise'"):
        agent.as_tool("research", "Looks things up.", on_child_stop="ignore")  # type: ignore[arg-type]


@pytest.mark.parametrize("driver", DRIVERS)
def test_bad_input_to_a_sub_agent_is_a_tool_error_and_no_child_runs(driver: str) -> None:
    """The model must give input as a string; anything else is refused before a child run starts."""
    child_model = FakeModel(reply("never"))
    call = tool_turn(tool_call("research", id="c1", question="wrong name"))
    result = finish(_parent(Agent(child_model, ToolRegistry()), [call, reply("ok")]), driver)
    assert "bad arguments for tool 'research'" in told(result)
    assert child_model.seen == []


def test_a_sub_agent_tool_called_directly_is_a_plain_run() -> None:
    """Outside a parent run (a test, a script), the tool runs the child agent and returns its answer."""
    tool = Agent(FakeModel(reply("Paris")), ToolRegistry()).as_tool("research", "Answers one research question.")
    assert tool("capital of France?") == "Paris"


# --- crashes: the process dies at any checkpoint of parent or child, and a new one finishes the pair ---------

LEASE = 0.5


class Planner:
    """The parent's model: a tick, the sub-agent, another tick, an answer; the reply depends only on the history."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        given = sum(1 for m in messages if m.role == "assistant")
        if given == 1:
            return tool_turn(tool_call("research", id="c1", input="go"), usage=Usage(3, 2))
        if given < 3:
            return tool_turn(tool_call("tick", id=f"p{given}", n=given), usage=Usage(3, 2))
        return reply(f"planned after {given}", usage=Usage(3, 2))


def _pair(counter: str | None) -> Agent:
    child = Agent(Ticks(4, "child"), tick_registry(counter), clock=ManualClock())
    registry = tick_registry(counter)
    registry.register(child.as_tool("research", "Does the research."))
    return Agent(Planner(), registry, clock=ManualClock())


def _killed_at(target: str, counter: str, kill_at: int, every: str) -> None:
    _pair(counter).run("plan", store=dying_store(target, LEASE, kill_at, every), run_id="long")


def _resume(target: str, counter: str, out: str, driver: str) -> None:
    store = open_store(target, lease=LEASE)
    while True:
        try:
            run = _pair(counter).resume(store.load("long"), store=store)
            result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
            break
        except RunLeasedError:  # the dead process's leases (parent's, then child's) lapse within LEASE
            time.sleep(0.05)
    Path(out).write_text(result.to_json(), encoding="utf-8")
    store.close()


# With a write per transition the pair writes 34 checkpoints: the parent's 1-7, the child's 8-26 (26: the child is
# Done), the parent's 27-34.  With one per call (the default), 18: the parent's 1-3, the child's 4-13 (13: Done),
# the parent's 14-18.
KILLS = {
    ("transition", "sync"): [5, 8, 17, 26, 30],
    ("transition", "async"): [7, 9, 20, 26, 27],
    ("call", "sync"): [2, 4, 9, 13, 14],
    ("call", "async"): [3, 5, 11, 13, 16],
}


@pytest.mark.subprocess
@pytest.mark.parametrize(("every", "driver", "kill_at"), [(*key, k) for key, kills in KILLS.items() for k in kills])
def test_a_pair_killed_at_a_checkpoint_finishes_in_a_new_process_with_each_call_run_once(
    store_target: str, tmp_path: Path, every: str, driver: str, kill_at: int
) -> None:
    """Killed in the parent, in the child or just after it, the resumed pair ends the same; no call ran twice."""
    whole = _pair(None).start("plan", run_id="long").finish()
    counter, out = str(tmp_path / "calls.txt"), str(tmp_path / "result.json")
    assert in_child(_killed_at, store_target, counter, kill_at, every) == 9
    assert in_child(_resume, store_target, counter, out, driver) == 0
    assert RunResult.from_json(Path(out).read_text(encoding="utf-8")) == whole
    calls = Path(counter).read_text(encoding="utf-8").split()
    assert sorted(calls) == sorted(["p0", "p2", "t0", "t1", "t2", "t3"]), "a tool call ran twice or never"
