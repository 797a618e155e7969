"""One writer of run state: no module outside ``fsm_agent/core`` assigns to or mutates an attribute of a ``Run``.

The test reads the package's source with ``ast`` (the package itself never
reads its own).  A ``Run`` is found the ways the package names one: a
parameter annotated ``Run``, ``Run(...)`` itself, a handle's ``.position``,
a stepper's ``.run``, one of a run's records (``run.counts``), and any local
name bound to one of those.  A write is
an assignment (plain, augmented, annotated, or ``del``) to an attribute of a
run or to an item of one, a mutating method called on one of its attributes
(``run.steps.append(...)``), or ``setattr`` on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fsm_agent"
CORE = PACKAGE / "core"

MUTATORS = frozenset(
    {"add", "append", "appendleft", "clear", "discard", "extend", "insert", "pop", "popleft", "remove", "reverse"}
    | {"setdefault", "sort", "update", "__setitem__", "__delitem__"}
)
"""Methods that change the container they are called on (lists, deques, dicts, sets)."""

RECORDS = frozenset({"at", "counts", "talk", "calls", "faults"})
"""The attributes of a ``Run`` that hold its records (``run.counts.turns``): writing to one writes to the run."""


def _names_run(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation).strip("'\"")
    return text == "Run" or text.endswith(".Run")


def _is_run(node: ast.expr, bound: set[str]) -> bool:
    """Whether ``node`` is a ``Run`` or part of one: a bound name, ``Run(...)``, ``x.position``, ``<stepper>.run``.

    A record of a run (``run.counts``) is part of it.
    """
    if isinstance(node, ast.Name):
        return node.id in bound
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "Run"
    if isinstance(node, ast.Attribute):
        if node.attr == "position":
            return True
        if node.attr in RECORDS and _is_run(node.value, bound):
            return True
        if node.attr == "run":
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            return "stepper" in name
    return False


def _bound_runs(scope: ast.AST) -> set[str]:
    """The local names of ``scope`` that hold a run: annotated ``Run`` or assigned one."""
    bound: set[str] = set()
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        given = scope.args
        bound |= {a.arg for a in [*given.posonlyargs, *given.args, *given.kwonlyargs] if _names_run(a.annotation)}
    nodes = list(ast.walk(scope))
    for _ in range(2):  # a name bound from another bound name, in either order
        for node in nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        pairs = list(zip(target.elts, node.value.elts, strict=False))
                    else:
                        pairs = [(target, node.value)]
                    bound |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _is_run(v, bound)}
            elif (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and (_names_run(node.annotation) or (node.value is not None and _is_run(node.value, bound)))
            ):
                bound.add(node.target.id)
    return bound


def _writes_to_run(target: ast.expr, bound: set[str]) -> bool:
    if isinstance(target, ast.Tuple | ast.List):
        return any(_writes_to_run(item, bound) for item in target.elts)
    if isinstance(target, ast.Starred):
        return _writes_to_run(target.value, bound)
    if isinstance(target, ast.Attribute):
        return _is_run(target.value, bound)
    if isinstance(target, ast.Subscript):
        return isinstance(target.value, ast.Attribute) and _is_run(target.value.value, bound)
    return False


def _is_write(node: ast.AST, bound: set[str]) -> bool:
    if isinstance(node, ast.Assign | ast.Delete):
        return any(_writes_to_run(target, bound) for target in node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return _writes_to_run(node.target, bound)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS and isinstance(func.value, ast.Attribute):
            return _is_run(func.value.value, bound)
        if isinstance(func, ast.Name) and func.id in {"setattr", "delattr"} and node.args:
            return _is_run(node.args[0], bound)
    return False


def run_writes(source: str) -> list[str]:
    """Each statement of ``source`` that writes to a run, as ``line: code``."""
    tree = ast.parse(source)
    found = set()
    for scope in ast.walk(tree):
        if isinstance(scope, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef):
            bound = _bound_runs(scope)
            found |= {(node.lineno, ast.unparse(node)) for node in ast.walk(scope) if _is_write(node, bound)}
    return [f"{line}: {code}" for line, code in sorted(found)]


def test_no_module_outside_the_core_writes_to_a_run() -> None:
    """Drivers, stores, the viewer and the rest hand the stepper events; only fsm_agent/core changes a Run."""
    outside = [path for path in sorted(PACKAGE.rglob("*.py")) if CORE not in path.parents]
    assert len(outside) > 20  # the walk found the package
    writes = {
        str(path.relative_to(PACKAGE)): found
        for path in outside
        if (found := run_writes(path.read_text(encoding="utf-8")))
    }
    assert writes == {}


@pytest.mark.parametrize(
    "source",
    [
        "def f(run: Run) -> None:\n    run.counts.turns = 1",
        "def f(run: 'Run') -> None:\n    run.counts.turns += 1",
        "def f(run: Run) -> None:\n    run.limits = None",
        "def f(self) -> None:\n    run = self.position\n    run.counts.elapsed = 2.0",
        "def f(self) -> None:\n    counts = self.position.counts\n    counts.elapsed = 2.0",
        "def f(self) -> None:\n    self.position.counts.cancelled, self.position.counts.cancel_why = True, 'x'",
        "def f(self) -> None:\n    self.stepper.run.talk.steps.append(1)",
        "def f(self) -> None:\n    position = Run(limits, [])\n    position.calls.approvals['c1'] = True",
        "def f(self) -> None:\n    kept = other = self.position\n    del other.at.evidence['x']",
        "def f(self) -> None:\n    run, n = self.position, 1\n    setattr(run.at, 'reason', 'x')",
    ],
)
def test_the_check_sees_each_kind_of_write(source: str) -> None:
    """Every way of writing to a run the check names is found (so an empty finding means something)."""
    assert len(run_writes(source)) == 1


def test_the_check_lets_reads_and_other_objects_be() -> None:
    """Reading a run, and writing to objects that are not runs, is no finding."""
    source = (
        "def f(self, run: Run) -> None:\n"
        "    total = run.counts.turns + len(run.talk.steps)\n"
        "    self.state = run.at.state\n"
        "    self.steps.append(total)\n"
        "    self.counts.turns = total\n"
        "    self.stepper.tell_time(2.0)\n"
    )
    assert run_writes(source) == []
