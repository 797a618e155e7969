"""Import time: ``python -c "import fsm_agent"`` against a bare ``python -c pass``, each timed from start to exit.

Most programs that import the package never open a store; a command-line
tool or a worker that imports it pays the import at every start.  The two
commands run in alternation (one of each per pair, so a load that comes and
goes hits both alike), and the figure is the ratio of their medians.  Both
read compiled bytecode, as an installed package does (pip compiles at
install): the runs get a bytecode cache of their own (``PYTHONPYCACHEPREFIX``),
filled by a first run of each, so an editable checkout whose ``__pycache__``
is stale, or ``PYTHONDONTWRITEBYTECODE``, does not time the compiler.
A third command, ``import attrs`` (a dependency the package cannot start
without), runs in the same rotation and is printed only: it says how much
of the ratio is the dependency's and how much the package's own.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.targets import record

PAIRS = 41
TARGET = 4.0
BARE = "pass"
IMPORT = "import fsm_agent"
DEPENDENCY = "import attrs"


def _once(code: str, env: dict[str, str]) -> float:
    """Seconds from starting ``python -c code`` to its exit."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - start


def paired_runs(pairs: int = PAIRS) -> tuple[list[float], list[float], list[float]]:
    """Seconds of ``pairs`` bare starts, imports and ``import attrs``, run in rotation over a warmed bytecode cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        _once(IMPORT, env)  # fills the cache (the standard library's modules too)
        _once(BARE, env)
        bare, imported, dependency = [], [], []
        for _ in range(pairs):
            bare.append(_once(BARE, env))
            imported.append(_once(IMPORT, env))
            dependency.append(_once(DEPENDENCY, env))
    return bare, imported, dependency


def main() -> int:
    """Print both medians and their ratio; exit 1 if the ratio misses its target."""
    bare, imported, dependency = paired_runs()
    bare_ms, import_ms = statistics.median(bare) * 1000, statistics.median(imported) * 1000
    attrs_ms = statistics.median(dependency) * 1000
    ratio = import_ms / bare_ms
    print(
        f"python -c pass: {bare_ms:.1f} ms; python -c 'import fsm_agent': {import_ms:.1f} ms "
        f"(medians of {PAIRS} paired runs): {ratio:.2f}x (target <= {TARGET}x)"
    )
    print(
        f"of which attrs alone (python -c 'import attrs': {attrs_ms:.1f} ms, {attrs_ms / bare_ms:.2f}x): "
        f"{attrs_ms - bare_ms:.1f} ms; the package's own modules and the standard library's they load: "
        f"{import_ms - attrs_ms:.1f} ms ({import_ms / attrs_ms:.2f}x an interpreter that imported attrs)"
    )
    ok = record("import fsm_agent / bare interpreter start", ratio, TARGET)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
