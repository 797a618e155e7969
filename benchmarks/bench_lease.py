"""Lease takeover after a kill: how soon another process resumes a run whose owner died mid-call (SIGKILL).

The owner runs a stored run (SQLite, the default lease) whose second tool
call sleeps far longer than a lease; once that call has run for a lease and a
half, so the heartbeat has renewed the lease meanwhile, the owner is killed
with SIGKILL (no cleanup, no lease given up).  A second process tries to take
the run over every 20 ms from the kill on; the figure is the median time from
the kill to its claim, which must be within one lease (``DEFAULT_LEASE``).
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.targets import record
from fsm_agent import Agent, Message, ModelResponse, RunLeasedError, SqliteStore, ToolRegistry
from fsm_agent.persist.store import DEFAULT_LEASE
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

SAMPLES = 3
_spawn = multiprocessing.get_context("spawn")


class TickThenSleep:
    """A quick ``tick``, then a ``sleep`` far longer than a lease, then an answer; stateless, any process resumes it."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        given = sum(1 for m in messages if m.role == "assistant")
        if given < 2:
            return tool_turn(tool_call("tick" if given == 0 else "sleep", id=f"c{given}"))
        return reply("done")


def _agent(started: Path | None) -> Agent:
    tools = ToolRegistry()

    @tools.register
    def tick() -> str:
        """A quick call."""
        return "ticked"

    @tools.register
    def sleep() -> str:
        """Far longer than a lease in the owner; at once in the process that takes the run over."""
        if started is not None:
            started.write_text(repr(time.time()), encoding="utf-8")
            time.sleep(10 * DEFAULT_LEASE)
        return "slept"

    return Agent(TickThenSleep(), tools)


def _owner(db: str, started: str) -> None:
    _agent(Path(started)).run("go", store=SqliteStore(db), run_id="r")


def one_takeover(folder: Path) -> float:
    """Seconds from the owner's SIGKILL to another process's claim of its run."""
    db, started = str(folder / "runs.db"), folder / "started.txt"
    owner = _spawn.Process(target=_owner, args=(db, str(started)))
    owner.start()
    while not started.exists():
        time.sleep(0.01)
    time.sleep(1.5 * DEFAULT_LEASE)  # the heartbeat renewed the lease meanwhile: the run is still the owner's
    store = SqliteStore(db)
    try:
        _agent(None).resume(store.load("r"), store=store)
    except RunLeasedError:
        pass
    else:
        raise SystemExit("the run was free while its owner lived: the heartbeat did not keep the lease")
    owner.kill()
    killed = time.monotonic()
    owner.join()
    while True:
        try:
            result = _agent(None).resume(store.load("r"), store=store).finish()
            break
        except RunLeasedError:
            time.sleep(0.02)
    taken = time.monotonic() - killed
    store.close()
    if result.final != "done":
        raise SystemExit(f"the run taken over ended {result.reason}")
    return taken


def main() -> None:
    """Print the median takeover time and record it against one lease."""
    times = []
    for _ in range(SAMPLES):
        with tempfile.TemporaryDirectory() as folder:
            times.append(one_takeover(Path(folder)))
    median = statistics.median(times)
    print(
        f"lease takeover after SIGKILL mid-call (SQLite, lease {DEFAULT_LEASE:g} s, call running 1.5 leases): "
        f"median {median:.1f} s of {', '.join(f'{t:.1f}' for t in times)}"
    )
    record(f"lease takeover after a kill, seconds (lease {DEFAULT_LEASE:g} s)", median, DEFAULT_LEASE, " s")


if __name__ == "__main__":
    sys.exit(main())
