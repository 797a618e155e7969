"""Hooks hear each real tool execution once: one ``before_tool`` and one ``after_tool`` per call the tool ran.

Every tool here counts its own executions, and each test compares that
count with what ``before_tool``/``after_tool`` heard: no event for a call
that never ran, none missing for one that did, none twice.  The runs are
cut where the async driver keeps calls that ran beside a stop (a mid-batch
stop, a cancelled task, a Ctrl-C in one call of a batch), resumed, or cut
while a checkpoint is being written.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.counted_calls import Counted, drive, finish

from fsm_agent import Agent, RunResult, SqliteStore
from fsm_agent.observe.events import HOOK_NAMES
from fsm_agent.persist.store import StoreError
from fsm_agent.persist.summary import Entry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


def recorded(agent: Agent) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []
    for name in HOOK_NAMES:
        agent.on(name, lambda event, name=name: seen.append((name, event)))
    return seen


def heard(seen: list[tuple[str, Any]], name: str) -> Counter[str]:
    return Counter(event.tool_call.id for hook, event in seen if hook == name)


def transitions(seen: list[tuple[str, Any]]) -> list[Any]:
    return [event for hook, event in seen if hook == "transition"]


async def cancel_once(run: Any, ready: Any) -> None:
    """Drive ``run`` in a task and cancel it once ``ready()`` holds (checked between event-loop turns)."""
    task = asyncio.ensure_future(run.afinish())
    for _ in range(1000):
        if ready():
            break
        await asyncio.sleep(0)
    assert ready()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def cancel_at(run: Any, event: asyncio.Event) -> None:
    """Drive ``run`` in a task and cancel it once ``event`` is set."""
    task = asyncio.ensure_future(run.afinish())
    waiting = asyncio.ensure_future(event.wait())
    await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
    assert event.is_set(), "the run ended before the gate was reached"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --- a stop in the middle of a parallel batch -------------------------------------------------------------------


def _batch_stopped_at_its_second_call(tools: Counted, stop: str) -> Agent:
    """Three calls in one turn; the run stops at the second (two failures, or a strict hook raising at the first)."""
    if stop == "tool_failures":
        calls = (
            tool_call("fail", id="f1", reason="a"),
            tool_call("fail", id="f2", reason="b"),
            tool_call("quick", id="q3", n=3),
        )
        return Agent(
            FakeModel(tool_turn(*calls), reply("x")),
            tools.registry,
            max_consecutive_failures=2,
            on_stop={"tool_failures": "return"},
        )
    calls = (tool_call("quick", id="q1", n=1), tool_call("quick", id="q2", n=2), tool_call("quick", id="q3", n=3))
    agent = Agent(FakeModel(tool_turn(*calls), reply("x")), tools.registry, strict_hooks=True)

    def audit_down(event: Any) -> None:
        if event.tool_call.id == "q1":
            raise ConnectionError("audit log is down")

    agent.on("before_tool", audit_down)
    return agent


@pytest.mark.parametrize("stop", ["tool_failures", "hook_error"])
def test_on_the_sync_driver_a_mid_batch_stop_hears_each_call_that_ran_begin_and_end(stop: str) -> None:
    tools = Counted()
    agent = _batch_stopped_at_its_second_call(tools, stop)
    seen = recorded(agent)
    result = drive(agent, "sync")
    assert result.reason == stop
    assert heard(seen, "before_tool") == tools.ran
    assert heard(seen, "after_tool") == tools.ran


@pytest.mark.parametrize("stop", ["tool_failures", "hook_error"])
def test_on_the_async_driver_a_mid_batch_stop_hears_each_call_that_ran_begin_and_end(stop: str) -> None:
    """The calls listed in ``also_ran`` ran and are kept: observers heard them begin, so they must hear them end."""
    tools = Counted()
    agent = _batch_stopped_at_its_second_call(tools, stop)
    seen = recorded(agent)
    result = drive(agent, "async")
    assert result.reason == stop
    assert sum(tools.ran.values()) == 3
    assert result.evidence["also_ran"]
    assert heard(seen, "before_tool") == tools.ran
    assert heard(seen, "after_tool") == tools.ran


# --- a batch cut by a cancelled task, then resumed ------------------------------------------------------------


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_call_that_came_back_before_a_cancel_is_heard_ending_once_across_the_resume(driver: str) -> None:
    """q2 came back while s1 hung; the cut announces q2's end, the resume takes q2 in without running it."""
    tools = Counted()
    tools.hang.add("s1")
    calls = (tool_call("quick", id="q1", n=1), tool_call("slow", id="s1"), tool_call("quick", id="q2", n=2))
    agent = Agent(FakeModel(tool_turn(*calls), reply("x")), tools.registry)
    seen = recorded(agent)
    run = agent.start("q")
    asyncio.run(cancel_once(run, lambda: "q2" in run.position.calls.ran))
    assert run.result.reason == "cancelled"
    assert run.result.evidence["came_back"] == ["q2"]
    tools.hang.clear()
    result = finish(agent.resume(run.result), driver)
    assert result.final == "x"
    # s1 was cut in flight and made again (documented); q1 and q2 ran once each.
    assert tools.ran == Counter({"q1": 1, "q2": 1, "s1": 2})
    assert [event.transition for event in transitions(seen)] == list(result.trace)
    assert heard(seen, "before_tool") == tools.ran
    assert heard(seen, "after_tool") == Counter({"q1": 1, "q2": 1, "s1": 1})  # the cut execution of s1 never ended


# --- a Ctrl-C in one call of a parallel batch -------------------------------------------------------------------


def _batch_with_a_ctrl_c(tools: Counted) -> Agent:
    calls = (tool_call("quick", id="q1", n=1), tool_call("ctrl_c", id="k1"), tool_call("quick", id="q2", n=2))
    return Agent(FakeModel(tool_turn(*calls), reply("x")), tools.registry)


def test_a_ctrl_c_in_a_batch_hears_the_calls_that_finished_end() -> None:
    """q1 and q2 ran and their outcomes are kept for the resume; observers heard them begin and never end."""
    tools = Counted()
    agent = _batch_with_a_ctrl_c(tools)
    seen = recorded(agent)
    run = agent.start("q")
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(run.afinish())
    assert set(run.position.calls.ran) == {"q1", "q2"}
    assert heard(seen, "before_tool") == tools.ran
    assert heard(seen, "after_tool") == Counter({"q1": 1, "q2": 1})


def test_the_unfinished_event_of_a_ctrl_c_in_a_batch_names_the_interrupt() -> None:
    """``unfinished``'s error names the exception that left the run; a single call's Ctrl-C does, a batch's not."""
    tools = Counted()
    agent = _batch_with_a_ctrl_c(tools)
    seen = recorded(agent)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(agent.arun("q"))
    left = [event.error for hook, event in seen if hook == "unfinished"]
    assert len(left) == 1
    assert left[0].startswith("KeyboardInterrupt")


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_ctrl_c_in_a_single_call_is_heard_as_unfinished_naming_the_interrupt(driver: str) -> None:
    tools = Counted()
    agent = Agent(FakeModel(tool_turn(tool_call("ctrl_c", id="k1")), reply("x")), tools.registry)
    seen = recorded(agent)
    with pytest.raises(KeyboardInterrupt):
        drive(agent, driver)
    assert [event.error for hook, event in seen if hook == "unfinished"] == ["KeyboardInterrupt: "]
    assert heard(seen, "before_tool") == tools.ran == Counter({"k1": 1})
    assert heard(seen, "after_tool") == Counter()


# --- a checkpoint cut by a cancelled task (async driver, with a store) ------------------------------------------


class GatedStore(SqliteStore):
    """A SQLite store whose async append of the first entry in state ``hold`` waits forever (until cancelled)."""

    hold: str | None = None
    held: asyncio.Event | None = None

    async def aappend(self, entry: Entry, *, owner: str) -> None:
        if self.hold is not None and entry.summary.state == self.hold:
            self.hold = None
            assert self.held is not None
            self.held.set()
            await asyncio.Event().wait()
        await super().aappend(entry, owner=owner)


def _cut_in_a_checkpoint(tmp_path: Path, hold: str) -> tuple[Any, list[tuple[str, Any]], RunResult | None]:
    """A run checkpointing every transition, its task cancelled while the checkpoint into ``hold`` is written.

    Then the same run object goes on to the end.
    """
    model = FakeModel(tool_turn(tool_call("quick", id="q1", n=1)), reply("done"))
    tools = Counted()
    agent = Agent(model, tools.registry)
    seen = recorded(agent)
    outcome: list[Any] = []

    async def main() -> None:
        with GatedStore(tmp_path / "runs.db", every="transition") as store:
            store.held = asyncio.Event()
            store.hold = hold
            run = await agent.astart("q", store=store, run_id="r1")
            await cancel_at(run, store.held)
            outcome.append(run)
            try:
                outcome.append(await run.afinish())
            except Exception as exc:  # noqa: BLE001 - what the test reports
                outcome.append(exc)

    asyncio.run(main())
    run, result = outcome
    return run, seen, result


def test_a_cancel_during_a_checkpoint_loses_no_transition_event(tmp_path: Path) -> None:
    _, seen, result = _cut_in_a_checkpoint(tmp_path, "Dispatch")
    assert isinstance(result, RunResult), result
    assert result.final == "done"
    assert [event.seq for event in transitions(seen)] == list(range(len(result.trace)))
    assert [event.transition for event in transitions(seen)] == list(result.trace)


def test_a_cancel_during_the_last_checkpoint_still_ends_the_run(tmp_path: Path) -> None:
    _, seen, result = _cut_in_a_checkpoint(tmp_path, "Done")
    assert isinstance(result, RunResult), result
    assert result.final == "done"
    assert transitions(seen)[-1].result == result


def test_a_cancel_during_the_checkpoint_into_a_pause_is_announced_before_the_paused_result(tmp_path: Path) -> None:
    """The transition into the pause is written and heard before ``afinish()`` returns the paused result."""
    tools = Counted()
    model = FakeModel(tool_turn(tool_call("quick", id="q1", n=1)), reply("done"))
    agent = Agent(model, tools.registry, approve={"quick"})
    seen = recorded(agent)
    outcome: list[Any] = []

    async def main() -> None:
        with GatedStore(tmp_path / "runs.db", every="transition") as store:
            store.held = asyncio.Event()
            store.hold = "ExecuteTool"
            run = await agent.astart("q", store=store, run_id="r1")
            await cancel_at(run, store.held)
            paused = await run.afinish()
            outcome.append([event.seq for event in transitions(seen)] == list(range(len(run.trace))))
            outcome.append(store.load("r1")["state"])
            run.decide({"q1": True})
            outcome.append(paused)
            outcome.append(await run.afinish())

    asyncio.run(main())
    announced, stored_state, paused, result = outcome
    assert paused.reason == "paused"
    assert announced
    assert stored_state == "ExecuteTool"
    assert result.final == "done"
    assert tools.ran == Counter({"q1": 1})
    assert [event.transition for event in transitions(seen)] == list(result.trace)


# --- a store that refused a write ------------------------------------------------------------------------------


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
def test_a_refused_write_is_heard_once_and_the_resume_from_the_store_hears_the_rest_once(
    tmp_path: Path, driver: str
) -> None:
    """Checkpointing every transition: the refused transition is not announced, and the new owner announces it."""
    path = tmp_path / "runs.db"
    tools = Counted()
    model = FakeModel(tool_turn(tool_call("quick", id="q1", n=1)), tool_turn(tool_call("quick", id="q2", n=2)))
    model.responses.append(reply("done"))
    agent = Agent(model, tools.registry)
    seen = recorded(agent)
    with RefusingStore(path, every="transition") as store:
        # The write of ExecuteTool -> AwaitModel, after q1 ran (it and the reply before it written before their hooks).
        store.refuse = 6
        run = agent.start("q", store=store, run_id="r1")
        with pytest.raises(StoreError):
            finish(run, driver)
        assert not run.done
        left = [event for hook, event in seen if hook == "unfinished"]
        assert [event.error.split(":")[0] for event in left] == ["StoreError"]
        assert [event.seq for event in transitions(seen)] == list(range(len(run.trace) - 1))
        # The lease of the owner that met the refusal is given up, as it lapses once that owner is gone.
        stored = store.load("r1")
        store.renew("r1", owner=run._journal.owner, seq=stored["stored_seq"], release=True)
    again = Agent(FakeModel(*model.responses[1:]), tools.registry)
    seen_again = recorded(again)
    with SqliteStore(path, every="transition") as store:
        result = finish(again.resume(store.load("r1"), store=store), driver)
    assert result.final == "done"
    assert [event.transition for event in transitions(seen) + transitions(seen_again)] == list(result.trace)
    # q1's outcome was written as it returned, before its hooks and the refused write: it is taken in, not made
    # again, and each execution is heard begin and end once.
    assert tools.ran == Counter({"q1": 1, "q2": 1})
    assert heard(seen, "before_tool") + heard(seen_again, "before_tool") == tools.ran
    assert heard(seen, "after_tool") + heard(seen_again, "after_tool") == tools.ran
