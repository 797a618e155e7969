"""Per-step time and memory for runs of K = 64, 512 and 4,096 tool turns: both must stay flat as K grows.

A guard that rescanned the run's history would make each step cost more the
longer the run, so time per step would grow with K; a per-step record that
grew with K would show in bytes per step.  Each step is one tool turn (a
model call asking for one tool, and that tool call); the agent has every
limit set and the cycle guard on, the most guard work a step can do.

Time is the median of interleaved rounds without tracing; memory is measured
in separate runs under ``tracemalloc`` (which slows everything down): the
bytes a finished run keeps per step, and the peak per step while it runs.
``tests/core/test_properties.py`` checks the same property by counting executed
lines rather than timing, so CI never depends on a machine's speed.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
import tracemalloc

from benchmarks.bench_engine import ALL_LIMITS, Script
from benchmarks.targets import record
from fsm_agent import Agent, RunResult
from fsm_agent.testing import demo_registry

KS = (64, 512, 4096)
MAX_GROWTH = 1.5
"""Per-step cost at the largest K may be at most this multiple of the cost at the smallest before we call it growth."""


def _agent(k: int) -> tuple[Agent, Script]:
    script = Script(k)
    return Agent(script, demo_registry(), max_steps=k + 1, **ALL_LIMITS), script  # type: ignore[arg-type]


def _run(agent: Agent, script: Script, k: int) -> RunResult:
    script.i = 0
    result = agent.run("go")
    if (result.final, len(result.steps)) != ("done", k + 1):
        raise SystemExit(f"benchmark workload broken at K={k}: {result.reason}")
    return result


def time_per_step(k: int, rounds: int = 9, budget_steps: int = 4096) -> float:
    """Median µs per tool turn over ``rounds`` rounds, each running about ``budget_steps`` steps."""
    agent, script = _agent(k)
    _run(agent, script, k)
    runs = max(1, budget_steps // k)
    samples = []
    for _ in range(rounds):
        gc.collect()
        start = time.perf_counter_ns()
        for _ in range(runs):
            _run(agent, script, k)
        samples.append((time.perf_counter_ns() - start) / 1000 / runs / k)
    return statistics.median(samples)


def bytes_per_step(k: int) -> tuple[float, float]:
    """(bytes a finished run keeps, peak bytes while running) per tool turn, under tracemalloc."""
    agent, script = _agent(k)
    _run(agent, script, k)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = _run(agent, script, k)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return (kept - before) / k, (peak - before) / k


def main() -> int:
    """Print the table of medians; exit 1 if the per-step cost grows with K."""
    print("per tool turn, every limit set, cycle_window=6 (time: median of 9 rounds; memory: tracemalloc)")
    print(f"{'K':>6} {'µs/step':>9} {'kept B/step':>12} {'peak B/step':>12}")
    rows = []
    for k in KS:
        micros = time_per_step(k)
        kept, peak = bytes_per_step(k)
        rows.append((k, micros, kept, peak))
        print(f"{k:>6} {micros:>9.2f} {kept:>12.0f} {peak:>12.0f}")
    first, last = rows[0], rows[-1]
    time_growth, memory_growth = last[1] / first[1], last[2] / first[2]
    flat = record(f"time per step, K={last[0]} / K={first[0]}", time_growth, MAX_GROWTH)
    flat = record(f"memory per step, K={last[0]} / K={first[0]}", memory_growth, MAX_GROWTH) and flat
    print(
        f"K={last[0]} vs K={first[0]}: time per step x{time_growth:.2f}, memory per step x{memory_growth:.2f}: "
        f"{'flat' if flat else 'GROWING'} (limit x{MAX_GROWTH})"
    )
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
