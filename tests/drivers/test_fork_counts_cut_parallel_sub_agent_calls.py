"""Two sub-agent calls of one reply cut together: each call keeps what its cuts counted, and a fork counts it exactly.

docs/how-to/fork-a-run.md: what every cut of a sub-agent call counted is
added up per call and kept on the exchange that answers it (``cut``), so a
fork, which counts no cut, counts what its source counted.  Here one reply
asks ``helper`` for ``c1`` and ``c2`` (a parallel batch: on the async driver
both children run at once and both are cut in flight; on the sync driver the
cut lands in ``c1``'s child and ``c2`` has not started), cut by the shared
token once, twice with a store, or first without one, then resumed to its
end.  The fork, taken just after the second answer or after the parent's last
reply, from the store or from the snapshot, counts what the source counted
there and at its end.  Counted on both drivers and both stores: each tool
execution by (child input, step), the parent's and each child's model calls.

A source cut twice in one turn could not be rebuilt: at its first cut the
rebuild took the calls made after the second resume as having come back
before the first, and the fork stopped with ``ForkError``.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from support.forkspend_tree import Seen, cut_by_token, driven, spent
from support.storeless_children import SCRIPT, Counts, parent_agent

from fsm_agent.persist import open_store
from fsm_agent.records import plain
from fsm_agent.testing.replay import areplay, replay

DRIVERS = ["sync", "async"]
ASKS = ("c1", "c2")
EVERY_CALL = Counter({(item, step): 1 for item in ASKS for _, step in SCRIPT})
WHOLE = len(ASKS) * (1 + len(SCRIPT))
"""The source's tool calls: each ``helper`` call and each of its child's, once."""


def _as_json(data: Any) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(data))
    return loaded


def _started(driver: str) -> tuple[str, ...]:
    """The children a cut finds in flight: both on the async driver, ``c1``'s alone on the sync one."""
    return ASKS if driver == "async" else ("c1",)


def _cut(counts: Counts, driver: str, store: Any, source: Any = None) -> tuple[dict[str, Any], Seen]:
    """``p`` started (or ``source`` resumed) and cut by its token once each started child holds a ``wait``."""
    result, seen = cut_by_token(
        parent_agent(counts, driver, ASKS), counts, driver, len(_started(driver)), source, store
    )
    assert result.snapshot is not None
    return _as_json(result.snapshot), seen


def _finished(counts: Counts, driver: str, store: Any, source: dict[str, Any]) -> Seen:
    result, seen = driven(parent_agent(counts, driver, ASKS), driver, "resume", store=store, source=source)
    assert result.final == "done"
    return seen


def _stored_once(counts: Counts, driver: str, store: Any) -> Seen:
    _, seen = _cut(counts, driver, store)
    counts.hold = False
    return {**seen, **_finished(counts, driver, store, _as_json(store.load("p")))}


def _stored_twice(counts: Counts, driver: str, store: Any) -> Seen:
    _, seen = _cut(counts, driver, store)
    counts.arm()
    seen.update(_cut(counts, driver, store, _as_json(store.load("p")))[1])
    counts.hold = False
    return {**seen, **_finished(counts, driver, store, _as_json(store.load("p")))}


def _storeless_then_stored(counts: Counts, driver: str, store: Any) -> Seen:
    first, seen = _cut(counts, driver, None)
    counts.arm()
    seen.update(_cut(counts, driver, store, first)[1])
    counts.hold = False
    return {**seen, **_finished(counts, driver, store, _as_json(store.load("p")))}


SOURCES = {"cut once": _stored_once, "cut twice": _stored_twice, "store-less, then stored": _storeless_then_stored}


def _both_answered(data: dict[str, Any]) -> int:
    """The transition just after the parent's second tool outcome (both calls answered)."""
    done = [i for i, entry in enumerate(data["trace"]) if entry["trigger"] == "tool_done"]
    return done[len(ASKS) - 1]


def _same(fork: dict[str, Any], source: dict[str, Any]) -> None:
    assert {**fork, "cost": None} == {**source, "cost": None}
    assert fork["cost"] == source["cost"]  # None: no model here is priced


@pytest.mark.parametrize("from_snapshot", [False, True], ids=["from the store", "from the snapshot"])
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_past_two_cut_sub_agent_calls_of_one_reply_counts_what_the_source_counted(
    store_target: str, driver: str, source: str, from_snapshot: bool
) -> None:
    counts = Counts()
    with open_store(store_target) as store:
        seen = SOURCES[source](counts, driver, store)
        assert counts.tools == EVERY_CALL  # each tool of both children ran once, across every cut and resume
        stored = _as_json(store.load("p"))
        assert stored["cut_counted"] == {}
        cuts = {item["id"]: item["cut"] for item in stored["io"] if item.get("id") in ASKS}
        assert {call_id for call_id, cut in cuts.items() if cut is not None} == set(_started(driver))
        assert spent(stored["counters"])["tool_calls"] == WHOLE
        for at in (_both_answered(stored), len(stored["trace"]) - 2):
            tools, parent, children = Counter(counts.tools), counts.parent, Counter(counts.child)
            given = {"source": stored} if from_snapshot else {"source": "p", "store": store, "run_id": f"f{at}"}
            result, fork_seen = driven(parent_agent(counts, driver, ASKS), driver, "fork", at=at, **given)
            assert result.final == "done"
            assert counts.tools == tools  # the fork ran no tool
            assert counts.child == children  # nor asked any child's model
            assert counts.parent - parent == (1 if at < len(stored["trace"]) - 2 else 0)
            _same(spent(fork_seen[at]), spent(seen[at]))
            _same(spent(fork_seen[max(fork_seen)]), spent(stored["counters"]))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_replay_of_two_sub_agent_calls_of_one_reply_cut_and_resumed_takes_every_recorded_transition(
    store_target: str, driver: str, source: str
) -> None:
    """The stored source replayed (its recorded results, no store): it takes each transition the source took, cuts
    and resumes included (a source cut twice departed at its first cut), runs no tool, asks no model, and ends with
    the source's counters, what the cuts counted included (its clock stands still: the seconds aside)."""
    counts = Counts()
    with open_store(store_target) as store:
        SOURCES[source](counts, driver, store)
        recording = store.export("p")
        stored = _as_json(store.load("p"))
    tools, parent, children = Counter(counts.tools), counts.parent, Counter(counts.child)
    agent = parent_agent(counts, driver, ASKS)
    result = replay(agent, recording) if driver == "sync" else asyncio.run(areplay(agent, recording))
    assert result.final == "done"
    assert [plain(entry) for entry in result.trace] == stored["trace"]
    assert (counts.tools, counts.parent, counts.child) == (tools, parent, children)
    replayed = {name: value for name, value in _as_json(result.steps[-1].counters).items() if name != "seconds"}
    assert replayed == {name: value for name, value in stored["steps"][-1]["counters"].items() if name != "seconds"}
