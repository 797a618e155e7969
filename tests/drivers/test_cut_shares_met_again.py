"""A replay and a fork's rebuild count each cut's share of a sub-agent call where the source counted it.

docs/how-to/fork-a-run.md and test-from-recordings.md: a cut counts what the
child's run had spent (its tool calls too) before the run stops, and the
snapshot keeps each such share with the number of transitions before it
(``cut_shares``).  A run taken again from the recording reads no child in
flight at its cuts, so it counts each share again at the same point.

The source here: the parent asks ``helper`` for ``c1`` (or ``c1`` and ``c2``
in one reply), the children hold in their ``wait`` (step 3) while a cancel
cuts the run, with a store; the cut counts each child's three calls.  It is
resumed with ``max_tool_calls=2``: the next ``Dispatch`` stops on
``max_tool_calls`` before making a call, because of the cut's shares alone.
A replay, or a fork past the cut, used to count nothing there: the replay
departed at that stop (``ReplayDivergence``), and a fork there could not be
rebuilt (``ForkError``).  Counted on both drivers and both stores: each tool
execution by (input, step), the parent's and each child's model calls.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from typing import Any

import pytest
from support.cancelled_with_parent import Counts as DeadlineCounts
from support.cancelled_with_parent import ParentModel  # reads only the counts' lock and parent
from support.cancelled_with_parent import child_tools as deadline_tools
from support.deadline_children import HangsInItsAnswer
from support.deadline_cuts import DEADLINE
from support.forkspend_tree import Seen, cut_by_token, driven, spent
from support.storeless_children import ChildModel, Counts, child_tools

from fsm_agent import Agent, AgentLoopError, ForkEdit, ForkError, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.persist.recording import recording_of
from fsm_agent.records import plain
from fsm_agent.testing.replay import areplay, replay

DRIVERS = ["sync", "async"]
ASKS = {"one call": ("c1",), "a batch of two": ("c1", "c2")}


def _cut_calls(items: tuple[str, ...]) -> Counter[tuple[str, int]]:
    """What ran before the cut in the children of ``items``: each one's steps 1 to 3 (the held wait came back)."""
    return Counter({(item, step): 1 for item in items for step in (1, 2, 3)})


def parent_agent(counts: Counts, driver: str, asks: tuple[str, ...], **settings: Any) -> Agent:
    """The parent (built with ``settings``) asking ``helper`` once per id of ``asks`` in one reply."""
    child = Agent(ChildModel(counts), child_tools(counts, driver))
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts, asks), tools, **settings)


FINALIZING = {"on_stop": {"max_tool_calls": "finalize"}}
"""A ``max_tool_calls`` stop answered by one last model call: the pending calls are answered "not executed"."""


def _as_json(data: Any) -> Any:
    return json.loads(json.dumps(data))


def _started(driver: str, asks: tuple[str, ...]) -> tuple[str, ...]:
    """The children a cut finds in flight: all on the async driver, the first alone on the sync one."""
    return asks if driver == "async" else asks[:1]


def _source(
    counts: Counts, driver: str, store: Any, asks: tuple[str, ...], settings: Any = None, **resumed: Any
) -> tuple[Seen, Any]:
    """``p`` cut with ``store`` in its children's waits, then resumed (``resumed``: its limits) by an agent built
    with ``settings``; its counters after each transition of both legs, and the resumed run's result."""
    cut, seen = cut_by_token(
        parent_agent(counts, driver, asks), counts, driver, len(_started(driver, asks)), store=store
    )
    seen[len(cut.trace) - 1] = cut.snapshot["counters"]
    counts.hold = False
    agent = parent_agent(counts, driver, asks, **(settings or {}))
    result, after = driven(agent, driver, "resume", store=store, source=_as_json(store.load("p")), **resumed)
    return {**seen, **after}, result


def _counters(counters: dict[str, Any]) -> dict[str, Any]:
    """A run's counters through JSON, the clock's left out (a replay's and a fork's stand still)."""
    return {name: value for name, value in _as_json(counters).items() if name not in ("seconds", "elapsed")}


@pytest.mark.parametrize("asks", ASKS)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_replay_counts_each_cut_s_share_where_the_source_did_and_stops_where_it_stopped(
    store_target: str, driver: str, asks: str
) -> None:
    counts = Counts()
    with open_store(store_target) as store:
        _, result = _source(counts, driver, store, ASKS[asks], max_tool_calls=2)
        assert result.reason == "max_tool_calls"  # the cut's shares alone reached the limit
        assert counts.tools == _cut_calls(_started(driver, ASKS[asks]))
        stored = _as_json(store.load("p"))
        recording = store.export("p")
    shares = stored["cut_shares"]
    assert sorted(call_id for _, call_id, _ in shares) == list(_started(driver, ASKS[asks]))
    assert {at for at, _, _ in shares} == {
        next(i for i, e in enumerate(stored["trace"]) if e["trigger"] == "interrupted")
    }
    tools, parent, children = Counter(counts.tools), counts.parent, Counter(counts.child)
    agent = parent_agent(counts, driver, ASKS[asks])
    replayed = replay(agent, recording) if driver == "sync" else asyncio.run(areplay(agent, recording))
    assert replayed.reason == "max_tool_calls"
    assert [plain(entry) for entry in replayed.trace] == stored["trace"]
    assert replayed.snapshot is not None
    assert _counters(replayed.snapshot["counters"]) == _counters(stored["counters"])
    assert (counts.tools, counts.parent, counts.child) == (tools, parent, children)  # nothing called


@pytest.mark.parametrize("from_snapshot", [False, True], ids=["from the store", "from the snapshot"])
@pytest.mark.parametrize("asks", ASKS)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_at_any_transition_of_a_source_stopped_by_a_cut_s_share_is_rebuilt(
    store_target: str, driver: str, asks: str, from_snapshot: bool
) -> None:
    """Each fork is rebuilt: at the source's ``max_tool_calls`` stop it goes on only with that limit lifted, as a
    resume would.  Once it goes on it holds the source's counters, less what cuts counted of calls still
    unanswered there (each brings that with the outcome the fork takes, or, handed down, where it is taken).
    Forked from the store, no call the source made runs again: the children's completed calls are handed down
    (the fork's children go on to the steps the source never reached)."""
    counts = Counts()
    with open_store(store_target) as store:
        seen, _ = _source(counts, driver, store, ASKS[asks], max_tool_calls=2)
        stored = _as_json(store.load("p"))
        cut_at = next(i for i, e in enumerate(stored["trace"]) if e["trigger"] == "interrupted")
        unanswered = sum(share["tool_calls"] for _, _, share in stored["cut_shares"])
        stop = len(stored["trace"]) - 1
        for at in range(len(stored["trace"])):
            tools = Counter(counts.tools)
            given = {"source": stored} if from_snapshot else {"source": "p", "store": store, "run_id": f"f{at}"}
            agent = parent_agent(counts, driver, ASKS[asks])
            if at == stop:  # its counts are the source's: the stop holds unless the fork's limits lift it
                with pytest.raises(ForkError, match=r"'max_tool_calls', which these limits do not lift"):
                    driven(agent, driver, "fork", at=at, **given)
                given["edit"] = ForkEdit(limits={"max_tool_calls": 20})
            result, fork_seen = driven(agent, driver, "fork", at=at, **given)
            assert result.final == "done"
            first = fork_seen[min(fork_seen)]
            expected = spent(seen[at])["tool_calls"] - (unanswered if at >= cut_at else 0)
            assert spent(first)["tool_calls"] == expected
            if not from_snapshot:  # the children's completed calls are handed down: none is made again
                assert not set(counts.tools - tools) & set(_cut_calls(_started(driver, ASKS[asks])))


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cut_call_answered_by_a_finalize_keeps_its_share_in_a_replay_and_a_fork(
    store_target: str, driver: str
) -> None:
    """Resumed with ``max_tool_calls=2`` and ``finalize`` for it, the source answers ``c1`` "not executed" and
    asks its model for the answer: the cut's share stays counted though no child's outcome answers the call.  A
    replay ends with the source's counters, and a fork from the snapshot just after the answer holds them and
    ends with them; neither runs a tool nor asks a child's model."""
    counts = Counts()
    with open_store(store_target) as store:
        seen, result = _source(counts, driver, store, ("c1",), FINALIZING, max_tool_calls=2)
        stored = _as_json(store.load("p"))
        recording = store.export("p")
    assert result.final == "done"
    assert counts.tools == _cut_calls(("c1",))  # c1 was never made again
    assert spent(stored["counters"])["tool_calls"] == 3
    tools, children = Counter(counts.tools), Counter(counts.child)
    agent = parent_agent(counts, driver, ("c1",), **FINALIZING)
    replayed = replay(agent, recording) if driver == "sync" else asyncio.run(areplay(agent, recording))
    assert [plain(entry) for entry in replayed.trace] == stored["trace"]
    assert _last_counters(replayed.steps) == _last_counters(stored["steps"])
    answered = next(i for i, e in enumerate(stored["trace"]) if e["trigger"] == "finalize")
    agent = parent_agent(counts, driver, ("c1",), **FINALIZING)
    forked, fork_seen = driven(agent, driver, "fork", source=stored, at=answered)
    assert forked.final == "done"
    assert spent(fork_seen[answered]) == spent(seen[answered])
    assert _last_counters(forked.steps) == _last_counters(stored["steps"])
    assert (counts.tools, counts.child) == (tools, children)


def _last_counters(steps: Any) -> dict[str, Any]:
    """The counters of a run's last step (a record's, or its plain form), through JSON, the clock's left out."""
    last = steps[-1] if isinstance(steps[-1], dict) else plain(steps[-1])
    return {name: value for name, value in _as_json(last)["counters"].items() if name != "seconds"}


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_past_a_cut_replays_and_forks_again_taking_its_cuts_back_where_it_did(
    store_target: str, driver: str
) -> None:
    """A fork taken after the cut (at the resume edge, and at the stop with ``max_tool_calls`` lifted) takes back
    what the cut counted of ``c1``, which it makes again (its child takes the cut child's calls): its recording
    keeps the shares and where they were taken back (``cuts_taken_back``).  A replay of the fork takes every
    recorded transition and ends with its counters; a fork of the fork past that point is rebuilt and ends with
    them too.  Nothing is called again but the last fork's own parent reply."""
    counts = Counts()
    with open_store(store_target) as store:
        _source(counts, driver, store, ("c1",), max_tool_calls=2)
        trace = store.load("p")["trace"]
        resumed, stop = len(trace) - 2, len(trace) - 1
        for at, edit in ((resumed, ForkEdit()), (stop, ForkEdit(limits={"max_tool_calls": 20}))):
            fork_id = f"f{at}"
            result, _ = driven(
                parent_agent(counts, driver, ("c1",)),
                driver,
                "fork",
                source="p",
                store=store,
                at=at,
                run_id=fork_id,
                edit=edit,
            )
            assert result.final == "done"
            forked = _as_json(store.load(fork_id))
            assert forked["cuts_taken_back"] == [at + 1 if at == resumed else at + 2]  # once it went on
            assert len(forked["cut_shares"]) == 1
            recording = store.export(fork_id)
            tools, parent, children = Counter(counts.tools), counts.parent, Counter(counts.child)
            agent = parent_agent(counts, driver, ("c1",))
            replayed = replay(agent, recording) if driver == "sync" else asyncio.run(areplay(agent, recording))
            assert [plain(entry) for entry in replayed.trace] == forked["trace"]
            assert _last_counters(replayed.steps) == _last_counters(forked["steps"])
            assert (counts.tools, counts.parent, counts.child) == (tools, parent, children)
            again, _ = driven(agent, driver, "fork", source=fork_id, store=store, at=len(forked["trace"]) - 2)
            assert again.final == "done"
            assert _last_counters(again.steps) == _last_counters(forked["steps"])
            assert (counts.tools, counts.child) == (tools, children)


def _deadline_agent(counts: DeadlineCounts, driver: str, release: threading.Event, **limits: Any) -> Agent:
    """The parent asking ``helper`` for ``c1``, whose child runs ``work`` and hangs in its answer (``limits``: the
    parent's)."""
    child = Agent(HangsInItsAnswer(counts, release), deadline_tools(counts, driver))
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts, ("c1",)), tools, **limits)


@pytest.mark.slow  # the cut waits out the deadline
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_replay_counts_a_share_a_deadline_s_cut_counted_where_the_run_did(driver: str) -> None:
    """The parent's deadline cuts ``c1``'s child in its answer, its ``work`` done: the child stops with the run and
    the share is counted as its outcome comes back (not at an ``interrupted`` edge).  Resumed from the snapshot
    with the deadline lifted and ``max_tool_calls=1``, the run stops on it at once; its replay (no store) stops there
    too and runs no ``work`` again."""
    counts, release = DeadlineCounts(), threading.Event()
    counts.go.set()  # ``work`` never waits: the hold is the child's answer's
    agent = _deadline_agent(counts, driver, release, timeout=DEADLINE)
    try:
        with pytest.raises(AgentLoopError) as stop:
            agent.run("go") if driver == "sync" else asyncio.run(agent.arun("go"))
    finally:
        counts.hold = False
        release.set()
    cut = stop.value.result
    assert cut.reason == "timeout"
    assert cut.snapshot is not None
    assert [(at, call_id) for at, call_id, _ in cut.snapshot["cut_shares"]] == [(len(cut.trace) - 1, "c1")]
    resumed = agent.resume(_as_json(cut.snapshot), timeout=60, max_tool_calls=1)
    with pytest.raises(AgentLoopError) as stop:
        resumed.finish() if driver == "sync" else asyncio.run(resumed.afinish())
    result = stop.value.result
    assert result.reason == "max_tool_calls"
    assert counts.work == Counter({"w-c1": 1})
    assert result.snapshot is not None
    recording = recording_of(_as_json(result.snapshot), {})
    work, models = Counter(counts.work), (counts.parent, counts.child)
    again = _deadline_agent(counts, driver, release, timeout=DEADLINE)
    replayed = replay(again, recording) if driver == "sync" else asyncio.run(areplay(again, recording))
    assert replayed.reason == "max_tool_calls"
    assert [plain(entry) for entry in replayed.trace] == [plain(entry) for entry in result.trace]
    assert replayed.snapshot is not None
    assert _counters(replayed.snapshot["counters"]) == _counters(result.snapshot["counters"])
    assert (counts.work, (counts.parent, counts.child)) == (work, models)
