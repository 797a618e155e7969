"""The diagram model: a table's rows (and one run's path over them) as plain edges that every renderer draws.

The DOT and Mermaid renderers read the same :class:`Edge` tuple, so they can
differ in syntax only, never in which rows they show or how a run's path is
counted.  Nothing here knows a drawing language; the palette is shared so the
two pictures use the same hues.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

import attrs

from fsm_agent import Row, RunResult, State, Table, Transition

EdgeKind = Literal["failure", "success", "plain"]

NAME = "agent_loop"
"""The machine's diagram name: the DOT graph's name and the stem of the files ``make diagram`` writes."""

# Colours are Graphviz names; Mermaid gets the same hues as hex.
FAILURE_COLOR = "red3"
SUCCESS_COLOR = "forestgreen"
TAKEN_COLOR = "royalblue3"
FADED_COLOR = "gray70"
HEX = {FAILURE_COLOR: "#cd0000", SUCCESS_COLOR: "#228b22", TAKEN_COLOR: "#3a5fcd"}


@attrs.frozen
class Edge:
    """One table row as drawn: its label lines, its style and how often a run took it.

    ``index`` is the row's position in the table (its priority), which also
    makes each edge's DOT ``id`` (``row<index>``) unique when several rows join
    the same two states.
    """

    index: int
    row: Row
    kind: EdgeKind
    count: int = 0
    final: bool = False

    @property
    def lines(self) -> tuple[str, ...]:
        """``trigger [guard]`` (just ``trigger`` on a fallback), then the reason on a failure edge."""
        head = self.row.trigger if self.row.guard is None else f"{self.row.trigger} [{self.row.guard_name}]"
        return (head,) if self.row.reason is None else (head, self.row.reason)


def edge_kind(table: Table, row: Row) -> EdgeKind:
    """``failure`` for an edge with a reason (into Failed), ``success`` into another terminal state, else ``plain``."""
    if row.reason is not None:
        return "failure"
    if row.dest in table.terminal:
        return "success"
    return "plain"


def terminal_kind(table: Table, state: State) -> EdgeKind:
    """``failure`` for a terminal state some reason leads into (Failed), ``success`` for the others (Done)."""
    return "failure" if any(row.reason is not None and row.dest is state for row in table.rows) else "success"


def count_label(count: int) -> str:
    """How a taken edge shows the number of times the run took it."""
    return f"×{count}"


def row_index(table: Table, entry: Transition) -> int:
    """The position of the table row a trace entry names; ``ValueError`` if no row matches.

    A trace entry carries source, trigger, dest, guard name and reason, which
    identify one row; a mismatch means the trace came from another table, and
    drawing it over this one would show a path the machine cannot take.
    """
    key = (entry.source, entry.trigger, entry.dest, entry.guard, entry.reason)
    for index, row in enumerate(table.rows):
        if (str(row.source), row.trigger, str(row.dest), row.guard_name, row.reason) == key:
            return index
    leaving = [str(row) + f" on {row.trigger!r}" for row in table.rows if str(row.source) == entry.source]
    msg = (
        f"trace entry {entry.source}->{entry.dest} on {entry.trigger!r} (guard {entry.guard!r}, reason "
        f"{entry.reason!r}) matches no row of the table; rows from {entry.source}: {', '.join(leaving) or 'none'}"
    )
    raise ValueError(msg)


def diagram_edges(table: Table, result: RunResult | None = None) -> tuple[Edge, ...]:
    """Every row of ``table`` as an :class:`Edge`, in row order, with ``result``'s counts and final edge if given."""
    counts: Counter[int] = Counter()
    final = -1
    if result is not None and result.trace:
        counts.update(row_index(table, entry) for entry in result.trace)
        last = row_index(table, result.trace[-1])
        if table.rows[last].dest in table.terminal:
            final = last
    return tuple(
        Edge(index, row, edge_kind(table, row), counts[index], index == final) for index, row in enumerate(table.rows)
    )


def visited_states(result: RunResult) -> dict[str, None]:
    """The names of the states ``result``'s trace entered or left, in order of first visit."""
    return dict.fromkeys(state for entry in result.trace for state in (entry.source, entry.dest))


def spine(table: Table) -> tuple[State, ...]:
    """The happy path to keep on one line: from the initial state, each row's first new non-terminal destination.

    Following the first such row in priority order gives AwaitModel,
    CheckTruncation, Dispatch, ExecuteTool for the default table, and a
    sensible line for any other table without naming states here.
    """
    line = [table.initial]
    while True:
        following = (
            row.dest for row in table.rows_from(line[-1]) if row.dest not in table.terminal and row.dest not in line
        )
        after = next(following, None)
        if after is None:
            return tuple(line)
        line.append(after)
