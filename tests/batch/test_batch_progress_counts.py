"""The progress a batch shows counts right: runs done, failed by reason, in flight, and the closing table.

The tally is fed as ``run_batch`` and the ``batch`` command feed it: its
``start`` and ``end`` are the executor's ``on_start`` and ``on_end``, and
each result is counted as the caller takes it.  ``Watched`` reads it at each
report of the executor and at each result taken (where the bar draws), so
the checks see every count the bar could show.
"""

from __future__ import annotations

import io
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from support.batch_agents import factory
from support.batch_leases import crash_leaving_leases, numbered_questions

from fsm_agent import CancelToken, RunResult
from fsm_agent.batch import BatchItem, Counts, Executor, Tally, iter_batch, run_batch

WAIT = 60.0
"""Seconds to wait for the executor to start or end the runs (it needs well under one)."""

LEASE = 60.0
"""Seconds a dead driver's leases last: longer than the free runs of the batch beside them take.

The same figure as ``support.batch_leases.cancel_while_leased``, measured
there for the same batch (eight free runs, four at once): at most 12.6 s on
Ray with two CPU hogs beside it.  It costs nothing: the batch is cancelled
once the free runs end.
"""

EXECUTORS = ["local", pytest.param("ray", marks=pytest.mark.ray)]


class Watched:
    """A ``Tally`` fed as ``run_batch`` feeds it, read at each report of the executor and at each result taken.

    The local executor reports from its own thread, where a failed assert
    would end the batch rather than the test: the readings are kept, and
    ``check`` judges them in the test's thread.  A result taken while its
    run is still in a worker (started more often than ended) is noted too:
    an executor that handed the result over before reporting the end would
    let the bar count that run twice, in flight and finished.
    """

    def __init__(self, total: int, max_in_flight: int) -> None:
        self.tally = Tally(total)
        self.max_in_flight = max_in_flight
        self.readings: list[Counts] = []
        self.starts: Counter[int] = Counter()
        self.ends: Counter[int] = Counter()
        self.taken: set[int] = set()
        self.taken_in_flight: list[int] = []
        self._lock = threading.Lock()

    def start(self, item: BatchItem) -> None:
        """The executor's ``on_start``."""
        self.tally.start(item)
        with self._lock:
            self.starts[item.index] += 1
            self.readings.append(self.tally.counts())

    def end(self, item: BatchItem) -> None:
        """The executor's ``on_end``, letting the caller's thread run first.

        The local executor's thread holds the GIL from one step to the
        next, so a result handed over just before this report would almost
        never be taken before it.  ``sleep(0)`` (no wait: it lets the other
        thread have the GIL) gives the caller that chance: with the report
        moved after the hand-over, the caller took the result first in 139
        of 160 runs (five batches of 32), without it in none of 160.  A
        right executor is never caught: its result is not there to take.
        """
        time.sleep(0)
        with self._lock:
            self.ends[item.index] += 1
        self.tally.end(item)
        with self._lock:
            self.readings.append(self.tally.counts())

    def ended(self) -> int:
        """How many times the executor reported a run back from its worker."""
        with self._lock:
            return sum(self.ends.values())

    def take(self, item: BatchItem, result: RunResult) -> Counts:
        """The caller took ``result``: counted as ``Bar.update`` counts it, and read as the bar draws it."""
        with self._lock:
            self.taken.add(item.index)
            if self.starts[item.index] != self.ends[item.index]:
                self.taken_in_flight.append(item.index)
        self.tally.finish(result)
        now = self.tally.counts()
        with self._lock:
            self.readings.append(now)
        assert now.finished == len(self.taken), now
        return now

    def check(self) -> None:
        """Every reading adds up to the total, none below zero or over the limit; each run handed out came back."""
        assert self.readings
        for now in self.readings:
            assert now.done + now.failed + now.in_flight + now.waiting == now.total, now
            assert min(now.done, now.failed, now.in_flight, now.waiting) >= 0, now
            assert now.in_flight <= self.max_in_flight, now
        assert self.taken_in_flight == []
        assert self.starts == self.ends


def test_the_tally_counts_in_flight_from_the_executors_reports_not_from_the_results_read() -> None:
    """A run is in flight from ``start`` to ``end``; its result taken later moves it from waiting to finished."""
    tally = Tally(3)
    first, second = BatchItem(0, "q0", "r0"), BatchItem(1, "q1", "r1")
    tally.start(first)
    tally.start(second)
    assert tally.counts() == Counts(total=3, done=0, failed_by=(), in_flight=2)
    assert tally.counts().waiting == 1
    tally.end(first)
    assert (tally.in_flight, tally.counts().waiting, tally.finished) == (1, 2, 0)
    tally.finish(RunResult((), (), "a"))
    assert (tally.in_flight, tally.counts().waiting, tally.finished) == (1, 1, 1)
    assert tally.line() == "done 1 · failed 0 · in flight 1"


def test_a_cancelled_local_batch_tallies_every_input_once_and_ends_with_none_in_flight(tmp_path: Path) -> None:
    """Cancel after two results: every input is counted under its reason, and nothing is left in flight."""
    questions = [f"question {i}" for i in range(12)]
    watched, token = Watched(len(questions), max_in_flight=3), CancelToken()
    tally = watched.tally
    batch = iter_batch(factory(tmp_path, latency=0.02), questions, store=tmp_path / "runs.db", executor="local",
                       max_in_flight=3, cancel=token, on_start=watched.start, on_end=watched.end)  # fmt: skip
    for item, result in batch:
        watched.take(item, result)
        if tally.finished == 2:
            token.cancel("enough")
    watched.check()
    assert tally.finished == tally.total == 12
    assert tally.in_flight == 0
    assert set(tally.reasons) <= {"done", "cancelled"}
    assert tally.reasons["cancelled"] >= 1
    assert tally.line().endswith("· in flight 0")
    table = dict(line.split() for line in tally.table().splitlines()[1:])
    assert sum(int(n) for reason, n in table.items() if reason != "total") == 12
    assert "not run" not in table


def test_run_batchs_bar_ends_counting_every_run_by_reason(tmp_path: Path) -> None:
    """The last line drawn says all runs finished, done and failed by reason, none in flight."""
    shown = io.StringIO()
    inputs = ["question 0", "loop 1", "question 2", "loop 3", "question 4"]
    results = run_batch(factory(tmp_path), inputs, store=tmp_path / "runs.db", executor="local", progress=shown)
    assert [r.reason for r in results] == ["done", "repeated_action"] * 2 + ["done"]
    drawn = [part for part in shown.getvalue().replace("\r", "\n").splitlines() if "runs |" in part]
    assert drawn[-1].startswith("5/5 runs |")
    assert "done 3 · failed 2 (repeated_action 2) · in flight 0" in drawn[-1]


def test_in_flight_never_exceeds_max_in_flight_while_results_wait_to_be_read(tmp_path: Path) -> None:
    """One run at a time: whenever the tally is drawn, at most one run is in flight.

    The caller here reads the first result only once the third run has
    begun (so the first two have ended): as a busy terminal or a slow
    ``--out`` disk makes the command's loop lag behind the executor.
    """
    watched = Watched(3, max_in_flight=1)
    third = threading.Event()

    def start(item: BatchItem) -> None:
        watched.start(item)
        if item.index == 2:
            third.set()

    batch = iter_batch(factory(tmp_path), ["question 0", "question 1", "question 2"], store=tmp_path / "runs.db",
                       executor="local", max_in_flight=1, on_start=start, on_end=watched.end)  # fmt: skip
    shown = []
    for item, result in batch:
        assert third.wait(WAIT)
        shown.append(watched.take(item, result).line())
    assert all(line.endswith(("in flight 0", "in flight 1")) for line in shown), shown
    watched.check()


def test_a_reader_behind_the_executor_sees_every_ended_run_out_of_flight_and_waiting(tmp_path: Path) -> None:
    """24 runs, 3 at once, read only once all have ended: each draw shows none in flight, the unread ones waiting."""
    questions = numbered_questions(24)
    watched = Watched(len(questions), max_in_flight=3)
    every_run_ended = threading.Event()

    def end(item: BatchItem) -> None:
        watched.end(item)
        if watched.ended() == len(questions):
            every_run_ended.set()

    batch = iter_batch(factory(tmp_path), questions, store=tmp_path / "runs.db", executor="local", max_in_flight=3,
                       on_start=watched.start, on_end=end)  # fmt: skip
    for taken, (item, result) in enumerate(batch, 1):
        assert every_run_ended.wait(WAIT)
        now = watched.take(item, result)
        assert (now.in_flight, now.finished, now.waiting) == (0, taken, len(questions) - taken)
    watched.check()
    assert watched.tally.counts() == Counts(total=24, done=24, failed_by=(), in_flight=0)


@pytest.mark.slow
def test_a_reader_keeping_up_never_takes_a_result_whose_run_is_still_counted_in_flight(tmp_path: Path) -> None:
    """64 runs, 4 at once, read as they come: every run ends before its result is read, and every count adds up."""
    questions = numbered_questions(64)
    watched = Watched(len(questions), max_in_flight=4)
    batch = iter_batch(factory(tmp_path), questions, store=tmp_path / "runs.db", executor="local", max_in_flight=4,
                       on_start=watched.start, on_end=watched.end)  # fmt: skip
    for item, result in batch:
        now = watched.take(item, result)
        assert now.in_flight <= 4, now
    watched.check()
    assert sorted(watched.taken) == list(range(64))
    assert watched.tally.counts() == Counts(total=64, done=64, failed_by=(), in_flight=0)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_runs_back_in_line_on_a_dead_drivers_lease_are_not_counted_in_flight(
    tmp_path: Path, executor: Executor, request: pytest.FixtureRequest
) -> None:
    """Four runs a dead driver leases take the four slots first and go back in line: never more than four in flight.

    The rerun is cancelled once the eight free runs end; the leased ones,
    still waiting on their leases, then end ``cancelled`` without a slot.
    """
    if executor == "ray":
        request.getfixturevalue("cluster")
    questions, held = numbered_questions(12), range(4)
    dead = crash_leaving_leases(tmp_path, tmp_path / "runs.db", questions, held, LEASE)
    watched, token, free = Watched(len(questions), max_in_flight=4), CancelToken(), 0
    batch = iter_batch(factory(tmp_path), questions, store=tmp_path / "runs.db", executor=executor, max_in_flight=4,
                       lease=LEASE, cancel=token, on_start=watched.start, on_end=watched.end)  # fmt: skip
    for item, result in batch:
        watched.take(item, result)
        free += item.index not in held
        if free == len(questions) - len(held):
            token.cancel("enough")
    watched.check()
    assert [watched.starts[i] for i in held] == [1] * 4  # each was handed to a worker, and went back in line
    assert watched.tally.counts() == Counts(total=12, done=8, failed_by=(("cancelled", 4),), in_flight=0)
    del dead


@pytest.mark.parametrize("executor", EXECUTORS)
def test_leaving_a_batch_early_leaves_no_run_counted_in_flight(
    tmp_path: Path, executor: Executor, request: pytest.FixtureRequest
) -> None:
    """The loop left after the first result: once the batch is closed, every run handed to a worker came back."""
    if executor == "ray":
        request.getfixturevalue("cluster")
    questions = numbered_questions(12)
    watched = Watched(len(questions), max_in_flight=4)
    batch = iter_batch(factory(tmp_path, latency=0.05), questions, store=tmp_path / "runs.db", executor=executor,
                       max_in_flight=4, on_start=watched.start, on_end=watched.end)  # fmt: skip
    for item, result in batch:
        watched.take(item, result)
        break
    batch.close()
    watched.check()
    assert watched.tally.finished == 1
    assert watched.tally.in_flight == 0
