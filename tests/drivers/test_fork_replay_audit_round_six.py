"""Fork and replay, sixth audit: nothing lost, no side effect repeated, in the less-trodden combinations.

fork-a-run.md: a fork "is rebuilt by running the agent again on the
source's own replies and tool results: nothing is called", and "a call the
source completed after ``at`` ... takes the recorded result"; the fork's
``limits`` edit sets the limits it "runs under".  test-from-recordings.md:
an unchanged agent "replays without calling its model or a single tool", a
call the recorded run held for a person "must be held by your agent", and
``tools="live"`` calls the real tools.  Every tool counts its executions by
call id, every model its calls by the turn it answers (``support.fork_round_six``).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.by_turn import ByTurn
from support.exactly_once import LEASE, resumed_by_new_owner, taken_over
from support.fork_round_six import (
    Cut,
    counters,
    finished,
    forked,
    model_calls,
    planner,
    side_effects,
)

from fsm_agent import (
    Agent,
    AgentRun,
    ForkEdit,
    ForkError,
    Price,
    RunExistsError,
    RunResult,
    ToolRegistry,
    Transition,
    Usage,
)
from fsm_agent.persist import open_store
from fsm_agent.persist.store import Store
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn
from fsm_agent.testing.replay import areplay, replay

DRIVERS = ["sync", "async"]
COMMITTED = (
    Path(__file__).resolve().parents[1] / "recording" / "recordings" / "test_a_committed_recording_still_replays.json"
)


def _approved_through(store: Store, run_id: str, driver: str, made: Counter[str], run: AgentRun) -> RunResult:
    """``run`` driven to its end, each pause on ``send`` approved by a resume from the store (as a person would)."""
    result = finished(run, driver)
    while result.reason == "paused":
        stored = store.load(run_id)
        undecided = [i for i in stored["to_approve"] if i not in stored["approvals"]]
        result = finished(planner(made).resume(stored, store=store, approvals=dict.fromkeys(undecided, True)), driver)
    return result


def _planned_source(store: Store, driver: str) -> RunResult:
    made: Counter[str] = Counter()
    source = _approved_through(store, "src", driver, made, planner(made).start("plan", store=store, run_id="src"))
    assert (source.reason, source.final) == ("done", '{"total": 3}')
    assert set(side_effects(made).values()) == {1}
    assert len(side_effects(made)) == 5  # the sub-agent's two lookups, l1, l2 and s1
    return source


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_at_every_transition_of_a_sub_agent_batch_an_approval_a_compaction_and_a_typed_retry_repeats_nothing(
    store_target: str, driver: str
) -> None:
    """Each fork makes no tool call, asks each model turn after its fork point once, and ends with the source's spend.

    The source's batch holds a sub-agent whose own reply is a parallel
    batch; its ``send`` waits for a person; an overflow is compacted; the
    typed answer is rejected once.  Then its recording replays with no call,
    and with ``tools="live"`` makes each tool call once and asks no model
    of the run's own.
    """
    with open_store(store_target) as store:
        source = _planned_source(store, driver)
        expected = counters(store.load("src"))
        asked = [i for i, entry in enumerate(source.trace) if entry.source == "AwaitModel"]
        for at in range(len(source.trace) - 1):
            made: Counter[str] = Counter()
            run = forked(planner(made), driver, "src", at, store=store, run_id=f"f{at}")
            result = _approved_through(store, f"f{at}", driver, made, run)
            assert side_effects(made) == {}, at
            assert set(model_calls(made).values()) <= {1}, at
            assert len(model_calls(made)) == sum(1 for i in asked if i > at), at
            assert (result.final, result.usage, edges(result)) == (source.final, source.usage, edges(source)), at
            assert counters(store.load(f"f{at}")) == expected, at
        recording = store.export("src")
    for player in ("sync", "async"):
        made = Counter()
        again = replay(planner(made), recording) if player == "sync" else asyncio.run(areplay(planner(made), recording))
        assert (again.trace, again.final, dict(made)) == (source.trace, source.final, {}), player
        made = Counter()
        live = (
            replay(planner(made), recording, tools="live")
            if player == "sync"
            else asyncio.run(areplay(planner(made), recording, tools="live"))
        )
        assert (live.trace, live.final) == (source.trace, source.final), player
        assert len(side_effects(made)) == 5, player
        assert set(side_effects(made).values()) == {1}, player
        assert not [label for label in model_calls(made) if label.startswith("model")], player


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_past_an_approved_call_keeps_that_the_call_waited_for_a_person(store_target: str, driver: str) -> None:
    """The source's ``send`` waited and was approved: a fork before, at or after that keeps it held, and replays.

    test-from-recordings.md: a recording keeps, for each tool call, "whether
    it waited for a person's decision, ``held``", and a call the recorded run
    held "must be held by your agent".  The fork's history is the source's,
    so its export keeps ``held`` for s1 and replays (on either driver)
    against the very agent that made it, as the source's does.  The rebuilt
    run once held only rejected calls: it let s1 through undecided, its
    record said "not held", and the replay departed.
    """
    with open_store(store_target) as store:
        source = _planned_source(store, driver)
        send = [i for i, e in enumerate(source.trace) if (e.source, e.dest) == ("Dispatch", "ExecuteTool")][3]
        assert source.trace[send + 1] == Transition("ExecuteTool", "tool_done", "AwaitModel")
        held = {c["id"]: c.get("held") for c in store.export("src")["tool_calls"]}
        assert held["s1"] is True
        recordings = {"src": store.export("src")}
        for at in (send - 1, send, send + 1):  # s1 undecided yet, decided and dispatched, made
            made: Counter[str] = Counter()
            run = forked(planner(made), driver, "src", at, store=store, run_id=f"f{at}")
            result = _approved_through(store, f"f{at}", driver, made, run)
            assert (result.final, side_effects(made)) == (source.final, {}), at
            recordings[f"f{at}"] = store.export(f"f{at}")
    for name, recording in recordings.items():
        assert {c["id"]: c.get("held") for c in recording["tool_calls"]}["s1"] is True, name
        for player in DRIVERS:
            made = Counter()
            again = (
                replay(planner(made), recording) if player == "sync" else asyncio.run(areplay(planner(made), recording))
            )
            assert (again.final, dict(made)) == (source.final, {}), (name, player)


PRICED = [
    tool_turn(
        tool_call("send", id=f"s{i}", to=f"p{i}"), tool_call("send", id=f"t{i}", to=f"q{i}"), usage=Usage(100, 10)
    )
    for i in range(4)
] + [reply("all sent", usage=Usage(50, 5))]
"""Four turns of two sends each, then the answer; each reply costs $0.12 at ``Price(1000, 2000)``."""


def _sender(made: Counter[str], model: ByTurn) -> Agent:
    tools = ToolRegistry()

    def send(to: str, call_id: str) -> str:
        """Send a message: an effect in the world."""
        made[call_id] += 1
        return f"sent {to}"

    tools.register(send)
    return Agent(model, tools, prices=Price(1000, 2000), max_concurrency=2)


@pytest.mark.parametrize(
    ("limit", "used"),
    [({"max_steps": 2}, "max_steps=2, with steps at 2"), ({"cost_budget": 0.1}, "cost_budget=0.1, with cost at 0.24"),
     ({"token_budget": 100}, "token_budget=100, with tokens at 220")],
)  # fmt: skip
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_whose_edit_lowers_a_limit_below_what_was_spent_makes_no_further_call(
    store_target: str, driver: str, limit: dict[str, Any], used: str
) -> None:
    """Forked after its second turn (2 turns, 220 tokens, $0.24 spent) with a limit already exceeded: it is refused.

    fork-a-run.md: "the fork runs under the limits the source ran under at
    ``at`` (``edit``'s ``limits`` change them)".  A fresh run under
    ``max_steps=2`` never asks a third turn, and one under
    ``cost_budget=0.1`` never spends past its first; the fork, given those
    limits where they are spent already and about to ask its model, would
    ask it (and, ``rerun`` making the source's later calls for real, send
    two more messages) before any stop is checked again.  So it is refused
    as a resume whose limits forbid the next call is (the audit expected a
    stop there, but the stop's checkpoint lies before the fork point): the
    ``ForkError`` names the limit, what was used and what to do, and
    nothing is called or stored.
    """
    with open_store(store_target) as store:
        made: Counter[str] = Counter()
        source = _sender(made, ByTurn(PRICED)).run("go", store=store, run_id="src")
        assert (source.final, len(made)) == ("all sent", 8)
        at = [i for i, e in enumerate(source.trace) if (e.source, e.dest) == ("ExecuteTool", "AwaitModel")][1]
        made = Counter()
        model = ByTurn(PRICED)
        with pytest.raises(ForkError, match="a model call, which these limits forbid") as refused:
            forked(
                _sender(made, model),
                driver,
                "src",
                at,
                store=store,
                run_id="f",
                edit=ForkEdit(limits=limit),
                rerun="all",
            )
        assert used in str(refused.value)
        assert "or fork at an earlier transition" in str(refused.value)
        assert (model.calls, dict(made)) == (0, {})
        assert [r.run_id for r in store.list_runs()] == ["src"]


@pytest.mark.parametrize("at", [2, 4, 12, 13])
def test_two_tasks_forking_one_source_under_one_id_store_one_fork_and_repeat_nothing(
    store_target: str, at: int
) -> None:
    """Two asyncio tasks ``afork`` the same source to the same id at once: one fork is stored, the other refused.

    The refused one stores and calls nothing; the stored one (paused on the
    ``send`` it carries, when forked before it) makes no tool call.
    """
    with open_store(store_target) as store:
        source = _planned_source(store, "async")
        made: Counter[str] = Counter()

        async def owner() -> RunResult:
            run = await planner(made).afork("src", at, store=store, run_id="same")
            return await run.afinish()

        async def both() -> list[Any]:
            return await asyncio.gather(owner(), owner(), return_exceptions=True)

        outcomes = asyncio.run(both())
        refused = [o for o in outcomes if isinstance(o, RunExistsError)]
        results = [o for o in outcomes if isinstance(o, RunResult)]
        assert (len(refused), len(results)) == (1, 1), outcomes
        assert side_effects(made) == {}
        if results[0].reason == "paused":  # forked before the send: a person approves it, and it takes src's result
            stored = store.load("same")
            approved = planner(made).resume(stored, store=store, approvals=dict.fromkeys(stored["to_approve"], True))
            assert _approved_through(store, "same", "async", made, approved).reason == "done"
        final = store.load("same")
        assert (final["reason"], final["final"], final["forked_from"]) == ("done", source.final, ["src", at])
        assert side_effects(made) == {}


@pytest.mark.parametrize("resumer", DRIVERS)
def test_a_fork_cut_by_a_task_cancel_in_the_call_it_makes_again_is_finished_by_a_new_owner(
    store_target: str, resumer: str
) -> None:
    """``rerun={"l2"}`` at 0, the task cancelled while l2 is in flight: the next owner makes l2 again and nothing else.

    exactly-once.md: only the call in flight when a run is cut may be made
    again.  The sub-agent call, l1 and the held ``send`` are the source's
    (taken once approved), whichever owner asks for them; the fork ends
    with the source's counters and spend.
    """
    with open_store(store_target) as store:
        source = _planned_source(store, "async")
        expected = counters(store.load("src"))
    made: Counter[str] = Counter()
    cut = Cut()
    cut.q, cut.how = "b", "hang"
    store = open_store(store_target, lease=LEASE)
    try:

        async def cut_fork() -> None:
            cut.started = asyncio.Event()
            run = await planner(made, cut).afork("src", 0, store=store, run_id="f", rerun={"l2"})
            task = asyncio.ensure_future(run.afinish())
            started = asyncio.ensure_future(cut.started.wait())
            await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cut_fork())
    finally:
        store.close()
    assert side_effects(made) == {"lookup b l2": 1}
    result = resumed_by_new_owner(store_target, "f", resumer, planner(made))
    assert result.reason == "paused"  # on the send it carries: a person approves it, and it takes src's result
    with open_store(store_target) as store:
        approved = planner(made).resume(store.load("f"), store=store, approvals={"s1": True})
        result = _approved_through(store, "f", resumer, made, approved)
        assert counters(store.load("f")) == expected
    assert side_effects(made) == {"lookup b l2": 2}  # the cut call, in flight, made again; nothing else at all
    assert (result.final, result.usage) == (source.final, source.usage)
    assert [s.reused_from for s in result.steps if s.kind == "tool_call"] == ["src/r1", "src/l1", None, "src/s1"]


def _adder(added: list[tuple[int, int]]) -> ToolRegistry:
    tools = ToolRegistry()

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        added.append((a, b))
        return a + b

    tools.register(add)
    return tools


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_committed_first_version_recording_forks_at_every_transition_asking_only_the_later_turns(
    driver: str,
) -> None:
    """The recording the format's first version committed: each fork makes no ``add``, asks each later turn once."""
    recording = json.loads(COMMITTED.read_text())
    asked = [i for i, entry in enumerate(recording["trace"]) if entry["source"] == "AwaitModel"]
    for at in range(len(recording["trace"]) - 1):
        added: list[tuple[int, int]] = []
        tools = _adder(added)
        model = FakeModel(reply("5"))
        result = finished(forked(Agent(model, tools), driver, recording, at), driver)
        assert (result.final, added, len(model.seen)) == ("5", [], sum(1 for i in asked if i > at)), at
        assert result.messages[0].content == "You add numbers."  # the source's system prompt, kept


def _cut_after_second_turn(store: Store, made: Counter[str], model: ByTurn) -> dict[str, Any]:
    """A run of ``_sender`` left where its second turn's calls have all run, about to ask its third; its snapshot."""
    run = _sender(made, model).start("go", store=store, run_id="u")
    while [(e.source, e.dest) for e in run.trace].count(("ExecuteTool", "AwaitModel")) < 2:
        run.advance()
    return store.load("u")


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_resume_whose_limits_forbid_the_model_call_it_comes_back_to_make_is_refused(
    store_target: str, driver: str
) -> None:
    """``resume(snapshot, max_steps=2)`` of a run cut before its third turn: refused, nothing called or written.

    Refused before the claim (the cut owner's lease is still live), so no
    store write; a new owner's takeover under the run's own limits, or
    limits that still allow the call, asks the model as before.
    """
    made: Counter[str] = Counter()
    first = open_store(store_target, lease=LEASE)
    try:
        cut = _cut_after_second_turn(first, made, ByTurn(PRICED))
    finally:
        first.close()
    made, model = Counter(), ByTurn(PRICED)
    with open_store(store_target, lease=LEASE) as store:

        def resumed(**limits: Any) -> AgentRun:
            agent = _sender(made, model)
            if driver == "sync":
                return agent.resume(cut, store=store, **limits)

            async def go() -> AgentRun:
                return await agent.aresume(cut, store=store, **limits)

            return asyncio.run(go())

        for limits, used in (
            ({"max_steps": 2}, "max_steps=2, with steps at 2"),
            ({"cost_budget": 0.2}, "cost at 0.24"),
        ):
            with pytest.raises(ValueError, match="a model call, which these limits forbid") as refused:
                resumed(**limits)
            assert used in str(refused.value)
            assert "or resume with the run's own limits" in str(refused.value)
            assert (model.calls, dict(made), store.load("u")) == (0, {}, cut)
        _sender(made, model).resume(cut, max_steps=3).advance()  # a limit that still allows the call: asked
        assert model.calls == 1
        run = taken_over(resumed)  # the takeover under the run's own limits: asked, as before
        assert run.advance() == Transition("AwaitModel", "replied", "CheckTruncation")
        assert (model.calls, dict(made)) == (2, {})


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_whose_edit_lowers_the_tool_call_cap_below_what_was_made_makes_no_further_call(
    store_target: str, driver: str
) -> None:
    """Forked where its fourth send is next (three made) under ``max_tool_calls=3``: refused, nothing called, stored."""
    with open_store(store_target) as store:
        made: Counter[str] = Counter()
        source = _sender(made, ByTurn(PRICED)).run("go", store=store, run_id="src")
        at = [i for i, e in enumerate(source.trace) if (e.source, e.dest) == ("Dispatch", "ExecuteTool")][3]
        for cap, used in ((3, "max_tool_calls=3, with tool_calls at 3"), ({"send": 3}, "with calls of send at 3")):
            made, model = Counter(), ByTurn(PRICED)
            edit = ForkEdit(limits={"max_tool_calls": cap})
            with pytest.raises(ForkError, match="tool call 't1' \\(send\\), which these limits forbid") as refused:
                forked(_sender(made, model), driver, "src", at, store=store, run_id="f", edit=edit, rerun="all")
            assert used in str(refused.value)
            assert (model.calls, dict(made), [r.run_id for r in store.list_runs()]) == (0, {}, ["src"])
