"""Instructions per run under callgrind: the engine and a fresh agent per run against the plain loop, load-free.

``bench_engine`` times the same workload on the wall clock, which is the
figure the bounds are set on; on a shared 2-core machine its medians move
by about 15% from one session to the next.  The instructions a run executes
do not move with the load (``PYTHONHASHSEED=0``, so dicts and sets are
laid out alike every time), so this is the figure to compare two trees by,
or two sessions.  Each side runs N times after three warm-up runs of every
side; a run of the same program that makes no run at all is subtracted,
which leaves the instructions of N runs.  Needs valgrind; without it, it
says so and measures nothing.  Printed only: the targets are the wall
clock's (``bench_engine``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import fsm_agent
from benchmarks.bench_engine import Script, plain_run
from fsm_agent import Agent
from fsm_agent.testing import demo_registry

MODES = ("plain", "engine", "fresh")
_REFS = re.compile(r"refs:\s+([\d,]+)")


def runs(mode: str, k: int, n: int) -> None:
    """Make ``n`` runs of ``mode`` at K tool turns, after three warm-up runs of each side: the program measured."""
    registry, script, turns = demo_registry(), Script(k), k + 1
    reused = Agent(script, registry, max_steps=turns)
    sides = {
        "plain": lambda: plain_run(script, registry, "go", turns, 3),
        "engine": lambda: reused.run("go"),
        "fresh": lambda: fsm_agent.run(script, registry, "go", max_steps=turns),
    }
    for side in [*MODES] * 3 + [mode] * n:
        script.i = 0
        sides[side]()


def instructions(mode: str, k: int, n: int) -> int:
    """The instructions of the whole program ``runs(mode, k, n)``, counted by callgrind."""
    command = [sys.executable, "-m", "benchmarks.bench_instructions", mode, str(k), str(n)]
    env = os.environ | {"PYTHONHASHSEED": "0"}
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    found = _REFS.search(done.stderr)
    if found is None:
        msg = f"callgrind printed no instruction count:\n{done.stderr[-2000:]}"
        raise RuntimeError(msg)
    return int(found.group(1).replace(",", ""))


def main() -> int:
    """Print instructions per run at K = 1, 8 and 64 tool turns and each side's ratio to the plain loop."""
    if shutil.which("valgrind") is None:
        print("instructions per run: not measured, valgrind is not installed (apt install valgrind)")
        return 0
    print("instructions per run (callgrind, PYTHONHASHSEED=0); ratio = side / plain loop")
    print(f"{'K':>5} {'plain':>12} {'engine':>12} {'ratio':>6} {'fresh':>12} {'ratio':>6}")
    for k in (1, 8, 64):
        n = 400 // (k + 1) + 20
        warm_up_only = instructions("plain", k, 0)  # the same program for every side: no measured run
        per_run = {mode: (instructions(mode, k, n) - warm_up_only) // n for mode in MODES}
        plain, engine, fresh = (per_run[mode] for mode in MODES)
        print(f"{k:>5} {plain:>12,} {engine:>12,} {engine / plain:>6.2f} {fresh:>12,} {fresh / plain:>6.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4:
        runs(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
