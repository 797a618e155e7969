"""A run whose owner renewed its lease past the batch's patience and then died is taken over, not reported ``leased``.

A batch that finds a run leased waits for the lease to lapse, and reports
the run ``leased`` if its holder keeps renewing (a live owner elsewhere).
Before, one renewal past the first wait was enough to give up, so a worker
killed just after renewing left its runs unfinished for a third pass.  Now a
holder is taken for live only if it renewed between two looks both past that
wait (``worker.Patience``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from support.batch_agents import MODEL_LOG, TOOL_LOG, counts, factory

from fsm_agent import RunLeasedError, SqliteStore
from fsm_agent.batch import derive_run_id, iter_batch
from fsm_agent.batch.worker import Later, Patience, _wait_for

LEASE = 1.0
GIVE_UP = 100.0


def _leased_until(until: float) -> RunLeasedError:
    return RunLeasedError("r", "elsewhere", until)


def test_a_holder_whose_lease_ends_within_the_first_wait_is_waited_for() -> None:
    later = _wait_for(_leased_until(GIVE_UP - 1), Patience(GIVE_UP))
    assert isinstance(later, Later)
    assert (later.at > GIVE_UP - 1, later.patience) == (True, Patience(GIVE_UP, GIVE_UP - 1))


def test_a_holder_that_renewed_past_the_first_wait_once_is_waited_for_again() -> None:
    later = _wait_for(_leased_until(GIVE_UP + 5), Patience(GIVE_UP, GIVE_UP - 1))
    assert isinstance(later, Later)
    assert later.patience == Patience(GIVE_UP, GIVE_UP + 5)


def test_a_holder_that_renewed_between_two_looks_past_the_first_wait_is_live_and_the_run_leased() -> None:
    with pytest.raises(RunLeasedError):
        _wait_for(_leased_until(GIVE_UP + 9), Patience(GIVE_UP, GIVE_UP + 5))


def test_a_batch_takes_over_the_run_of_an_owner_that_renewed_past_its_first_wait_and_then_died(tmp_path: Path) -> None:
    questions = [f"question {i}" for i in range(2)]
    path = tmp_path / "runs.db"
    held = SqliteStore(path, lease=LEASE)
    owner = factory(tmp_path)().start(questions[0], store=held, run_id=derive_run_id(0, questions[0]))
    for _ in range(4):  # its first model call and tool call made: leased to this owner, unfinished
        owner.advance()
    journal = owner._journal
    assert journal is not None
    journal.beat()  # the owner lives: its lease is renewed every third of a lease

    def dies(item: object) -> None:
        # Half a lease after the batch first looked (its first wait is a lease): renewed past that wait, then gone.
        threading.Timer(LEASE / 2, journal.rest).start()

    started = time.monotonic()
    batch = iter_batch(
        factory(tmp_path), questions, store=path, executor="local", lease=LEASE, max_in_flight=1, on_start=dies
    )
    results = [result for _, result in sorted(batch, key=lambda finished: finished[0].index)]
    assert [result.reason for result in results] == ["done", "done"]
    assert time.monotonic() - started < 10 * LEASE  # waited for the lease, never for long
    tools = counts(tmp_path / TOOL_LOG)
    assert set(tools.values()) == {1}, tools  # each tool call made once, the owner's one included
    model = counts(tmp_path / MODEL_LOG)
    assert set(model.values()) == {1}, model  # each model turn once: the owner's first is not asked again
    held.close()
