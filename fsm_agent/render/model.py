"""The diagram model: a table's rows (and one run's path over them) as plain edges that every renderer draws.

The DOT and Mermaid renderers, and the run viewer, read the same :class:`Edge`
tuple, so they can differ in syntax only, never in which rows they show, how
each is labelled or how a run's path is counted.  Nothing here knows a
drawing language; the palette is shared so every picture uses the same hues.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Literal

import attrs

from fsm_agent import Row, RunResult, State, Table, Transition
from fsm_agent.definition.triggers import FINALIZE, RESUME, TRIGGERS

EdgeKind = Literal["loop", "success", "failure", "finalize", "resume"]
"""What an edge does: the normal turn, the answer, a stop, one last call after a stop, a resumed run."""

NAME = "agent_loop"
"""The machine's diagram name: the DOT graph's name and the stem of the files ``make diagram`` writes."""

# Colours are Graphviz names; Mermaid and the viewer's stylesheet get the same hues as hex.
LOOP_COLOR = "black"
FAILURE_COLOR = "red3"
SUCCESS_COLOR = "forestgreen"
FINALIZE_COLOR = "darkorange2"
RESUME_COLOR = "gray55"
TAKEN_COLOR = "royalblue3"
FADED_COLOR = "gray80"
HEX = {
    LOOP_COLOR: "#000000",
    FAILURE_COLOR: "#cd0000",
    SUCCESS_COLOR: "#228b22",
    FINALIZE_COLOR: "#ee7600",
    RESUME_COLOR: "#8c8c8c",
    TAKEN_COLOR: "#3a5fcd",
    FADED_COLOR: "#cccccc",
}
KIND_COLOR: dict[EdgeKind, str] = {
    "loop": LOOP_COLOR,
    "success": SUCCESS_COLOR,
    "failure": FAILURE_COLOR,
    "finalize": FINALIZE_COLOR,
    "resume": RESUME_COLOR,
}
LEGEND: tuple[tuple[EdgeKind, str], ...] = (
    ("loop", "a normal turn (model, check, dispatch, tool, back to the model)"),
    ("success", "the answer, the only way into Done"),
    ("failure", "a stop, labelled with its reason; a state's stops leave it together"),
    ("finalize", "finalize, one last model call without tools after a stop"),
    ("resume", "resume(), a stopped run continued"),
)
"""The legend every picture of the machine carries, in drawing order."""
LOOKS: dict[EdgeKind, str] = {
    "loop": "thick black",
    "success": "green",
    "failure": "red",
    "finalize": "dashed orange",
    "resume": "dotted grey",
}
"""How each kind looks, in words, for the legend under the README's Mermaid picture."""

STATE_TOOLTIPS: dict[State, str] = {
    State.AwaitModel: "calls the model (the only place a model call happens)",
    State.CheckTruncation: "looks at the reply's stop_reason before any tool call is considered",
    State.Dispatch: "decides between the final answer, a stop, or running the next tool call of the turn",
    State.ExecuteTool: "runs one tool call",
    State.Done: "terminal: natural finish (or a successful finalize)",
    State.Failed: "terminal: a stop, with its reason and evidence",
}
"""What the driver does in each state, for tooltips (the README's table of states says the same)."""


@attrs.frozen
class Edge:
    """One table row as drawn: its short label, its tooltip, its style and how often a run took it.

    ``index`` is the row's position in the table (its priority), which also
    makes each edge's id (``row<index>``) unique when several rows join the
    same two states; the run viewer finds edges by that id.
    """

    index: int
    row: Row
    kind: EdgeKind
    label: str
    tooltip: str
    count: int = 0
    final: bool = False

    @property
    def id(self) -> str:
        """The edge's id in every drawing: ``row<index>``."""
        return f"row{self.index}"

    @property
    def lines(self) -> tuple[str, ...]:
        """``trigger [guard]`` (just ``trigger`` on a fallback), then the reason on a failure edge: the long form."""
        head = self.row.trigger if self.row.guard is None else f"{self.row.trigger} [{self.row.guard_name}]"
        return (head,) if self.row.reason is None else (head, self.row.reason)


def first_line(doc: str | None) -> str:
    """The summary line of a docstring, or ``""``."""
    return doc.strip().splitlines()[0] if doc and doc.strip() else ""


def edge_kind(table: Table, row: Row) -> EdgeKind:
    """``failure`` for an edge with a reason, ``success`` into another terminal, ``finalize``/``resume`` by trigger."""
    if row.reason is not None:
        return "failure"
    if row.dest in table.terminal:
        return "success"
    if row.trigger == FINALIZE:
        return "finalize"
    if row.trigger == RESUME:
        return "resume"
    return "loop"


def terminal_kind(table: Table, state: State) -> EdgeKind:
    """``failure`` for a terminal state some reason leads into (Failed), ``success`` for the others (Done)."""
    return "failure" if any(row.reason is not None and row.dest is state for row in table.rows) else "success"


def short_label(table: Table, row: Row) -> str:
    """What an edge is labelled with on the picture: the reason of a stop, else the guard (or trigger).

    A stop is labelled with its reason alone, unless its state has two rows
    with that reason (``cancelled`` on ``start`` and on ``interrupted``);
    then the trigger tells them apart.  A finalize edge is named by the stop
    it answers.  The full ``trigger [guard]`` and the guard's doc are in the
    tooltip and the README's list.
    """
    if row.reason is not None:
        twins = sum(1 for r in table.rows if r.source is row.source and r.reason == row.reason)
        return row.reason if twins == 1 else f"{row.reason} ({row.trigger})"
    if row.guard_name is None:
        return row.trigger
    if row.trigger == FINALIZE:
        return row.guard_name.removeprefix("finalize_on_")
    return row.guard_name


def tooltip(row: Row) -> str:
    """The long form of an edge, for SVG tooltips and the viewer: states, trigger, guard, what it means."""
    guard = "" if row.guard is None else f" [{row.guard_name}]"
    why = first_line(row.guard.__doc__).replace("``", "") if row.guard is not None else TRIGGERS.get(row.trigger, "")
    if row.guard is None and row.reason is None:
        why = f"{why} (fallback)" if why else "fallback"
    reason = f" ({row.reason})" if row.reason else ""
    text = f"{row.source} -> {row.dest}{reason} on {row.trigger}{guard}"
    return f"{text}: {why}" if why else text


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
        Edge(
            index,
            row,
            edge_kind(table, row),
            short_label(table, row),
            tooltip(row),
            counts[index],
            index == final,
        )
        for index, row in enumerate(table.rows)
    )


def coverage_edges(table: Table, taken: Mapping[int, int]) -> tuple[Edge, ...]:
    """Every row of ``table`` as an :class:`Edge` counted by ``taken`` (row index to count): a test session's coverage.

    Unlike one run's path, many runs' counts have no final edge.
    """
    return tuple(attrs.evolve(edge, count=taken.get(edge.index, 0)) for edge in diagram_edges(table))


def drawing_order(edges: tuple[Edge, ...]) -> tuple[Edge, ...]:
    """The edges in the order a layout should meet them: the loop first, then the answer, stops, finalize, resume.

    Graphviz ranks nodes by the edges it reads first, so drawing the happy
    loop first keeps it on one straight line whatever the table's row order.
    """
    order = {kind: position for position, (kind, _) in enumerate(LEGEND)}
    return tuple(sorted(edges, key=lambda edge: (order[edge.kind], edge.index)))


def stops_by_source(edges: tuple[Edge, ...]) -> dict[State, tuple[Edge, ...]]:
    """The failure edges grouped by the state they leave, states in order of their first stop row."""
    groups: dict[State, tuple[Edge, ...]] = {}
    for edge in edges:
        if edge.kind == "failure":
            groups[edge.row.source] = (*groups.get(edge.row.source, ()), edge)
    return groups


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
