"""Batches rerun after a driver crash, as the local and the Ray tests both drive them: leases a dead driver left."""

from __future__ import annotations

from pathlib import Path

from fsm_agent import AgentRun, CancelToken, RunLeasedError, SqliteStore
from fsm_agent.batch import derive_run_id, iter_batch
from fsm_agent.persist import open_store
from support.batch_agents import factory


def numbered_questions(n: int) -> list[str]:
    """A batch's items: ``n`` numbered questions."""
    return [f"question {i}" for i in range(n)]


def crash_leaving_leases(ledger: Path, store: Path, questions: list[str], held: range, lease: float) -> list[AgentRun]:
    """A driver that dies mid-batch: the runs at ``held`` cut after their first tool call, leased for ``lease`` s.

    The runs and their store are returned, not closed, and no lease is ever
    given up: to the rerun they are a dead owner's runs, until the leases lapse.
    """
    dead = SqliteStore(store, lease=lease)
    runs = []
    for index in held:
        run = factory(ledger)().start(questions[index], store=dead, run_id=derive_run_id(index, questions[index]))
        for _ in range(4):
            run.advance()
        runs.append(run)
    return runs


def cancel_while_leased(where: Path, **options: object) -> None:
    """Cancel a rerun once the runs the dead driver did not hold are done, and check what became of its runs."""
    questions, held, store = numbered_questions(12), range(4), where / "runs.db"
    # The dead driver's leases must outlast the free runs, or a held run is taken over before the cancel.  The
    # eight free runs took 2.6-2.9 s on Ray quiet and 10.3-12.6 s with two CPU hogs beside it on 2 cores (the
    # actors start slowly then); 60 s is ~5x the worst, and costs nothing: the batch is cancelled once they end.
    # The rerun is given the same lease: a lease longer than its own it takes for a live holder's (``leased``).
    lease = 60.0
    dead = crash_leaving_leases(where, store, questions, held, lease)
    reader = SqliteStore(store)
    before = [reader.load(derive_run_id(i, questions[i])) for i in held]
    token, results, free = CancelToken(), {}, 0
    batch = iter_batch(factory(where), questions, store=store, cancel=token, max_in_flight=4, lease=lease, **options)  # type: ignore[arg-type]
    for item, result in batch:
        results[item.index] = result
        free += item.index not in held
        if free == len(questions) - len(held):
            token.cancel("enough")
    assert sorted(results) == list(range(12))
    assert all(results[i].ok for i in range(12) if i not in held)
    assert [(results[i].reason, results[i].evidence.get("leased")) for i in held] == [("cancelled", True)] * 4
    assert [reader.load(derive_run_id(i, questions[i])) for i in held] == before  # not taken over, not advanced
    reader.close()
    del dead


PROBE_LEASE = 300.0
"""Far longer than a test: a lease that was not given up would still be live when the store is probed."""


def lease_free(target: str, run_id: str) -> bool:
    """Whether a fresh owner can take the stored run over now (nobody's lease on it is live); given back after."""
    with open_store(target, lease=PROBE_LEASE) as store:
        data = store.load(run_id)
        try:
            version = store.claim(run_id, data, owner="probe")
        except RunLeasedError:
            return False
        store.renew(run_id, owner="probe", seq=version, release=True)
        return True
