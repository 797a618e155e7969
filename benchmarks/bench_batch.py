"""Batches: throughput on a local Ray instance, with the local executor and in one async process; recovery from kills.

The workload is the issue's: runs of 8 tool turns with a scripted model
that waits 20 ms per call, checkpointed in a SQLite store.  ``--runs``
changes the batch size (2,000 by default), ``--kill-every`` how often the
recovery pass kills a worker.  A rerun after a driver crash (the dead
driver's runs still leased, one per slot) is measured against a clean
batch with the local executor: runs/s over the runs it did not hold.  Run it as ``python -m benchmarks.bench_batch``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import math
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from fsm_agent import Agent, Message, ModelResponse, SqliteStore, ToolCall, ToolRegistry
from fsm_agent.batch import derive_run_id, iter_batch, run_batch
from fsm_agent.testing import reply, tool_turn
from fsm_agent.tools import JSONSchema

TOOL_TURNS = 8
LATENCY = 0.02


class Scripted:
    """Waits ``LATENCY`` per call, asks for ``TOOL_TURNS`` tool calls, then answers; stateless, so runs resume."""

    def _next(self, messages: Sequence[Message]) -> ModelResponse:
        question = next(m.content for m in messages if m.role == "user")
        done = sum(1 for m in messages if m.role == "assistant")
        if done < TOOL_TURNS:
            return tool_turn(ToolCall(f"{question}/{done}", "step", {"n": done}))
        return reply(f"answered {question}")

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        time.sleep(LATENCY)
        return self._next(messages)

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        await asyncio.sleep(LATENCY)
        return self._next(messages)


def make_agent(ledger: str | None = None, kill_every: int = 0) -> Agent:
    """The benchmark's agent: the scripted model and a ``step`` tool.

    With a ``ledger``, each completed tool call is a line there, and every
    ``kill_every``-th run's worker dies right after its fifth tool call did
    its work: the worst moment, when the effect happened and its checkpoint
    did not.
    """
    tools = ToolRegistry()

    @tools.register
    def step(n: int, call_id: str) -> int:
        """One step of work."""
        if ledger is not None:
            fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.write(fd, f"{call_id}\n".encode())
            os.close(fd)
            run = int(call_id.split()[1].split("/")[0])
            marker = Path(f"{ledger}.killed-{run}")
            if kill_every and run % kill_every == 0 and n == 4 and not marker.exists():
                marker.touch()
                os._exit(1)
        return n

    return Agent(Scripted(), tools, max_steps=TOOL_TURNS + 1)


def questions(n: int) -> list[str]:
    """The batch's inputs: distinct questions, so every run has its own id and tool call ids."""
    return [f"question {i}" for i in range(n)]


async def one_process(n: int, in_flight: int) -> float:
    """The baseline: ``Agent.arun`` over every question in one event loop, no store."""
    agent = make_agent()
    gate = asyncio.Semaphore(in_flight)

    async def one(q: str) -> None:
        async with gate:
            await agent.arun(q)

    start = time.perf_counter()
    await asyncio.gather(*(one(q) for q in questions(n)))
    return time.perf_counter() - start


def timed_batch(n: int, where: Path, name: str, **options: object) -> tuple[float, list[str]]:
    """Seconds for one ``run_batch`` over ``n`` questions in a fresh store, and each run's reason."""
    start = time.perf_counter()
    results = run_batch(make_agent, questions(n), store=where / f"{name}.db", progress=False, **options)  # type: ignore[arg-type]
    return time.perf_counter() - start, [r.reason for r in results]


def crashed_rerun(n: int, where: Path, in_flight: int, lease: float) -> tuple[float, float, list[str]]:
    """A rerun after a driver crash: its first ``in_flight`` runs claimed by a dead owner for ``lease`` seconds.

    Seconds until every run the dead driver did not hold is done, seconds
    until all are (the held ones once their leases lapse), and each run's reason.
    """
    store = where / "crash.db"
    dead = SqliteStore(store, lease=lease)  # claims each run it starts, and never gives a lease up
    asked = questions(n)
    held = min(in_flight, n)
    for index in range(held):
        make_agent().start(asked[index], store=dead, run_id=derive_run_id(index, asked[index]))
    reasons: dict[int, str] = {}
    free, free_done = 0, 0.0
    start = time.perf_counter()
    for item, result in iter_batch(make_agent, asked, store=store, executor="local", max_in_flight=in_flight):
        reasons[item.index] = result.reason
        if item.index >= held:
            free += 1
            if free == n - held:
                free_done = time.perf_counter() - start
    total = time.perf_counter() - start
    dead.close()
    return free_done, total, [reasons[index] for index in range(n)]


def cpu_seconds(process: object) -> float:
    """CPU seconds (user + system) of one ``psutil.Process``, with those of the children it reaped."""
    times = process.cpu_times()  # type: ignore[attr-defined]
    return float(times.user + times.system + times.children_user + times.children_system)


class CpuMeter:
    """CPU seconds of this process and every process under it (Ray's, its workers) while a batch runs.

    Sampled every 50 ms by pid, so a worker that ends with the batch (Ray's
    raylet does not account for the workers it reaps) counts up to its last
    sample: at most 50 ms of its CPU goes uncounted.
    """

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self.first = self._sample()
        self.last = dict(self.first)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _sample(self) -> dict[int, float]:
        me = self._psutil.Process()
        seen = {}
        for process in [me, *me.children(recursive=True)]:
            try:
                seen[process.pid] = cpu_seconds(process)
            except self._psutil.Error:  # ended between the listing and the look
                continue
        return seen

    def _watch(self) -> None:
        while not self._done.wait(0.05):
            self.last.update(self._sample())

    def stop(self) -> float:
        """Stop sampling; CPU seconds used since the meter started."""
        self._done.set()
        self._thread.join()
        self.last.update(self._sample())
        return sum(used - self.first.get(pid, 0.0) for pid, used in self.last.items())


def cpu_per_run(n: int, where: Path, name: str, repeat: int, **options: object) -> float:
    """The median over ``repeat`` batches of CPU seconds per run of every process involved (one fresh store each)."""
    figures = []
    for attempt in range(repeat):
        meter = CpuMeter()
        _, reasons = timed_batch(n, where, f"{name}-cpu{attempt}", **options)
        figures.append(meter.stop() / n)
        assert set(reasons) == {"done"}, Counter(reasons)
    return statistics.median(figures)


def cpu_comparison(n: int, where: Path, in_flight: int, repeat: int) -> None:
    """CPU per run on Ray (the actor pool, a local instance) against the local executor, same workload and runs at once.

    Run within ``main``'s Ray instance (started by it, so its processes are
    this one's children), after the throughput figures.
    """
    local = cpu_per_run(n, where, "local", repeat, executor="local", max_in_flight=in_flight)
    on_ray = cpu_per_run(n, where, "ray", repeat, max_in_flight=in_flight)
    ratio = on_ray / local
    print(f"  CPU per run (median of {repeat}, all processes): local executor {local * 1000:.1f} ms, "
          f"Ray {on_ray * 1000:.1f} ms: ratio {ratio:.2f} (target <= 1.3)")  # fmt: skip
    try:
        from benchmarks.targets import record
    except ImportError:  # run from elsewhere than the repository's root
        return
    record("Ray CPU per run / local executor", ratio, 1.3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--kill-every", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=256, help="runs at once for the local executor and baseline")
    parser.add_argument("--cpu-runs", type=int, default=1000, help="runs per batch of the CPU-per-run comparison")
    parser.add_argument("--repeat", type=int, default=3, help="batches per executor of the CPU-per-run comparison")
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU-per-run comparison")
    args = parser.parse_args()
    import ray

    n = args.runs
    alone = asyncio.run(one_process(1, 1))
    print(f"batch benchmark: {n} runs x {TOOL_TURNS} tool turns, model latency {LATENCY * 1000:.0f} ms, "
          f"{os.cpu_count()} CPUs; one run alone takes {alone * 1000:.0f} ms")  # fmt: skip
    if args.cpu_only:
        with tempfile.TemporaryDirectory() as tmp:
            ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
            try:
                cpu_comparison(args.cpu_runs, Path(tmp), args.in_flight, args.repeat)
            finally:
                ray.shutdown()
        return
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        base = asyncio.run(one_process(n, args.in_flight))
        print(f"  one async process (arun, no store), {args.in_flight} at once: {base:6.1f} s  {n / base:7.1f} runs/s")
        local, reasons = timed_batch(n, where, "local", executor="local", max_in_flight=args.in_flight)
        assert set(reasons) == {"done"}, Counter(reasons)
        print(f"  run_batch executor='local', {args.in_flight} at once:   {local:6.1f} s  {n / local:7.1f} runs/s")
        lease = 10.0
        free, total, reasons = crashed_rerun(n, where, args.in_flight, lease)
        assert set(reasons) == {"done"}, Counter(reasons)
        held = min(args.in_flight, n)
        rate = (n - held) / free if n > held else float("nan")
        print(f"  rerun after a driver crash, {held} runs leased {lease:.0f} s: {rate:7.1f} runs/s over the "
              f"{n - held} free runs vs {n / local:.1f} clean (ratio {n / local / rate:.2f}); "
              f"all done in {total:.1f} s")  # fmt: skip
        ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        try:
            cpu_comparison(args.cpu_runs, where, args.in_flight, args.repeat)
            cpus = int(ray.cluster_resources()["CPU"])
            for per_cpu in (4, 16):
                slots = cpus * per_cpu
                options = {"max_in_flight": slots}
                on_ray, reasons = timed_batch(n, where, f"ray{per_cpu}", **options)
                assert set(reasons) == {"done"}, Counter(reasons)
                overhead = on_ray * slots / n - alone
                print(f"  run_batch on Ray, {slots} runs at once:          {on_ray:6.1f} s  {n / on_ray:7.1f} runs/s"
                      f"  (overhead {overhead * 1000:.0f} ms per run)")  # fmt: skip
            ledger = where / "calls.log"
            kills = len(range(0, n, args.kill_every))
            make = functools.partial(make_agent, str(ledger), args.kill_every)
            start = time.perf_counter()
            results = run_batch(make, questions(n), store=where / "kills.db", progress=False, lease=2.0,
                                max_in_flight=cpus * 4)  # fmt: skip
            recovered = time.perf_counter() - start
            assert all(r.ok for r in results), Counter(r.reason for r in results)
            calls = Counter(ledger.read_text().splitlines())
            repeated = sum(c - 1 for c in calls.values())
            per_actor = math.ceil(cpus * 4 / max(cpus, 1))  # runs at once on one actor of the pool
            print(f"  recovery on Ray, a worker killed every {args.kill_every} runs ({kills} kills): "
                  f"{recovered:6.1f} s, {repeated} tool calls repeated of {sum(calls.values())} "
                  f"(at most {kills * per_actor}: one in flight per run of the killed actor)")  # fmt: skip
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
