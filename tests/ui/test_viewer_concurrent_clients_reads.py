"""Clients reading a run while another process advances it, and clients re-running one run at once, via a served viewer.

Readers poll the run's page and the list and follow the run's live events
while a process of its own advances the run through the same store
(SQLite, PostgreSQL): every page is one version of the run (its counters,
timeline and messages agree, and two pages of one version are the same),
the events come in version order and end once the run does, the server
logs nothing and keeps answering.  Two or four clients pressing "Re-run
from here" at once get forks of their own, each run once: each tool
execution and each model call is counted.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.app_owners import JOIN, at_once
from support.fork_agents import ADDED, AFTER_THE_CALL, BEFORE_THE_CALL, SumModel, counting_registry, source_run
from support.viewer_clients import TURNS, CountedModel, advance, calls_of, consistent, follow, get, post, served

from fsm_agent import Agent

pytest.importorskip("uvicorn", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

pytestmark = pytest.mark.subprocess

READERS = 3
"""Clients polling the run's page at once, beside one polling the list and one following the events."""
ANSWERS_WITHIN = 10.0
"""Seconds any one answer may take while the run is written and read: an answer takes about 5 ms on the 2-core
development machine with both stores (2,000 times that, for a busy machine with two CPU hogs beside it)."""


class Pages:
    """Every page the readers were given, by version, checked as it comes: one version is one page."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_version: dict[int, dict[str, Any]] = {}
        self.slowest = 0.0

    def seen(self, page: dict[str, Any]) -> None:
        consistent(page)
        with self.lock:
            first = self.by_version.setdefault(page["version"], page)
        assert first == page, f"two pages of version {page['version']} differ"

    def timed(self, url: str, path: str, **params: str) -> Any:
        start = time.monotonic()
        status, answer = get(url, path, **params)
        with self.lock:
            self.slowest = max(self.slowest, time.monotonic() - start)
        assert status == 200, answer
        return answer


def test_pages_lists_and_events_read_while_another_process_advances_the_run_are_each_one_version(
    store_target: str, tmp_path: Path
) -> None:
    """Run pages, list rows and live events read during a 24-turn run written by another process: none torn."""
    log = tmp_path / "calls.txt"
    spawn = multiprocessing.get_context("spawn")
    started, midway, go_on, reads = spawn.Event(), spawn.Event(), spawn.Event(), spawn.Value("i", 0)
    with served(store_target) as (store, viewer, logged):
        pages = Pages()
        process = spawn.Process(target=advance, args=(store_target, "ticking", str(log), started, midway, go_on, reads))
        process.start()
        try:
            assert started.wait(JOIN), "the advancing process never made its first model call"

            def poll_page() -> int:
                while True:
                    page = pages.timed(viewer.url, "/api/run", id="ticking")
                    pages.seen(page)
                    with reads.get_lock():
                        reads.value += 1
                    if page["state"] in ("Done", "Failed"):
                        return int(page["version"])

            def poll_list() -> list[int]:
                counts = []
                while True:
                    rows = pages.timed(viewer.url, "/api/runs")["runs"]
                    (row,) = (row for row in rows if row["run_id"] == "ticking")
                    counts.append(row["tool_calls"])
                    if row["state"] in ("Done", "Failed"):
                        return counts

            def events() -> tuple[list[str], list[int]]:
                versions: list[int] = []

                def one(page: dict[str, Any]) -> None:
                    pages.seen(page)
                    versions.append(page["version"])

                return follow(viewer.url, "ticking", one), versions

            def release() -> None:
                assert midway.wait(JOIN), "the run never got half-way"
                page = pages.timed(viewer.url, "/api/run", id="ticking")  # read while the run waits half-way
                assert (page["state"], page["tool_calls"]) == ("AwaitModel", TURNS // 2)
                go_on.set()

            def freeing(work: Any) -> Any:
                """``work``, which on failing lets the run go on to its end, so no other reader waits for it."""

                def guarded() -> Any:
                    try:
                        return work()
                    except BaseException:
                        with reads.get_lock():
                            reads.value = 1 << 30
                        go_on.set()
                        raise

                return guarded

            answers = at_once(*(freeing(work) for work in [*[poll_page] * READERS, poll_list, events, release]))
            process.join(JOIN)
            assert process.exitcode == 0
        finally:
            go_on.set()
            if process.is_alive():
                process.kill()
        for answer in answers:
            assert not isinstance(answer, BaseException), answer
        *finals, counts, (names, versions), _ = answers
        final = store.load("ticking")
        assert finals == [final["stored_seq"]] * READERS
        assert counts == sorted(counts)
        assert counts[-1] == TURNS
        assert names[-1] == "end"
        assert set(names[:-1]) == {"message"}
        assert versions == sorted(set(versions))
        assert versions[-1] == final["stored_seq"]
        assert len(pages.by_version) > TURNS // 2  # pages all along the run were read, not just its start and end
        assert pages.slowest < ANSWERS_WITHIN
        assert pages.timed(viewer.url, "/api/config")["mode"] == "read-only"  # still answering
        assert not logged.records
    calls = calls_of(log)
    assert calls == {**{f"model {i}": 1 for i in range(TURNS + 1)}, **{f"tool tick_{i}": 1 for i in range(TURNS)}}


def _settled(store: Any, run_ids: list[str]) -> list[dict[str, Any]]:
    """The runs once each ended (forks run in threads of the viewer's own); fails after ``JOIN`` seconds."""
    deadline = time.monotonic() + JOIN
    while True:
        runs = [store.load(run_id) for run_id in run_ids]
        if all(run["state"] in ("Done", "Failed") for run in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.02)


@pytest.mark.parametrize("clients", [2, 4])
def test_clients_rerunning_one_run_at_once_get_a_fork_each_and_each_fork_calls_once(
    store_target: str, clients: int
) -> None:
    """Re-run from after the call, pressed at once: distinct forks, each asking its model twice and adding once."""
    model = CountedModel(SumModel(calls=2, answer="twice: {}"))
    with served(store_target, agent=Agent(model, counting_registry())) as (store, viewer, logged):
        source_run(store)
        source = store.load("source")
        ADDED.clear()
        answers = at_once(*[lambda: post(viewer.url, "/api/fork", "source", {"at": AFTER_THE_CALL})] * clients)
        assert [status for status, _ in answers] == [201] * clients, answers
        forks = [page["run_id"] for _, page in answers]
        assert len(set(forks)) == clients
        runs = _settled(store, forks)
        assert [(run["state"], run["final"], run["forked_from"]) for run in runs] == [
            ("Done", "twice: 6", ["source", AFTER_THE_CALL])
        ] * clients
        assert sorted(ADDED) == [(3, 3)] * clients  # the fork's own call, once per fork; the source's never again
        assert model.calls == 2 * clients
        assert store.load("source") == source
        listed = {run.run_id for run in store.list_runs() if run.forked_from is not None}
        assert listed == set(forks)
        assert not logged.records


def test_clients_rerunning_before_a_completed_call_at_once_reuse_it_and_pay_one_model_call_each(
    store_target: str,
) -> None:
    """Re-run from just before the source's completed call, by three clients at once: the call is reused by all."""
    model = CountedModel(SumModel())
    with served(store_target, agent=Agent(model, counting_registry())) as (store, viewer, logged):
        source_run(store)
        ADDED.clear()
        answers = at_once(*[lambda: post(viewer.url, "/api/fork", "source", {"at": BEFORE_THE_CALL})] * 3)
        assert [status for status, _ in answers] == [201] * 3, answers
        runs = _settled(store, [page["run_id"] for _, page in answers])
        assert [(run["state"], run["final"]) for run in runs] == [("Done", "the sum is 5")] * 3
        assert (ADDED, model.calls) == ([], 3)
        assert not logged.records


BAD_FORKS = [
    pytest.param("nobody", {"at": 1}, 404, "no run 'nobody' in this store", id="unknown-run"),
    pytest.param("source", {"at": -1}, 400, "at must be a transition number, 0 or more", id="negative-at"),
    pytest.param("source", {"at": True}, 400, "at must be a transition number, 0 or more", id="at-a-bool"),
    pytest.param("source", {"from": 1}, 400, "a re-run is {at: N}", id="no-at"),
    pytest.param("source", {"at": 999}, 409, "cannot be re-run from transition 999", id="at-past-the-end"),
]


@pytest.mark.parametrize(("run_id", "body", "status", "says"), BAD_FORKS)
def test_a_bad_rerun_is_a_specific_4xx_and_stores_nothing(
    store_target: str, run_id: str, body: Any, status: int, says: str
) -> None:
    """An unknown run, a transition that is none, a body without ``at``: refused, and no fork is stored."""
    model = CountedModel(SumModel())
    with served(store_target, agent=Agent(model, counting_registry())) as (store, viewer, logged):
        source_run(store)
        ADDED.clear()
        answer = post(viewer.url, "/api/fork", run_id, body)
        assert answer[0] == status, answer
        assert says in answer[1]["error"], answer
        assert [run.run_id for run in store.list_runs()] == ["source"]
        assert (ADDED, model.calls) == ([], 0)
        assert not logged.records
