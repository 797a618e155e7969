"""The transition table: the one declaration of how a run moves, read by engine, validator, diagrams and tests.

Rows are ``(source, trigger, dest, guard, reason)``.  For one state and
trigger, rows are tried in order and the first whose guard holds is taken, so
row order is guard priority; the last row of each is the unguarded fallback.
A reason marks an edge into ``Failed`` and only such edges.  The table is
validated when it is built, so a mistake in it fails at import, naming the
states at fault.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable

import attrs

from fsm_agent.errors import DefinitionError
from fsm_agent.guards import (
    FINALIZABLE,
    Guard,
    asks_tools_while_finalizing,
    budget_spent,
    deadline_passed,
    failures_exhausted,
    finalize_on,
    has_no_tool_calls,
    has_pending_calls,
    hook_raised,
    is_cancelled,
    is_cycling,
    is_refusal,
    is_truncated,
    repeats_last_call,
    resumes_before_model,
    resumes_before_tool,
    retries_model_call,
    steps_exhausted,
    tool_calls_exhausted,
)
from fsm_agent.states import STATES, State

REPLIED = "replied"
MODEL_FAILED = "model_failed"
CHECK = "check"
DISPATCH = "dispatch"
TOOL_DONE = "tool_done"
FINALIZE = "finalize"
INTERRUPTED = "interrupted"
RESUME = "resume"
TRIGGERS: dict[str, str] = {
    MODEL_FAILED: "the model call raised, or its reply was unusable",
    INTERRUPTED: "the task driving the run was cancelled while a call was in flight",
    REPLIED: "the model replied",
    CHECK: "the reply is checked before any tool call is looked at",
    DISPATCH: "the next tool call of the turn is about to run, or the turn has none",
    TOOL_DONE: "a tool call finished",
    FINALIZE: "a stop whose policy is finalize: one last model call, without tools",
    RESUME: "agent.resume() continues a stopped run whose stop the new limits lift",
}
"""What fires each trigger, for the documentation the table renders."""
GUARDED_ONLY = frozenset({FINALIZE, RESUME})
"""Triggers the driver fires only after checking one of their rows applies, so they need no fallback."""

LEAVE: dict[State, str] = {
    State.AwaitModel: REPLIED,
    State.CheckTruncation: CHECK,
    State.Dispatch: DISPATCH,
    State.ExecuteTool: TOOL_DONE,
}
"""The trigger that moves a run out of each non-terminal state in the normal course (user stops attach here)."""


@attrs.frozen
class Row:
    """One edge: from ``source`` on ``trigger`` to ``dest`` when ``guard`` holds (always, if None)."""

    source: State
    trigger: str
    dest: State
    guard: Guard | None = None
    reason: str | None = None

    @property
    def guard_name(self) -> str | None:
        """The guard's function name, which is the edge's label."""
        return None if self.guard is None else self.guard.__name__

    def __str__(self) -> str:
        label = f"[{self.reason or self.guard_name}]" if (self.reason or self.guard) else ""
        return f"{self.source}->{self.dest}{label}"


def _problems(rows: tuple[Row, ...], reasons: tuple[str, ...], initial: State, terminal: frozenset[State]) -> list[str]:
    problems: list[str] = []
    states = set(STATES)
    for row in rows:
        if row.source not in states or row.dest not in states:
            problems.append(f"{row}: unknown state (states are {', '.join(STATES)})")
        if row.guard is not None and row.guard.__name__ == "<lambda>":
            problems.append(f"{row}: guards must be named functions (their names label the edges), not lambdas")
        if row.source in terminal and row.trigger != RESUME:
            problems.append(f"{row}: terminal state {row.source} must have no outgoing edge but {RESUME!r}")
        if (row.reason is not None) != (row.dest is State.Failed):
            problems.append(f"{row}: a reason belongs on an edge if and only if it goes to Failed")
        if row.reason is not None and row.reason not in reasons:
            problems.append(f"{row}: reason {row.reason!r} is not declared")
    by_trigger: dict[tuple[State, str], list[Row]] = {}
    for row in rows:
        by_trigger.setdefault((row.source, row.trigger), []).append(row)
    for (source, trigger), group in by_trigger.items():
        if trigger in GUARDED_ONLY:
            if any(row.guard is None for row in group):
                problems.append(f"state {source}, trigger {trigger!r}: every row of this trigger must be guarded")
            continue
        fallbacks = [i for i, row in enumerate(group) if row.guard is None]
        if fallbacks != [len(group) - 1]:
            problems.append(
                f"state {source}, trigger {trigger!r}: needs exactly one unguarded fallback row, last "
                f"(found {len(fallbacks)} unguarded at positions {fallbacks} of {len(group)})"
            )
    without_exit = sorted(s for s in states - terminal if not any(row.source is s for row in rows))
    if without_exit:
        problems.append(f"states with no outgoing edge: {', '.join(without_exit)}")
    reachable = {initial}
    queue = deque([initial])
    while queue:
        here = queue.popleft()
        for row in rows:
            if row.source is here and row.dest not in reachable:
                reachable.add(row.dest)
                queue.append(row.dest)
    unreachable = sorted(states - reachable)
    if unreachable:
        problems.append(f"states unreachable from {initial}: {', '.join(unreachable)}")
    unused = [reason for reason in reasons if not any(row.reason == reason for row in rows)]
    if unused:
        problems.append(f"reasons no edge uses: {', '.join(unused)}")
    return problems


def _rows(rows: Iterable[Row]) -> tuple[Row, ...]:
    return tuple(rows)


def _reasons(reasons: Iterable[str]) -> tuple[str, ...]:
    return tuple(reasons)


@attrs.frozen
class Table:
    """An ordered, validated set of rows plus the stop reasons they may carry."""

    rows: tuple[Row, ...] = attrs.field(converter=_rows)
    reasons: tuple[str, ...] = attrs.field(converter=_reasons)
    initial: State = State.AwaitModel
    terminal: frozenset[State] = frozenset({State.Done, State.Failed})

    def __attrs_post_init__(self) -> None:
        problems = _problems(self.rows, self.reasons, self.initial, self.terminal)
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
        """Rows by ``(source, trigger)`` in priority order: what a guard that looks ahead walks."""
        out: dict[tuple[State, str], tuple[Row, ...]] = {}
        for row in self.rows:
            out[row.source, row.trigger] = (*out.get((row.source, row.trigger), ()), row)
        return out

    def with_rows(self, extra: Iterable[Row], reasons: Iterable[str]) -> Table:
        """A new table with ``extra`` rows placed just before the fallback of their state and trigger."""
        rows = list(self.rows)
        for row in extra:
            group = [i for i, r in enumerate(rows) if r.source is row.source and r.trigger == row.trigger]
            if not group:
                msg = f"{row}: state {row.source} has no trigger {row.trigger!r} to attach to"
                raise DefinitionError(msg)
            rows.insert(group[-1], row)
        return Table(rows, (*self.reasons, *reasons), self.initial, self.terminal)


def _finalize_rows(rows: list[Row]) -> list[Row]:
    """One ``finalize`` edge back to AwaitModel for each place a finalizable stop is checked."""
    return [
        Row(row.source, FINALIZE, State.AwaitModel, finalize_on(row.reason, row.trigger))
        for row in rows
        if row.reason in FINALIZABLE
    ]


R = Row
S = State
_ROWS = [
    R(S.AwaitModel, MODEL_FAILED, S.Failed, reason="model_error"),
    R(S.AwaitModel, INTERRUPTED, S.Failed, reason="cancelled"),
    R(S.AwaitModel, REPLIED, S.Failed, hook_raised, "hook_error"),
    R(S.AwaitModel, REPLIED, S.CheckTruncation),
    R(S.CheckTruncation, CHECK, S.Failed, hook_raised, "hook_error"),
    R(S.CheckTruncation, CHECK, S.Failed, is_truncated, "max_tokens"),
    R(S.CheckTruncation, CHECK, S.Failed, is_refusal, "refusal"),
    R(S.CheckTruncation, CHECK, S.Dispatch),
    R(S.Dispatch, DISPATCH, S.Done, has_no_tool_calls),
    R(S.Dispatch, DISPATCH, S.Failed, hook_raised, "hook_error"),
    R(S.Dispatch, DISPATCH, S.Failed, asks_tools_while_finalizing, "finalize_failed"),
    R(S.Dispatch, DISPATCH, S.Failed, is_cancelled, "cancelled"),
    R(S.Dispatch, DISPATCH, S.Failed, deadline_passed, "timeout"),
    R(S.Dispatch, DISPATCH, S.Failed, repeats_last_call, "repeated_action"),
    R(S.Dispatch, DISPATCH, S.Failed, tool_calls_exhausted, "max_tool_calls"),
    R(S.Dispatch, DISPATCH, S.ExecuteTool),
    R(S.ExecuteTool, INTERRUPTED, S.Failed, reason="cancelled"),
    R(S.ExecuteTool, TOOL_DONE, S.Failed, hook_raised, "hook_error"),
    R(S.ExecuteTool, TOOL_DONE, S.Failed, failures_exhausted, "tool_failures"),
    R(S.ExecuteTool, TOOL_DONE, S.Failed, is_cycling, "cycle"),
    R(S.ExecuteTool, TOOL_DONE, S.Dispatch, has_pending_calls),
    R(S.ExecuteTool, TOOL_DONE, S.Failed, is_cancelled, "cancelled"),
    R(S.ExecuteTool, TOOL_DONE, S.Failed, deadline_passed, "timeout"),
    R(S.ExecuteTool, TOOL_DONE, S.Failed, budget_spent, "token_budget"),
    R(S.ExecuteTool, TOOL_DONE, S.Failed, steps_exhausted, "max_steps"),
    R(S.ExecuteTool, TOOL_DONE, S.AwaitModel),
]
_RESUME_ROWS = [
    R(S.Failed, RESUME, S.Dispatch, resumes_before_tool),
    R(S.Failed, RESUME, S.AwaitModel, resumes_before_model),
    R(S.Failed, RESUME, S.AwaitModel, retries_model_call),
]
TABLE = Table(
    rows=_ROWS + _finalize_rows(_ROWS) + _RESUME_ROWS,
    reasons=dict.fromkeys(row.reason for row in _ROWS if row.reason is not None),
)
"""The default machine: every built-in stop in priority order per state, then the finalize and resume edges."""
del R, S
