"""One summary table for ``make bench``: each benchmark records its figures against their targets, then this prints.

A benchmark calls ``record`` for each figure that has a target; the
``make bench`` recipe empties the file first and runs ``python -m
benchmarks.targets`` last, which prints every figure beside its target and
exits 1 if any missed, so one command says what holds and what does not.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

RESULTS = Path(os.environ.get("FSM_AGENT_BENCH_RESULTS", ".bench_results.jsonl"))


def record(name: str, value: float, target: float, unit: str = "x", *, higher_is_better: bool = False) -> bool:
    """Append one figure and its target to the results file; return whether it meets the target."""
    ok = value >= target if higher_is_better else value <= target
    line = {"name": name, "value": value, "target": target, "unit": unit, "higher": higher_is_better, "ok": ok}
    with RESULTS.open("a", encoding="utf-8") as file:
        file.write(json.dumps(line) + "\n")
    return ok


def main() -> int:
    """Print the summary of every recorded figure; exit 1 if any missed its target or none were recorded."""
    if not RESULTS.exists():
        print("no benchmark recorded a figure")
        return 1
    rows = [json.loads(line) for line in RESULTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    width = max(len(row["name"]) for row in rows)
    print()
    print(f"{'target':<{width}} {'measured':>10} {'target':>10}  status")
    for row in rows:
        sign = ">=" if row["higher"] else "<="
        value, unit = row["value"], row["unit"]
        print(
            f"{row['name']:<{width}} {value:>9.2f}{unit} {sign}{row['target']:>7.2f}{unit}  "
            f"{'within' if row['ok'] else 'MISSED'}"
        )
    missed = [row["name"] for row in rows if not row["ok"]]
    print(
        f"{len(rows) - len(missed)} of {len(rows)} within their targets"
        + (f"; missed: {len(missed)}" if missed else "")
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
