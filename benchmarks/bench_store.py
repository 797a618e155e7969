"""Checkpoint cost per transition at 64, 512 and 4,096 tool turns, for SQLite and PostgreSQL; 1,000 async runs.

A store that rewrote a run's whole history at every transition would cost
more per transition the longer the run (quadratic in total); the journal
appends only what each transition added, so the cost per transition must
stay flat: at 4,096 turns within ``MAX_GROWTH`` of the cost at 64.  The
store's cost is the time spent checkpointing (``Journal.save``: building the
entry and the database write), divided by the transitions; the engine's own
cost per transition is measured on the same workload without a store, in
the same rounds.  Figures are medians of rounds.  First, the store
transactions of one run of 7 model calls and 6 tool calls for each
``every`` (per transition, per call, per turn); ``every="call"`` must stay
within calls + 2 (recorded with ``benchmarks.targets.record``).

PostgreSQL runs on ``$FSM_AGENT_PG_DSN`` if set, else on a throwaway cluster
started here (``tests/support/pg_cluster.py``: Debian's ``postgresql`` package); the
PostgreSQL figures are skipped, with one line saying so, when neither exists.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.bench_async import SleepyModel, registry
from benchmarks.bench_engine import Script
from benchmarks.targets import record
from fsm_agent import Agent, PostgresStore, RunResult, SqliteStore
from fsm_agent.persist.journal import Journal
from fsm_agent.records import plain
from fsm_agent.testing import demo_registry

KS = (64, 512, 4096)
# Each table row: the engine's own µs per transition, the store's µs per transition (checkpointing), their ratio,
# and the store's cost per transition against the engine's cost per step (a tool turn, four transitions).
MAX_GROWTH = 1.5
MAX_SQLITE_OVERHEAD = 10.0
"""SQLite's checkpoint cost per transition may be at most this multiple of the engine's own per-transition cost."""
CONCURRENT_RUNS = 1000

_spent = [0.0]


def _timed_save(original: Callable[..., None]) -> Callable[..., None]:
    def save(self: Journal, *args: Any) -> None:
        start = time.perf_counter()
        try:
            original(self, *args)
        finally:
            _spent[0] += time.perf_counter() - start

    return save


Journal.save = _timed_save(Journal.save)  # type: ignore[method-assign]


def _agent(k: int) -> tuple[Agent, Script]:
    script = Script(k)
    return Agent(script, demo_registry(), max_steps=k + 1), script


def one_round(k: int, store: Any, label: str, budget_steps: int = 4096) -> tuple[float, float]:
    """µs per transition of the engine alone, then of checkpointing, over about ``budget_steps`` tool turns."""
    agent, script = _agent(k)
    runs = max(1, budget_steps // k)
    gc.collect()
    start, transitions = time.perf_counter(), 0
    for _ in range(runs):
        script.i = 0
        transitions += len(agent.run("go").trace)
    engine = (time.perf_counter() - start) / transitions * 1e6
    gc.collect()
    _spent[0] = 0.0
    for n in range(runs):
        script.i = 0
        agent.run("go", store=store, run_id=f"k{k}-{label}-{n}")
    return engine, _spent[0] / transitions * 1e6


def report_scaling(name: str, make_store: Callable[[], Any], rounds: int) -> None:
    """Print the table for one store; the rounds of every K are interleaved, so machine noise hits them alike."""
    print(f"\n{name}: µs per transition (medians of {rounds} rounds)")
    print(f"{'K tool turns':>13} {'engine':>9} {'store':>9} {'store/engine':>13} {'store/engine step':>18}")
    stores = {k: make_store() for k in KS}
    samples: dict[int, list[tuple[float, float]]] = {k: [] for k in KS}
    try:
        for r in range(rounds):
            for k in KS:
                samples[k].append(one_round(k, stores[k], f"r{r}"))
    finally:
        for store in stores.values():
            store.close()
    costs = {}
    for k in KS:
        engine = statistics.median(e for e, _ in samples[k])
        saving = costs[k] = statistics.median(s for _, s in samples[k])
        # A step (one tool turn: model call, check, dispatch, tool call) is four transitions.
        step = engine * (4 * k + 3) / k
        print(f"{k:>13} {engine:>9.1f} {saving:>9.1f} {saving / engine:>13.1f} {saving / step:>18.1f}")
    growth = costs[KS[-1]] / costs[KS[0]]
    verdict = "flat" if growth <= MAX_GROWTH else "GROWS"
    print(f"store cost at K={KS[-1]} / K={KS[0]}: {growth:.2f}x (target <= {MAX_GROWTH}x: {verdict})")


async def _many(dsn: str, n: int) -> None:
    store = PostgresStore(dsn, max_size=20)
    agent = Agent(SleepyModel(8, 0.01), registry(), max_steps=9)
    start = time.perf_counter()
    results: list[RunResult] = await asyncio.gather(
        *(agent.arun("go", store=store, run_id=f"many-{i}") for i in range(n))
    )
    elapsed = time.perf_counter() - start
    different = 0
    for i, result in enumerate(results):
        loaded = await store.aload(f"many-{i}")
        mine = json.loads(json.dumps({"messages": [plain(m) for m in result.messages], "final": result.final}))
        mine["trace"] = [plain(t) for t in result.trace]
        mine["steps"] = json.loads(json.dumps([plain(s) for s in result.steps]))
        if any(loaded[key] != value for key, value in mine.items()) or loaded["state"] != "Done":
            different += 1
    await store.aclose()
    finished = sum(1 for r in results if r.ok)
    print(
        f"\n{n} concurrent async runs (8 tool turns, model sleeps 10 ms) checkpointing to one PostgreSQL store:"
        f" {finished} finished in {elapsed:.1f} s ({n / elapsed:.0f} runs/s);"
        f" {n - different} of {n} load back identical to their in-memory result"
    )


TX_TURNS = 6
"""Tool turns of the run whose store transactions are counted: 7 model calls and 6 tool calls."""


def transactions_per_run(make_store: Callable[[str], Any]) -> dict[str, int]:
    """Store transactions of one run of ``TX_TURNS`` tool turns, per ``every``: the plans the store ran.

    Each plan is one transaction on both stores (SQLite: ``BEGIN`` ...
    ``COMMIT``; PostgreSQL: a transaction, or one fenced statement in
    autocommit), reads included; ``tests/persist/test_store_transactions.py`` checks
    the same figure against the databases' own commit counters.
    """
    counts = {}
    for every in ("transition", "call", "turn"):
        store = make_store(every)
        ran = [0]
        real = store._run

        def run(plan: Any, *, _real: Any = real, _ran: list[int] = ran, **options: Any) -> Any:
            _ran[0] += 1
            return _real(plan, **options)

        store._run = run
        agent, _ = _agent(TX_TURNS)
        agent.run("go", store=store, run_id=f"tx-{every}")
        store.close()
        counts[every] = ran[0]
    return counts


def report_transactions(name: str, make_store: Callable[[str], Any]) -> int:
    """Print the store transactions of one run per ``every``; return the excess over calls for ``every="call"``."""
    calls = (TX_TURNS + 1) + TX_TURNS
    counts = transactions_per_run(make_store)
    figures = ", ".join(f"every={every!r} {n}" for every, n in counts.items())
    print(f"\n{name}: store transactions per run of {calls} calls ({TX_TURNS + 1} model, {TX_TURNS} tool): {figures}")
    return counts["call"] - calls


@contextmanager
def postgres() -> Iterator[str | None]:
    """A PostgreSQL DSN: ``$FSM_AGENT_PG_DSN``, or a throwaway cluster; ``None`` if there is no PostgreSQL."""
    dsn = os.environ.get("FSM_AGENT_PG_DSN")
    if dsn:
        yield dsn
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    pg_cluster = importlib.import_module("support.pg_cluster")  # tests/support/pg_cluster.py, shared with the tests

    bindir = pg_cluster.find_bindir()
    if bindir is None:
        print(f"\nPostgreSQL figures skipped: no PostgreSQL ({pg_cluster.HOW_TO_GET})")
        yield None
        return
    cluster = pg_cluster.Cluster(bindir, fsync=True).start()
    try:
        yield cluster.new_database("bench")
    finally:
        cluster.stop()


class _Both:
    """``Script``'s replies for both drivers: the async one awaits the same reply."""

    def __init__(self, k: int) -> None:
        self.script = Script(k)

    def complete(self, messages: Any, tools: Any) -> Any:
        return self.script.complete(messages, tools)

    async def acomplete(self, messages: Any, tools: Any) -> Any:
        return self.script.complete(messages, tools)


def async_against_sync(folder: str, rounds: int = 5, runs: int = 300, k: int = 8, in_flight: int = 100) -> float:
    """Runs per second of ``in_flight`` concurrent async runs on one SQLite store, over sequential sync runs.

    The two sides alternate for ``rounds`` rounds, each on new store files, and the median of the rounds'
    ratios is returned: one pair of measurements moved by about 20% from one run of the bench to the next.
    """
    tools = demo_registry()

    def sequential(store: SqliteStore, label: str) -> None:
        for i in range(runs):
            Agent(_Both(k), tools, max_steps=k + 1).run("go", store=store, run_id=f"{label}{i}")

    async def concurrent(store: SqliteStore, label: str) -> None:
        slots = asyncio.Semaphore(in_flight)

        async def one(i: int) -> None:
            async with slots:
                await Agent(_Both(k), tools, max_steps=k + 1).arun("go", store=store, run_id=f"{label}{i}")

        await asyncio.gather(*(one(i) for i in range(runs)))

    def per_second(side: Callable[[SqliteStore, str], Any], label: str) -> float:
        with SqliteStore(Path(folder, f"{label}.db")) as store:
            started = time.perf_counter()
            side(store, label)
            return runs / (time.perf_counter() - started)

    pairs = [
        (
            per_second(sequential, f"s{n}-"),
            per_second(lambda store, label: asyncio.run(concurrent(store, label)), f"a{n}-"),
        )
        for n in range(rounds)
    ]
    ratios = [together / alone for alone, together in pairs]
    print(
        f"SqliteStore, {k} tool turns, {rounds} alternating rounds: {runs} sequential sync runs "
        f"{statistics.median(alone for alone, _ in pairs):.0f} runs/s, {in_flight} async runs in flight "
        f"{statistics.median(together for _, together in pairs):.0f} runs/s (medians); ratio per round "
        + ", ".join(f"{ratio:.2f}" for ratio in ratios)
    )
    return statistics.median(ratios)


def main() -> None:
    """Print the scaling tables for both stores and the concurrency figures."""
    print(f"Python {sys.version.split()[0]}; scaling with every='transition' (a checkpoint after every transition),")
    print("the concurrent runs with the default every='call' (a checkpoint per call)")
    with tempfile.TemporaryDirectory() as folder:
        files = iter(range(100))
        excess = report_transactions("SqliteStore", lambda every: SqliteStore(Path(folder, f"tx-{every}.db"), every))
        each = "transition"
        report_scaling("SqliteStore", lambda: SqliteStore(Path(folder, f"bench{next(files)}.db"), each), rounds=5)
        ratio = async_against_sync(folder)
    record("SQLite: concurrent async runs / sequential sync runs (runs/s)", ratio, 1.0, "x", higher_is_better=True)
    with postgres() as dsn:
        if dsn is not None:
            excess = max(excess, report_transactions("PostgresStore", lambda every: PostgresStore(dsn, every)))
            report_scaling("PostgresStore", lambda: PostgresStore(dsn, "transition"), rounds=3)
            asyncio.run(_many(dsn, CONCURRENT_RUNS))
    record("store transactions per run, every='call', - (model + tool calls)", excess, 2, " tx")


if __name__ == "__main__":
    main()
