"""A run whose store write failed is driven again by its app: it writes first, and no call is made twice.

A store error (a dropped connection, a full disk) reaches the app from
``finish()``; the app retries on the same run object once the store
answers, as it would any transient error.  The run holds what the failed
write held: it writes that before anything else, makes no call before, reads
back a write that committed though its answer was lost (instead of calling
its own write another owner's), returns a result whose last write failed,
keeps a parallel batch's outcomes that came back, and drives on a sub-agent's
run that owes a write.  Each tool and model call is counted, on both drivers
and both stores.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from support.failing_writes import DROPPED, failing_store

from fsm_agent import Agent, RunLeasedError, RunResult, StaleRunError, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


def _tools(made: Counter[str], wait: float = 0.0) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.register
    async def effect(tag: str) -> str:
        """One side effect, counted; ``b`` is the slow one."""
        if tag == "b":
            await asyncio.sleep(wait)
        made[tag] += 1
        return f"did {tag}"

    return tools


def _turns(n: int) -> list[Any]:
    return [tool_turn(tool_call("effect", id=f"c{i}", tag=f"t{i}")) for i in range(n)] + [reply(f"done after {n}")]


def _start(agent: Agent, store: Any, driver: str) -> Any:
    if driver == "sync":
        return agent.start("go", store=store, run_id="r1")
    return asyncio.run(agent.astart("go", store=store, run_id="r1"))


def _finish(run: Any, driver: str) -> RunResult:
    return run.finish() if driver == "sync" else asyncio.run(run.afinish())


def _retried(run: Any, driver: str, made: Counter[str], tries: int = 10) -> tuple[RunResult, list[dict[str, int]]]:
    """Drive ``run`` until it ends, as an app retrying a store error does; the calls made by the time of each error."""
    seen = []
    for _ in range(tries):
        try:
            return _finish(run, driver), seen
        except ConnectionError as exc:
            if str(exc) != DROPPED:
                raise
            seen.append(dict(made))
    raise AssertionError(f"still failing after {tries} tries")


@pytest.mark.parametrize("driver", DRIVERS)
def test_no_call_is_made_while_a_failed_write_is_owed(store_target: str, driver: str) -> None:
    made: Counter[str] = Counter()
    model = FakeModel(*_turns(3))
    with failing_store(store_target) as store:
        run = _start(Agent(model, _tools(made)), store, driver)
        store.fails, store.matching = 4, "did t0"  # t0's outcome cannot be written four times over
        result, seen = _retried(run, driver, made)
        stored = store.load("r1")
    assert seen == [{"t0": 1}] * 4  # t0 came back before the first error, and nothing else was made until written
    assert result.final == "done after 3"
    assert (dict(made), len(model.seen)) == ({"t0": 1, "t1": 1, "t2": 1}, 4)
    assert [m["content"] for m in stored["messages"] if m["role"] == "tool"] == ['"did t0"', '"did t1"', '"did t2"']


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_write_that_committed_though_its_answer_was_lost_is_read_back(store_target: str, driver: str) -> None:
    made: Counter[str] = Counter()
    model = FakeModel(*_turns(3))
    with failing_store(store_target) as store:
        run = _start(Agent(model, _tools(made)), store, driver)
        store.fails, store.matching, store.landed = 1, "did t1", True
        result, seen = _retried(run, driver, made)  # no StaleRunError: the version the store moved to is its own
        stored = store.load("r1")
    assert seen == [{"t0": 1, "t1": 1}]
    assert (result.final, stored["state"]) == ("done after 3", "Done")
    assert (dict(made), len(model.seen)) == ({"t0": 1, "t1": 1, "t2": 1}, 4)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_whose_last_write_failed_returns_its_result_when_driven_again(store_target: str, driver: str) -> None:
    made: Counter[str] = Counter()
    model = FakeModel(*_turns(1))
    with failing_store(store_target) as store:
        run = _start(Agent(model, _tools(made)), store, driver)
        store.fails, store.matching = 1, '"Done"'
        result, seen = _retried(run, driver, made)
        stored = store.load("r1")
    assert seen == [{"t0": 1}]
    assert (result.final, run.result.final, stored["state"]) == ("done after 1", "done after 1", "Done")
    assert (dict(made), len(model.seen)) == ({"t0": 1}, 2)


def test_an_async_batch_keeps_the_outcomes_that_came_back_when_one_outcome_write_fails(store_target: str) -> None:
    made: Counter[str] = Counter()
    batch = tool_turn(*[tool_call("effect", id=f"c-{tag}", tag=tag) for tag in "abcd"])
    model = FakeModel(batch, reply("batch done"))
    with failing_store(store_target) as store:
        run = _start(Agent(model, _tools(made, wait=0.3), max_concurrency=1), store, "async")
        # a's write fails as b (slow) starts in its place: b comes back and is kept; c and d, due after the failure
        # was known, do not start until the run is written.
        store.fails, store.matching = 1, "did a"
        result, seen = _retried(run, "async", made)
        stored = store.load("r1")
    assert seen == [{"a": 1, "b": 1}]
    assert result.final == "batch done"
    assert (dict(made), len(model.seen)) == ({"a": 1, "b": 1, "c": 1, "d": 1}, 2)
    tool_messages = sorted(m["content"] for m in stored["messages"] if m["role"] == "tool")
    assert tool_messages == ['"did a"', '"did b"', '"did c"', '"did d"']


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_sub_agent_that_owes_a_write_is_driven_on_by_its_parents_retry(store_target: str, driver: str) -> None:
    made: Counter[str] = Counter()
    child_model = FakeModel(
        tool_turn(tool_call("effect", id="k0", tag="child0")),
        tool_turn(tool_call("effect", id="k1", tag="child1")),
        reply("child done"),
    )
    tools = _tools(made)
    tools.register(Agent(child_model, _tools(made)).as_tool("helper", "Helps."))
    parent_model = FakeModel(tool_turn(tool_call("helper", id="h", input="do it")), reply("parent done"))
    with failing_store(store_target) as store:
        run = _start(Agent(parent_model, tools), store, driver)
        store.fails, store.matching = 1, "did child0"
        result, seen = _retried(run, driver, made)
        child = store.load("r1/h")
    assert seen == [{"child0": 1}]
    assert (result.final, child["state"], child["final"]) == ("parent done", "Done", "child done")
    assert dict(made) == {"child0": 1, "child1": 1}
    assert (len(parent_model.seen), len(child_model.seen)) == (2, 3)


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_store_error_says_which_run_could_not_be_written_and_what_to_do(store_target: str, driver: str) -> None:
    made: Counter[str] = Counter()
    with failing_store(store_target) as store:
        run = _start(Agent(FakeModel(*_turns(1)), _tools(made)), store, driver)
        store.fails, store.matching = 1, "did t0"
        with pytest.raises(ConnectionError) as failed:
            _finish(run, driver)
        notes = " ".join(getattr(failed.value, "__notes__", []))
        assert f"run 'r1' could not be written to {store!r}" in notes
        assert "driven again (AgentRun.finish() or afinish())" in notes
        assert _finish(run, driver).final == "done after 1"
    assert dict(made) == {"t0": 1}


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_grandchild_that_owes_a_write_is_driven_on_through_its_parent(store_target: str, driver: str) -> None:
    made: Counter[str] = Counter()
    grand_model = FakeModel(
        tool_turn(tool_call("effect", id="g0", tag="grand0")),
        tool_turn(tool_call("effect", id="g1", tag="grand1")),
        reply("grand done"),
    )
    child_tools = _tools(made)
    child_tools.register(Agent(grand_model, _tools(made)).as_tool("deeper", "Goes deeper."))
    child_model = FakeModel(tool_turn(tool_call("deeper", id="d", input="deeper")), reply("child done"))
    tools = _tools(made)
    tools.register(Agent(child_model, child_tools).as_tool("helper", "Helps."))
    parent_model = FakeModel(tool_turn(tool_call("helper", id="h", input="do it")), reply("parent done"))
    with failing_store(store_target) as store:
        run = _start(Agent(parent_model, tools), store, driver)
        store.fails, store.matching = 1, "did grand0"
        result, seen = _retried(run, driver, made)
        grandchild = store.load("r1/h/d")
    assert seen == [{"grand0": 1}]
    assert (result.final, grandchild["state"]) == ("parent done", "Done")
    assert dict(made) == {"grand0": 1, "grand1": 1}
    assert (len(parent_model.seen), len(child_model.seen), len(grand_model.seen)) == (2, 2, 3)


def test_a_sub_agents_store_error_in_an_async_batch_lets_the_call_beside_it_come_back(store_target: str) -> None:
    made: Counter[str] = Counter()
    child_model = FakeModel(tool_turn(tool_call("effect", id="k0", tag="child0")), reply("child done"))
    tools = _tools(made, wait=0.3)
    tools.register(Agent(child_model, _tools(made)).as_tool("helper", "Helps."))
    batch = tool_turn(tool_call("helper", id="h", input="do it"), tool_call("effect", id="c-b", tag="b"))
    parent_model = FakeModel(batch, reply("parent done"))
    with failing_store(store_target) as store:
        run = _start(Agent(parent_model, tools), store, "async")
        store.fails, store.matching = 1, "did child0"  # the child's write fails while b (slow) is in flight
        result, seen = _retried(run, "async", made)
    assert seen == [{"child0": 1, "b": 1}]  # b came back and was kept, not cut by the child's error
    assert result.final == "parent done"
    assert dict(made) == {"child0": 1, "b": 1}
    assert (len(parent_model.seen), len(child_model.seen)) == (2, 2)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stream_read_again_after_its_last_write_failed_yields_the_last_transition(
    store_target: str, driver: str
) -> None:
    made: Counter[str] = Counter()
    model = FakeModel(*_turns(1))
    edges: list[str] = []

    def read(run: Any) -> None:
        async def aread() -> None:
            async for event in run.astream():
                edges.append(f"{event.source}->{event.dest}")

        if driver == "async":
            asyncio.run(aread())
        else:
            edges.extend(f"{event.source}->{event.dest}" for event in run.stream())

    with failing_store(store_target) as store:
        run = _start(Agent(model, _tools(made)), store, driver)
        store.fails, store.matching = 1, '"Done"'
        with pytest.raises(ConnectionError):
            read(run)
        read(run)
    assert edges == [
        "AwaitModel->CheckTruncation",
        "CheckTruncation->Dispatch",
        "Dispatch->ExecuteTool",
        "ExecuteTool->AwaitModel",
        "AwaitModel->CheckTruncation",
        "CheckTruncation->Dispatch",
        "Dispatch->Done",
    ]
    assert (run.result.final, dict(made), len(model.seen)) == ("done after 1", {"t0": 1}, 2)


class _ByProgress(FakeModel):
    """Answers from how many tool results the conversation holds, so whichever owner drives the run gets its turn."""

    def complete(self, messages: Any, tools: Any, output: Any = None) -> Any:
        self.seen.append(tuple(messages))
        return self.responses[sum(1 for m in messages if m.role == "tool")]


@pytest.mark.parametrize("landed", [False, True])
def test_an_owing_run_driven_again_while_a_second_owner_takes_it_over_repeats_nothing(
    store_target: str, landed: bool
) -> None:
    made: Counter[str] = Counter()
    with failing_store(store_target, lease=0.5) as store, failing_store(store_target, lease=0.5) as other:
        run = Agent(_ByProgress(*_turns(3)), _tools(made)).start("go", store=store, run_id="r1")
        store.fails, store.matching, store.landed = 1, "did t1", landed
        with pytest.raises(ConnectionError):
            run.finish()
        time.sleep(0.7)  # the owing object's lease lapses: a second owner may take the run over
        outcomes: dict[str, Any] = {}

        def drive(name: str, go: Callable[[], RunResult]) -> None:
            try:
                outcomes[name] = go().final
            except (RunLeasedError, StaleRunError) as exc:
                outcomes[name] = type(exc).__name__
            except ValueError as exc:  # the first owner finished it before the second read it
                outcomes[name] = "finished already" if "nothing to resume" in str(exc) else repr(exc)

        second = Agent(_ByProgress(*_turns(3)), _tools(made))
        threads = [
            threading.Thread(target=drive, args=("first", run.finish)),
            threading.Thread(
                target=drive, args=("second", lambda: second.resume(other.load("r1"), store=other).finish())
            ),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stored = other.load("r1")
    assert stored["state"] == "Done"
    assert "done after 3" in outcomes.values(), outcomes
    assert set(outcomes.values()) <= {"done after 3", "finished already", "RunLeasedError", "StaleRunError"}, outcomes
    assert (made["t0"], made["t2"]) == (1, 1)
    # t1's outcome went with the failed write unless it landed: a second owner that won may make it once more.
    assert made["t1"] == 1 if landed else made["t1"] in (1, 2)
    assert [m["content"] for m in stored["messages"] if m["role"] == "tool"] == ['"did t0"', '"did t1"', '"did t2"']


class _HeldSecondCall(FakeModel):
    """A scripted model whose second call waits until the test lets it go (``go``), saying it began (``asked``)."""

    def __init__(self, *script: Any) -> None:
        super().__init__(*script)
        self.asked, self.go = threading.Event(), threading.Event()

    def complete(self, messages: Any, tools: Any, output: Any = None) -> Any:
        if len(self.seen) == 1:
            self.asked.set()
            self.go.wait(30)
        return super().complete(messages, tools, output)


@pytest.mark.parametrize("every", ["call", "turn"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_write_read_back_as_landed_after_its_lease_lapsed_retakes_the_lease_before_the_next_call(
    store_target: str, driver: str, every: str
) -> None:
    """The landed write's lease dates from its commit, long gone: renewed before the call, so nobody claims the run."""
    made: Counter[str] = Counter()
    model = _HeldSecondCall(*_turns(2))
    with failing_store(store_target, lease=0.5, every=every) as store:
        run = _start(Agent(model, _tools(made)), store, driver)
        store.fails, store.matching, store.landed = 1, "did t0", True
        with pytest.raises(ConnectionError):
            _finish(run, driver)
        time.sleep(0.7)  # the lease the landed write took lapses
        finished: list[Any] = []
        driving = threading.Thread(target=lambda: finished.append(_finish(run, driver).final))
        driving.start()
        try:
            assert model.asked.wait(30)  # driven again: it read its write back and is in its next model call
            other = Agent(FakeModel(*_turns(2)[1:]), _tools(made))
            with pytest.raises(RunLeasedError):  # the lease is this object's again: the other makes no call
                other.resume(store.load("r1"), store=store)
        finally:
            model.go.set()
            driving.join(30)
    assert finished == ["done after 2"]
    assert (dict(made), len(model.seen)) == ({"t0": 1, "t1": 1}, 3)
