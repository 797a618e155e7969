"""Firing a trigger: the row walk and the move along the row taken, compiled once per set of rows.

For each ``(state, trigger)`` of a run's rows, ``fires_for`` generates one
function: a straight line of ``if guard(run)`` in the rows' order (what
``first_row`` walks), a built-in guard of one expression written in as that
expression (``core.inlining``), each followed by the move along its row.  A
plain row (no stop reason, no typed-answer or compaction work) is moved along
inline: the state, the trace and, into ``AwaitModel`` or a terminal state,
the frozen flag and the run's conclusion.  Every other row goes through
``take``, the general move, which is also what a walk that found no row ends in.

Why generated: every transition of every run goes through here.  A loop
over the rows reads each row's guard twice, a call per guard costs more than
most guards, and a general move tests for every kind of row; together they
were the largest part of a step (``make bench``).  The generated code names
only its own variables and ``guards``; the rows,
guards and entries are in its namespace.  ``tests/test_compiled_fires.py``
holds each fire to ``first_row`` over the same rows and each inlined
expression to its guard, and the whole-run tests hold runs to their traces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fsm_agent.core import ledger
from fsm_agent.core.inlining import inline_expression
from fsm_agent.core.result import conclude
from fsm_agent.definition import guards
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import TERMINAL, AwaitModel, State
from fsm_agent.definition.stops import ConditionError
from fsm_agent.definition.table import FINALIZE, Row, compacts_history, output_invalid
from fsm_agent.records import Message, Step, Transition

if TYPE_CHECKING:
    from fsm_agent.core.stepper import Stepper

FINALIZE_INSTRUCTION = (
    "The run has to stop now ({reason}). Do not call any tool. "
    "Give your best final answer from what you already have, and say what is missing."
)

Fire = Callable[["Stepper", Run], Transition]
Rows = Mapping[tuple[State, str], Sequence[Row]]

_compiled: dict[int, tuple[Rows, dict[tuple[State, str], Fire]]] = {}


def fires_for(rows: Rows) -> dict[tuple[State, str], Fire]:
    """The compiled fire of each ``(state, trigger)`` of ``rows``, kept by the identity of ``rows``.

    A run's rows are one of a few mappings built once each (a table's index,
    or the walker's pruned copies of it), so this is compiled once per
    mapping; every entry holds its mapping, so its id is not reused meanwhile.
    """
    found = _compiled.get(id(rows))
    if found is not None and found[0] is rows:
        return found[1]
    fires = {key: _compile(group, key[1]) for key, group in rows.items()}
    if len(_compiled) >= 256:
        _compiled.clear()
    _compiled[id(rows)] = (rows, fires)
    return fires


def take(stepper: Stepper, row: Row | None, trigger: str) -> Transition:
    """Move the run along ``row`` (found by the walk), or the finalize edge its stop's policy asks for."""
    run = stepper.run
    if row is None:
        # Unreachable for a validated table (every trigger ends in a fallback) except for guard-only
        # triggers, which are only fired after checking one of their rows applies.
        msg = f"no row fired for trigger {trigger!r} in state {run.state}"
        raise AssertionError(msg)
    reason = row.reason
    if (
        reason is not None
        and run.finalizing is None
        and run.state in stepper.finalize_from
        and run.policies.get(reason) == "finalize"
    ):
        finalize = _finalize(stepper, reason)
        if finalize is not None:
            run.frozen = False  # the finalize edge leads back to AwaitModel, where a planned batch ends
            return finalize
    entry = row.entry
    dest = run.state = row.dest
    run.trace.append(entry)
    if dest in TERMINAL:
        run.frozen = False
        conclude(run)
    elif dest is AwaitModel:
        run.frozen = False
        if row.guard is output_invalid:
            _ask_again(stepper)
        elif row.guard is compacts_history:
            run.compacting = True
            if run.context_head is None:
                run.context_head, run.context_start = [], 0
    return entry


def _ask_again(stepper: Stepper) -> None:
    """Send a typed agent's answer back: record the failed check as a step, and tell the model the errors."""
    run, output = stepper.run, stepper.output
    assert run.output_problem is not None  # the output_invalid guard held
    assert output is not None
    errors = run.output_problem[0]
    run.output_retries += 1
    run.steps.append(Step(run.turns - 1, "output_invalid", "; ".join(errors), run.counters()))
    run.messages.append(Message("user", output.retry_text(errors)))
    run.output_checked, run.output_problem, run.output = False, None, None


def _finalize(stepper: Stepper, reason: str) -> Transition | None:
    """Answer the stop ``reason`` with one last model call without tools, if a finalize row allows it."""
    run = stepper.run
    evidence = stepper.evidence(reason)
    entry = stepper.walker.try_fire(run, FINALIZE)
    if entry is not None:
        run.finalizing, run.finalize_evidence = reason, evidence
        ledger.answer_unexecuted(run, f"the run stopped ({reason}) before this call")
        run.messages.append(Message("user", FINALIZE_INSTRUCTION.format(reason=reason)))
    return entry


def _caught(fire: Fire, stepper: Stepper, run: Run, exc: ConditionError, again: bool) -> Transition:
    """A user's check raised: record it and walk once more, where the ``stop_condition_error`` row now holds."""
    if not again:
        raise exc
    run.condition_error, run.condition_name = exc.error, exc.name
    return fire(stepper, run, False)  # type: ignore[call-arg]  # the generated fire takes ``again``


def _compile(rows: Sequence[Row], trigger: str) -> Fire:
    namespace: dict[str, Any] = {
        "ConditionError": ConditionError,
        "guards": guards,
        "caught": _caught,
        "conclude": conclude,
        "take": take,
        "trigger": trigger,
    }
    lines = ["def fire(stepper, run, again=True):"]
    for i, row in enumerate(rows):
        namespace[f"row{i}"], namespace[f"dest{i}"], namespace[f"entry{i}"] = row, row.dest, row.entry
        indent = "    "
        inline = inline_expression(row.guard) if row.guard is not None else None
        if inline is not None:
            lines.append(f"    if {inline}:")  # a built-in guard, which cannot raise ConditionError
            indent = "        "
        elif row.guard is not None:
            # Only the guard is inside the try: a user's check raising is caught there and nowhere else.
            namespace[f"guard{i}"] = row.guard
            lines += [
                "    try:",
                f"        held = guard{i}(run)",
                "    except ConditionError as exc:",
                "        return caught(fire, stepper, run, exc, again)",
                "    if held:",
            ]
            indent = "        "
        lines += [indent + line for line in _move(row, i)]
        if row.guard is None:
            break  # the fallback: no row after it can be taken
    else:
        lines.append("    return take(stepper, None, trigger)")
    exec("\n".join(lines), namespace)
    fire: Fire = namespace["fire"]
    return fire


def _move(row: Row, i: int) -> list[str]:
    """The lines that move a run along row ``i``: inline for a plain row, else the general ``take``."""
    if row.reason is not None or row.guard is output_invalid or row.guard is compacts_history:
        return [f"return take(stepper, row{i}, trigger)"]
    lines = [f"run.state = dest{i}", f"run.trace.append(entry{i})"]
    if row.dest in TERMINAL:
        lines += ["run.frozen = False", "conclude(run)"]
    elif row.dest is AwaitModel:
        lines.append("run.frozen = False")
    return [*lines, f"return entry{i}"]
