"""The transition table: the one declaration of how a run moves, read by engine, validator, diagrams and tests.

Rows are ``(source, trigger, dest, guard, reason)``.  For one state and
trigger, rows are tried in order and the first whose guard holds is taken, so
row order is guard priority; the last row of each is the unguarded fallback.
A reason marks an edge into ``Failed`` and only such edges.  ``build_table``
lays the flow of a turn out once and fills each checkpoint with the stops of
the catalogue that are checked there, in catalogue order, then adds a
``finalize`` edge wherever a finalizable stop is checked and the ``resume``
edges.  A table is validated when it is built, naming the states at fault.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import attrs

from fsm_agent.definition.derived import (
    compacts_history,
    output_invalid,
    resumes_before_answer,
    resumes_before_model,
    resumes_before_tool,
    resumes_finalize,
    resumes_output_retry,
    retries_model_call,
)
from fsm_agent.definition.guards import (
    EVERY_EDGE,
    Declared,
    Guard,
    Lookahead,
    has_no_tool_calls,
    has_pending_calls,
    output_rejected,
)
from fsm_agent.definition.run import Meter, Reader, Run, has_path
from fsm_agent.definition.states import STATES, State
from fsm_agent.definition.stops import (
    CATALOGUE,
    CONDITION_ERROR,
    UNGUARDED,
    At,
    Stop,
    StopCondition,
)
from fsm_agent.definition.table_checks import table_problems
from fsm_agent.definition.triggers import (
    CHECK,
    DISPATCH,
    EXPIRED,
    FINALIZE,
    INTERRUPTED,
    MODEL_FAILED,
    REPLIED,
    RESUME,
    START,
    TOOL_DONE,
)
from fsm_agent.errors import DefinitionError
from fsm_agent.records import Transition

CHECKPOINTS: dict[At, tuple[State, str]] = {
    At.START: (State.AwaitModel, START),
    At.MODEL_FAILED: (State.AwaitModel, MODEL_FAILED),
    At.MODEL_INTERRUPTED: (State.AwaitModel, INTERRUPTED),
    At.MODEL_EXPIRED: (State.AwaitModel, EXPIRED),
    At.CHECK_INTERRUPTED: (State.Dispatch, INTERRUPTED),
    At.CHECK_EXPIRED: (State.Dispatch, EXPIRED),
    At.AFTER_MODEL: (State.AwaitModel, REPLIED),
    At.CHECK_REPLY: (State.CheckTruncation, CHECK),
    At.ANSWER: (State.Dispatch, DISPATCH),
    At.BEFORE_TOOL: (State.Dispatch, DISPATCH),
    At.TOOL_INTERRUPTED: (State.ExecuteTool, INTERRUPTED),
    At.TOOL_EXPIRED: (State.ExecuteTool, EXPIRED),
    At.AFTER_TOOL: (State.ExecuteTool, TOOL_DONE),
    At.BEFORE_MODEL: (State.ExecuteTool, TOOL_DONE),
}
"""Where each checkpoint sits: the state a run is leaving and the trigger that is moving it."""


@attrs.frozen
class Row:
    """One edge: from ``source`` on ``trigger`` to ``dest`` when ``guard`` holds (always, if None)."""

    source: State
    trigger: str
    dest: State
    guard: Guard | None = None
    reason: str | None = None
    keeps_finalize: bool = False
    """A ``resume`` row that makes a cut ``finalize`` call again: the run keeps the stop the call answers for."""
    asks_again: bool = False
    """A row into ``AwaitModel`` that sends a typed answer back: its errors are the model's next message."""
    entry: Transition = attrs.field(init=False, eq=False, repr=False)
    """The trace entry of taking this row: immutable and the same every time, so built once."""
    test: Guard | None = attrs.field(init=False, eq=False, repr=False)  # what first_row calls: see Declared.test

    def __attrs_post_init__(self) -> None:
        entry = Transition(str(self.source), self.trigger, str(self.dest), self.guard_name, self.reason)
        object.__setattr__(self, "entry", entry)
        object.__setattr__(self, "test", self.guard.test if isinstance(self.guard, Declared) else self.guard)

    @property
    def guard_name(self) -> str | None:
        """The guard's function name, which is the edge's label."""
        return None if self.guard is None else self.guard.__name__

    def __str__(self) -> str:
        label = f"[{self.reason or self.guard_name}]" if (self.reason or self.guard) else ""
        return f"{self.source}->{self.dest}{label}"


def first_row(run: Run, trigger: str) -> Row | None:
    """The row ``trigger`` takes from the run's state: the first whose guard holds.  The one row walker.

    Firing a trigger and looking ahead (finalize, batch planning) both call
    this, so what the machine would do and what it does cannot differ.
    """
    for row in run.rows.get((run.at.state, trigger), ()):
        if row.test is None or row.test(run):
            return row
    return None


def _tuple(items: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(items)


@attrs.frozen(cache_hash=True)  # hashed once: the walker of a table is found by its value (core.walker)
class Table:
    """An ordered, validated set of rows, the stop reasons they may carry and the stops behind them."""

    rows: tuple[Row, ...] = attrs.field(converter=_tuple)
    reasons: tuple[str, ...] = attrs.field(converter=_tuple)
    initial: State = State.AwaitModel
    terminal: frozenset[State] = frozenset({State.Done, State.Failed})
    stops: tuple[Stop, ...] = attrs.field(default=(), converter=_tuple)

    def __attrs_post_init__(self) -> None:
        problems = table_problems(self.rows, self.reasons, self.initial, self.terminal)
        problems += [
            f"stop {stop.reason}: its counter's used must name an attribute of Run, got {stop.counter.used!r}"
            for stop in self.stops
            if stop.counter is not None and not has_path(stop.counter.used)
        ]
        if problems:
            msg = "invalid transition table:\n  " + "\n  ".join(problems)
            raise DefinitionError(msg)

    @property
    def states(self) -> tuple[State, ...]:
        """Every state of the machine, in declaration order."""
        return STATES

    def rows_from(self, state: State, trigger: str | None = None) -> tuple[Row, ...]:
        """The rows leaving ``state`` (on ``trigger``, if given), in priority order."""
        return tuple(r for r in self.rows if r.source is state and (trigger is None or r.trigger == trigger))

    @functools.cached_property
    def index(self) -> dict[tuple[State, str], tuple[Row, ...]]:
        """Rows by ``(source, trigger)`` in priority order: what the row walker walks."""
        out: dict[tuple[State, str], tuple[Row, ...]] = {}
        for row in self.rows:
            out[row.source, row.trigger] = (*out.get((row.source, row.trigger), ()), row)
        return out

    @functools.cached_property
    def stop_for(self) -> Mapping[str, Stop]:
        """The stop behind each reason."""
        return {stop.reason: stop for stop in self.stops}

    @functools.cached_property
    def meters(self) -> tuple[Meter, ...]:
        """The counters of the stops, as ``Step.counters`` lists them."""
        return tuple(stop.counter for stop in self.stops if stop.counter is not None)

    @functools.cached_property
    def readers(self) -> tuple[Reader, ...]:
        """Each meter's name, its count's reader (of its dotted path, built once per table) and its limit."""
        return tuple((meter.name, attrgetter(meter.used), meter.limit) for meter in self.meters)

    def reads(self, row: Row) -> tuple[str, ...]:
        """The meters and run facts ``row``'s guard reads, as declared: none for an unguarded or opaque row."""
        return row.guard.reads if isinstance(row.guard, Declared) else ()

    def bounds(self, row: Row) -> str | None:
        """The ``Limits`` field that bounds ``row``'s guard (``max_steps`` for ``steps_exhausted``), if any."""
        return row.guard.bound if isinstance(row.guard, Declared) else None

    def opaque(self, row: Row) -> bool:
        """Whether ``row``'s guard declares nothing (a user's ``StopCondition`` or a plain function): only called."""
        return row.guard is not None and not isinstance(row.guard, Declared)

    def increments(self, meter: str) -> tuple[Row, ...]:
        """The rows taken after an outcome that moves the meter ``meter`` (all, for the clock; see ``Lookahead``)."""
        moved_on = next((m.moved_on for m in self.meters if m.name == meter), None)
        if moved_on is None:
            msg = f"no meter {meter!r}; the table's meters are {', '.join(m.name for m in self.meters)}"
            raise KeyError(msg)
        moved = [(str(r.source), r.guard.trigger if isinstance(r.guard, Lookahead) else r.trigger) for r in self.rows]
        return tuple(r for r, at in zip(self.rows, moved, strict=True) if moved_on == EVERY_EDGE or at in moved_on)

    def with_rows(self, extra: Iterable[Row], reasons: Iterable[str]) -> Table:
        """A new table with ``extra`` rows placed just before the fallback of their state and trigger."""
        rows = list(self.rows)
        for row in extra:
            group = [i for i, r in enumerate(rows) if r.source is row.source and r.trigger == row.trigger]
            if not group:
                msg = f"{row}: state {row.source} has no trigger {row.trigger!r} to attach to"
                raise DefinitionError(msg)
            rows.insert(group[-1], row)
        return Table(rows, (*self.reasons, *reasons), self.initial, self.terminal, self.stops)

    def with_stops(self, extra: Sequence[StopCondition]) -> Table:
        """This table's stops plus ``extra`` (users' stops), laid out again."""
        return build_table((*self.stops, *extra)) if extra else self


# --- the edges derived from the catalogue -------------------------------------------------------------------


@functools.cache
def finalize_on(reason: str, trigger: str) -> Guard:
    """The guard of a ``finalize`` edge: the stop ``reason`` would fire now and its policy says finalize.

    It looks ahead with the row walker at the row ``trigger`` would take, so
    the finalize edge fires exactly when that stop is the highest-priority
    row that holds, and only once per run.
    """

    def guard(run: Run) -> bool:
        if run.at.finalizing is not None or run.policies.get(reason) != "finalize":
            return False
        row = first_row(run, trigger)
        return row is not None and row.reason == reason

    guard.__name__ = guard.__qualname__ = f"finalize_on_{reason}"
    return Lookahead(guard, ("finalizing", "policies"), trigger)


def build_table(stops: Sequence[Stop]) -> Table:
    """Lay out the flow of a turn and put each stop at its checkpoints, in catalogue order (user stops last)."""
    S = State
    caught: set[tuple[State, str]] = set()  # where a stop_condition_error row is placed already

    def slot(at: At) -> list[Row]:
        state, trigger = CHECKPOINTS[at]
        rows: list[Row] = []
        for stop in stops:
            user = isinstance(stop, StopCondition) and at in stop.at
            if user and (state, trigger) not in caught:
                # A user's check that raises is recorded and the walk is tried again: this row then fires.
                caught.add((state, trigger))
                rows.append(Row(state, trigger, S.Failed, CONDITION_ERROR.guard, CONDITION_ERROR.reason))
            if at in stop.at:
                unguarded = at in UNGUARDED and not stop.keeps_guard
                rows.append(Row(state, trigger, S.Failed, None if unguarded else stop.guard, stop.reason))
        return rows

    flow = [
        *slot(At.START),
        Row(S.AwaitModel, MODEL_FAILED, S.AwaitModel, compacts_history),
        *slot(At.MODEL_FAILED),
        *slot(At.MODEL_INTERRUPTED),
        *slot(At.MODEL_EXPIRED),
        *slot(At.AFTER_MODEL),
        Row(S.AwaitModel, REPLIED, S.CheckTruncation),
        *slot(At.CHECK_REPLY),
        Row(S.CheckTruncation, CHECK, S.Dispatch),
        *slot(At.CHECK_INTERRUPTED),
        *slot(At.CHECK_EXPIRED),
        Row(S.Dispatch, DISPATCH, S.AwaitModel, output_invalid, asks_again=True),
        *slot(At.ANSWER),
        Row(S.Dispatch, DISPATCH, S.Done, has_no_tool_calls),
        *slot(At.BEFORE_TOOL),
        Row(S.Dispatch, DISPATCH, S.ExecuteTool),
        *slot(At.TOOL_INTERRUPTED),
        *slot(At.TOOL_EXPIRED),
        *slot(At.AFTER_TOOL),
        Row(S.ExecuteTool, TOOL_DONE, S.Dispatch, has_pending_calls),
        *slot(At.BEFORE_MODEL),
        Row(S.ExecuteTool, TOOL_DONE, S.AwaitModel),
    ]
    finalizable = {stop.reason for stop in stops if stop.finalize}
    finalize = [
        Row(row.source, FINALIZE, S.AwaitModel, finalize_on(row.reason, row.trigger))
        for row in flow
        if row.reason in finalizable and row.guard is not None and row.trigger != START
    ]
    resume = [
        Row(S.Failed, RESUME, S.Dispatch, resumes_before_tool),
        Row(S.Failed, RESUME, S.Dispatch, resumes_before_answer),
        Row(S.Failed, RESUME, S.AwaitModel, resumes_output_retry, asks_again=True),
        Row(S.Failed, RESUME, S.AwaitModel, resumes_before_model),
        Row(S.Failed, RESUME, S.AwaitModel, retries_model_call),
        Row(S.Failed, RESUME, S.AwaitModel, resumes_finalize, keeps_finalize=True),
    ]
    used = [stop for stop in (*stops, CONDITION_ERROR) if any(row.reason == stop.reason for row in flow)]
    return Table(flow + finalize + resume, [stop.reason for stop in used], stops=used)


TYPED_GUARDS = (output_invalid, output_rejected, resumes_output_retry)
"""The guards of the output check: they can hold only for an agent with an ``output_type``."""
COMPACTING_GUARDS = (compacts_history,)
"""The guard of the compaction edge: it can hold only for an agent whose ``context_overflow`` policy is compact."""

TABLE = build_table(CATALOGUE)
"""The default machine: every built-in stop in priority order per state, then the finalize and resume edges."""
SENDS_BACK = frozenset(row.guard_name for row in TABLE.rows if row.asks_again)
"""The guards of the edges that send a typed answer back: each such edge in a trace is one retry taken."""
BUILTIN_REASONS = frozenset(stop.reason for stop in (*CATALOGUE, CONDITION_ERROR))
"""The reasons of the built-in stops, which no user's stop condition may take (the table with user stops has all)."""
