"""Every built-in guard declares what it reads: ``TABLE.reads(row)`` names everything of the run its guard looks at.

docs/concepts/architecture.md ("The guards") and docs/concepts/machine.md ("What each guard reads"): a limit's
guard is a meter against a ``Limits`` field, and every other built-in guard is a named fact "declared with the
attributes it reads"; the table answers from those declarations.  The fallbacks and the row order are held by
``tests/definition/test_table.py``, the absence of opaque built-in guards by
``tests/definition/test_declared_guards.py``; this test holds the declarations themselves to the predicates.

Each ``Fact`` of the built-in table is read with ``ast`` (the test reads the package's source, the package never
does): every ``run.<record>.<field>`` and every configuration of the run it looks at (``run.policies``,
``run.output_retry_limit``; ``run.limits`` only through its declared bound), followed into the module-level
helpers of ``fsm_agent.definition`` it calls with the run, into the declared guards it calls (their own
declarations) and, where it calls a catalogue stop's guard (``blocking_stop``, ``_lifted``), into what those
guards declare.  A finalize edge's guard (``Lookahead``) is left out: it is declared as taking the row its
trigger takes, whose guards are checked here one by one.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fsm_agent.definition.guards import METERS, AtLimit, Declared, Fact, Lookahead
from fsm_agent.definition.run import RECORDS
from fsm_agent.definition.stops import CATALOGUE
from fsm_agent.definition.table import TABLE

TABLE_PARTS = frozenset({"table_stops", "rows", "meters", "readers"})
"""What the run holds of its table (the stops by reason, the rows): structure, not a fact of the run."""


def _meter_names() -> dict[str, str]:
    """Each meter's dotted path on the run (``counts.turns``) -> the name a declaration uses for it (``steps``)."""
    names = {meter.used: meter.name for meter in METERS}
    for stop in CATALOGUE:
        guard = stop.guard
        if isinstance(guard, AtLimit):  # a limit's guard may read its meter unrounded (counts.elapsed)
            used = re.search(r"'([\w.]+)'", repr(guard.used))
            assert used is not None
            names[used.group(1)] = guard.meter.name
    return names


METER_NAMES = _meter_names()
LIFTED_READS = frozenset(
    name
    for stop in CATALOGUE
    if stop.resume == "lift" and isinstance(stop.guard, Declared)
    for name in stop.guard.reads
)
"""What a catalogue stop's guard called by its stop (``stop.guard(run)``: ``blocking_stop``, ``_lifted``) reads."""


def _reads(function: Callable[..., Any], seen: set[Callable[..., Any]]) -> Iterator[str]:
    """What ``function`` reads of the run it is given first, in a declaration's words (and ``limits``)."""
    if function in seen:
        return
    seen.add(function)
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    defined = tree.body[0]
    assert isinstance(defined, ast.FunctionDef)
    run = defined.args.args[0].arg
    for node in ast.walk(defined):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == run:
            if node.attr not in RECORDS and node.attr not in TABLE_PARTS:
                yield node.attr  # the run's own configuration: limits, policies, output_retry_limit
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == run
            and node.value.attr in RECORDS
        ):
            path = f"{node.value.attr}.{node.attr}"
            yield METER_NAMES.get(path, node.attr)
        elif isinstance(node, ast.Call) and any(isinstance(a, ast.Name) and a.id == run for a in node.args):
            callee = node.func
            if isinstance(callee, ast.Attribute) and callee.attr == "guard":
                yield from LIFTED_READS  # a catalogue stop's guard, called by its stop
                continue
            name = (
                callee.id if isinstance(callee, ast.Name) else callee.attr if isinstance(callee, ast.Attribute) else ""
            )
            found = function.__globals__.get(name)
            if found is None and isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Name):
                found = getattr(function.__globals__.get(callee.value.id), name, None)
            if isinstance(found, Declared):
                yield from found.reads
            elif inspect.isfunction(found) and found.__module__.startswith("fsm_agent.definition"):
                yield from _reads(found, seen)


FACTS = sorted(
    {row.guard for row in TABLE.rows if isinstance(row.guard, Fact) and not isinstance(row.guard, Lookahead)},
    key=lambda guard: guard.__name__,
)


def _cases() -> Iterator[Any]:
    for guard in FACTS:
        yield pytest.param(guard, id=guard.__name__)


def test_the_table_has_the_facts_this_test_reads() -> None:
    """The walk found the built-in facts, the derived ones among them (so an empty finding means something)."""
    names = {guard.__name__ for guard in FACTS}
    assert len(names) >= 15
    derived = {"compacts_history", "output_invalid", "resumes_before_tool", "resumes_before_model"}
    derived |= {"retries_model_call", "resumes_before_answer", "resumes_finalize"}
    assert derived <= names


@pytest.mark.parametrize("guard", list(_cases()))
def test_a_built_in_fact_reads_only_what_it_declares(guard: Fact) -> None:
    """Every record field, meter and configuration of the run the predicate reads is in its ``reads``.

    ``limits`` may be read only by a guard bounded by a ``Limits`` field (``bound``).
    """
    read = set(_reads(guard.test, set()))
    allowed = set(guard.reads) | ({"limits"} if guard.bound is not None else set())
    assert sorted(read - allowed) == []
