"""What a transition table must be to be run: every problem ``Table`` refuses when it is built, named at once.

Why apart from the table: the rows say how a run moves; these checks say
which tables the engine can run at all (known states, one fallback per
state and trigger, reasons only into ``Failed``, every state reachable, no
row that brings a run to a tool call with none pending or to a reply's
checks with no fresh reply).  ``Table`` calls ``table_problems`` as it is
built, and raises one ``DefinitionError`` listing them all.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from fsm_agent.definition.derived import resumes_before_answer, resumes_before_tool
from fsm_agent.definition.guards import has_pending_calls
from fsm_agent.definition.states import STATES, State
from fsm_agent.definition.triggers import CHECK, GUARDED_ONLY, REPLIED, RESUME

if TYPE_CHECKING:
    from fsm_agent.definition.table import Row


def table_problems(
    rows: tuple[Row, ...], reasons: tuple[str, ...], initial: State, terminal: frozenset[State]
) -> list[str]:
    """Every reason ``rows`` cannot be run as a table (none: it can), each naming the row or state at fault.

    All of them, not the first: a table is built by hand from rows, and a
    person fixing it wants the whole list at once.
    """
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
        problems += _without_a_call(row)
        problems += _without_a_reply(row)
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


def _without_a_call(row: Row) -> list[str]:
    """Why ``row`` could bring a run to a tool call with none pending, if it could: the engine reads the next one there.

    Why: ``ExecuteTool`` runs the turn's next pending call, and ``Dispatch``
    after a tool call dispatches the next one.  Only ``Dispatch`` (past its
    rows for a reply that asks for no tool) leads to the one, and
    ``ExecuteTool`` goes back to the other only on ``has_pending_calls``: a
    row of ``with_rows`` comes after that one, so it could fire only once no
    call is left, and a guard of one's own cannot tell that a call is pending.
    """
    if row.dest is State.ExecuteTool and row.source is not State.Dispatch:
        return [f"{row}: ExecuteTool runs the turn's next pending call; only Dispatch, which has one, leads to it"]
    if row.source is State.ExecuteTool and row.dest is State.Dispatch and row.guard is not has_pending_calls:
        return [
            f"{row}: ExecuteTool goes back to Dispatch only while a call of the turn is pending, on the "
            f"{has_pending_calls.__name__} row; this one could enter Dispatch with no call pending"
        ]
    return []


AFTER_A_REPLY = frozenset({(State.AwaitModel, REPLIED), (State.CheckTruncation, CHECK)})
"""The states and triggers a run leaves with a reply just arrived: the only ways into the reply's checks."""


def _without_a_reply(row: Row) -> list[str]:
    """Why ``row`` could bring a run to ``Dispatch`` or ``CheckTruncation`` with no fresh reply, if it could.

    Why: both read the latest reply and ``Dispatch`` goes on to its tool
    calls, so a run arriving on another trigger (a model error, the start)
    finds an old reply, or none, and the engine reads a call not pending.
    Besides ``AFTER_A_REPLY``, only ``ExecuteTool`` on ``has_pending_calls``
    (``_without_a_call``) and a resume on ``resumes_before_tool`` or
    ``resumes_before_answer`` (the reply it stopped at) lead there.
    """
    if row.dest not in (State.Dispatch, State.CheckTruncation) or (row.source, row.trigger) in AFTER_A_REPLY:
        return []
    if row.dest is State.Dispatch and row.source is State.ExecuteTool:
        return []  # _without_a_call's to judge
    if (
        row.dest is State.Dispatch
        and row.source is State.Failed
        and row.guard in (resumes_before_tool, resumes_before_answer)
    ):
        return []
    return [
        f"{row} on {row.trigger!r}: {row.dest} reads the reply just arrived, which only AwaitModel on {REPLIED!r} "
        f"and CheckTruncation on {CHECK!r} bring; this row could enter it with an old reply (or none), no call pending"
    ]
