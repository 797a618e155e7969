"""Diagrams of the machine: a transition table, and optionally one run's path over it, as DOT or Mermaid text.

The renderers are pure functions of the :class:`~fsm_agent.table.Table` an
agent runs (and of a :class:`~fsm_agent.records.RunResult`), so the picture is
drawn from the very rows the engine uses and cannot drift from them: a stop
added to the table is drawn without touching this module.  They return text,
which the tests compare with the committed ``diagrams/agent_loop.dot``; only
:func:`render` runs Graphviz's ``dot`` program, as a thin last step.  Nothing
on the run path imports this module.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import shutil
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import attrs
import graphviz  # type: ignore[import-untyped]  # graphviz ships no type information

from fsm_agent.events import read_log
from fsm_agent.markdown import README, update_readme
from fsm_agent.records import RunResult, Transition
from fsm_agent.states import State
from fsm_agent.table import TABLE, Row, Table

EdgeKind = Literal["failure", "success", "plain"]

INSTALL_HINT = "install Graphviz for SVG/PNG: apt-get install graphviz (Debian/Ubuntu) or brew install graphviz (macOS)"
"""The one line printed when ``dot`` is missing; the text outputs are written anyway."""

DIAGRAM_DIR = Path("diagrams")
RUNS_DIR = DIAGRAM_DIR / "runs"
NAME = "agent_loop"
FORMATS = {"svg": "svg", "png": "png", "dot": "dot", "mermaid": "mmd"}
"""Output format -> file suffix; ``svg`` and ``png`` need Graphviz's ``dot`` program."""

# Colours are Graphviz names; Mermaid gets the same hues as hex.
FAILURE_COLOR = "red3"
SUCCESS_COLOR = "forestgreen"
TAKEN_COLOR = "royalblue3"
FADED_COLOR = "gray70"
SPINE_WEIGHT = 10
_HEX = {FAILURE_COLOR: "#cd0000", SUCCESS_COLOR: "#228b22", TAKEN_COLOR: "#3a5fcd"}


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


def _terminal_kind(table: Table, state: State) -> EdgeKind:
    return "failure" if any(row.reason is not None and row.dest is state for row in table.rows) else "success"


def _dot_label(lines: Iterable[str]) -> str:
    # graphviz.escape keeps a user's backslashes literal; the joining "\n" is DOT's own line break.
    return "\\n".join(graphviz.escape(line) for line in lines)


def _count(count: int) -> str:
    return f"×{count}"


def to_dot(table: Table, result: RunResult | None = None) -> str:
    """The machine as Graphviz DOT text; with ``result``, its path drawn over it.

    Left to right, the happy path on one line (one node ``group`` and heavy
    edge weights), terminal states as double circles, edges into ``Failed``
    red and labelled with their reason, the edge into ``Done`` green.  With a
    run, the edges it took are blue and labelled with their count, its final
    edge bold in its own colour, and every other edge faded.  Same input, same
    bytes, so the committed file can be compared with a fresh render.
    """
    edges = diagram_edges(table, result)
    line = spine(table)
    font = "Helvetica"
    graph = graphviz.Digraph(
        NAME if result is None else f"{NAME}_run",
        graph_attr={"rankdir": "LR", "fontname": font, "nodesep": "0.5", "ranksep": "0.8"},
        node_attr={"fontname": font, "fontsize": "12"},
        edge_attr={"fontname": font, "fontsize": "10"},
    )
    if result is not None:
        ending = "Done" if result.ok else f"Failed({result.reason})"
        graph.attr(label=f"run ended in {ending} after {len(result.trace)} transitions", labelloc="t")
    trace = result.trace if result is not None else ()
    visited = {entry.source for entry in trace} | {entry.dest for entry in trace}
    final_state = next((str(edge.row.dest) for edge in edges if edge.final), None)
    graph.node("__start__", label="", shape="point", width="0.15", group="spine")
    for state in table.states:
        attributes: dict[str, str] = {}
        if state in table.terminal:
            color = FAILURE_COLOR if _terminal_kind(table, state) == "failure" else SUCCESS_COLOR
            attributes.update(shape="doublecircle", color=color, fontcolor=color)
        else:
            attributes.update(shape="box", style="rounded")
        if state in line:
            attributes["group"] = "spine"
        if str(state) == final_state:
            tint = "mistyrose" if _terminal_kind(table, state) == "failure" else "honeydew"
            attributes.update(style="filled", fillcolor=tint, penwidth="3")
        elif str(state) in visited and state not in table.terminal:
            attributes.update(style="rounded,filled", fillcolor="aliceblue")
        graph.node(str(state), **attributes)
    graph.edge("__start__", str(table.initial), weight=str(SPINE_WEIGHT))
    steps = set(itertools.pairwise(line))
    for edge in edges:
        graph.edge(
            str(edge.row.source),
            str(edge.row.dest),
            **_dot_edge(edge, (edge.row.source, edge.row.dest) in steps, result),
        )
    source: str = graph.source
    return source


def _dot_edge(edge: Edge, on_spine: bool, result: RunResult | None) -> dict[str, str]:
    attributes = {"id": f"row{edge.index}"}
    lines = edge.lines
    if on_spine:
        attributes["weight"] = str(SPINE_WEIGHT)
    color = {"failure": FAILURE_COLOR, "success": SUCCESS_COLOR, "plain": None}[edge.kind]
    if result is not None:
        if edge.count == 0:
            color = FADED_COLOR
        else:
            lines = (*lines[:-1], f"{lines[-1]} {_count(edge.count)}")
            if edge.final:
                attributes.update(penwidth="4", style="bold")
            else:
                color = TAKEN_COLOR
                attributes["penwidth"] = "2.5"
    elif edge.kind == "success":
        attributes["penwidth"] = "2"
    if color is not None:
        attributes.update(color=color, fontcolor=color)
    attributes["label"] = _dot_label(lines)
    return attributes


def _mermaid_text(text: str) -> str:
    # Mermaid's state grammar ends a transition label at ":", ";" or a newline, and its entity
    # codes end in ";" too, so such characters in a user's trigger, guard or reason become spaces.
    return text.translate(str.maketrans(":;\n", "   "))


def to_mermaid(table: Table, result: RunResult | None = None) -> str:
    """The machine as Mermaid ``stateDiagram-v2`` text, which GitHub draws without Graphviz.

    Mermaid cannot style single transitions of a state diagram, so failure
    edges are told apart by their reason (``trigger [guard] → reason``), the
    terminal states are coloured and marked final (``--> [*]``), and a run's
    path shows as counts on the edges it took and its visited states
    highlighted.
    """
    edges = diagram_edges(table, result)
    out = ["stateDiagram-v2", "    direction LR"]
    out.extend(f"    {state}" for state in table.states)
    out.append(f"    [*] --> {table.initial}")
    for edge in edges:
        label = " → ".join(edge.lines)
        if edge.count:
            label += f" {_count(edge.count)}"
        out.append(f"    {edge.row.source} --> {edge.row.dest}: {_mermaid_text(label)}")
    out.extend(f"    {state} --> [*]" for state in table.states if state in table.terminal)
    hexes = {"failure": _HEX[FAILURE_COLOR], "success": _HEX[SUCCESS_COLOR]}
    for kind, color in hexes.items():
        out.append(f"    classDef {kind} stroke:{color},stroke-width:3px,color:{color}")
    if result is not None:
        out.append(f"    classDef taken fill:#eef3ff,stroke:{_HEX[TAKEN_COLOR]},stroke-width:2px")
        visited = dict.fromkeys(s for entry in result.trace for s in (entry.source, entry.dest))
        taken = [state for state in table.states if str(state) in visited and state not in table.terminal]
        if taken:
            out.append(f"    class {','.join(taken)} taken")
    for state in table.states:
        if state in table.terminal:
            out.append(f"    class {state} {_terminal_kind(table, state)}")
    return "\n".join(out) + "\n"


def dot_installed() -> bool:
    """True if Graphviz's ``dot`` program is on ``PATH``, which SVG and PNG output need."""
    return shutil.which("dot") is not None


def render(dot_source: str, fmt: str = "svg") -> bytes:
    """Run Graphviz's ``dot`` on DOT text and return the picture; ``graphviz.ExecutableNotFound`` without ``dot``."""
    picture: bytes = graphviz.Source(dot_source).pipe(format=fmt)
    return picture


def write_picture(dot_source: str, path: Path) -> Path:
    """Write ``path`` (format from its suffix) with ``dot``; without ``dot``, write the DOT text beside it instead.

    Returns the path written, so a caller can tell (suffix ``.dot``) that
    Graphviz was missing and say how to install it, once.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if not dot_installed():
        path = path.with_suffix(".dot")
        path.write_text(dot_source, encoding="utf-8")
        return path
    path.write_bytes(render(dot_source, path.suffix.lstrip(".")))
    return path


def write_runs(
    results: Iterable[tuple[str, RunResult]], directory: Path = RUNS_DIR, table: Table = TABLE
) -> list[Path]:
    """One run-path picture per named result, ``<name>.svg`` (``<name>.dot`` without ``dot``); the paths written."""
    return [write_picture(to_dot(table, result), directory / f"{name}.svg") for name, result in results]


def write_all(table: Table, directory: Path = DIAGRAM_DIR) -> list[Path]:
    """What ``make diagram`` writes: ``agent_loop.dot``, ``.mmd`` and, where ``dot`` is installed, ``.svg``."""
    directory.mkdir(parents=True, exist_ok=True)
    dot_path = directory / f"{NAME}.dot"
    mermaid_path = directory / f"{NAME}.mmd"
    source = to_dot(table)
    dot_path.write_text(source, encoding="utf-8")
    mermaid_path.write_text(to_mermaid(table), encoding="utf-8")
    written = [dot_path, mermaid_path]
    if dot_installed():
        svg_path = directory / f"{NAME}.svg"
        svg_path.write_bytes(render(source, "svg"))
        written.append(svg_path)
    return written


def load_table(spec: str) -> Table:
    """The table named by ``module:attribute``: a ``Table``, or anything with a ``.table`` (an ``Agent``)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        msg = f"--table wants module:attribute (e.g. fsm_agent.table:TABLE), got {spec!r}"
        raise ValueError(msg)
    found = getattr(importlib.import_module(module_name), attribute)
    table = getattr(found, "table", found)
    if not isinstance(table, Table):
        msg = f"{spec} is a {type(found).__name__}, not a Table or an object with a .table"
        raise TypeError(msg)
    return table


def load_run(path: str | Path) -> RunResult:
    """A run to draw: a ``RunResult.to_json()`` file, or a JSON Lines log written by ``JsonlLog`` (trace only)."""
    text = Path(path).read_text(encoding="utf-8")
    first = text.lstrip().split("\n", 1)[0]
    if '"format"' in first and '"fsm_agent.RunResult"' in text[:200]:
        return RunResult.from_json(text)
    trace = read_log(path)
    if not trace:
        msg = f"{path}: no transitions in this log"
        raise ValueError(msg)
    reason = trace[-1].reason or ("done" if trace[-1].dest == State.Done else "running")
    return RunResult(messages=(), steps=(), final="", reason=reason, trace=trace)


def _format_for(out: str | None, fmt: str | None) -> str:
    if fmt is not None:
        return fmt
    suffix = Path(out or "").suffix.lstrip(".")
    for name, known in FORMATS.items():
        if suffix in (name, known):
            return name
    msg = f"cannot tell the format from {out!r}; give --format ({', '.join(FORMATS)})"
    raise ValueError(msg)


def _write_one(table: Table, fmt: str, out: str | None, result: RunResult | None = None) -> int:
    text = to_mermaid(table, result) if fmt == "mermaid" else to_dot(table, result)
    picture = fmt in ("svg", "png")
    if out == "-":
        if picture and not dot_installed():
            print(f"cannot draw {fmt} without Graphviz's dot; {INSTALL_HINT}", file=sys.stderr)
            return 1
        if picture:
            sys.stdout.buffer.write(render(text, fmt))
        else:
            sys.stdout.write(text)
        return 0
    path = Path(out) if out is not None else DIAGRAM_DIR / f"{NAME}.{FORMATS[fmt]}"
    if picture:
        written = write_picture(text, path)
        if written != path:
            print(f"{path} not drawn, DOT text written instead; {INSTALL_HINT}", file=sys.stderr)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written = path
    print(f"wrote {written}")
    return 0


def main(args: argparse.Namespace) -> int:
    """Write the diagram(s) the options ask for; exit 1 only if nothing could be written.

    Without ``--format`` and ``--out`` it writes what ``make diagram``
    commits.  A missing ``dot`` is not an error: the DOT text is the
    diagram's source and still gets written, with one line on installing
    Graphviz.
    """
    try:
        table = load_table(args.table)
        result = None if args.run is None else load_run(args.run)
        if result is not None and args.format is None and args.out is None:
            args.out = str(Path(args.run).with_suffix(".svg"))
        fmt = None if args.format is None and args.out is None else _format_for(args.out, args.format)
        if result is not None:
            diagram_edges(table, result)  # a trace from another table is reported here, not half-drawn
    except (ValueError, TypeError, ImportError, AttributeError, OSError) as exc:
        print(f"diagram: {exc}", file=sys.stderr)
        return 1
    try:
        if fmt is not None:
            return _write_one(table, fmt, args.out, result)
        for path in write_all(table):
            print(f"wrote {path}")
        if table is TABLE and README.exists() and update_readme(table, to_mermaid(table)):
            print(f"updated the rendered blocks of {README}")
    except OSError as exc:
        print(f"diagram: could not write: {exc}", file=sys.stderr)
        return 1
    if not dot_installed():
        svg = DIAGRAM_DIR / f"{NAME}.svg"
        print(
            f"{svg} not drawn: Graphviz's dot is not installed; {INSTALL_HINT}, then run make diagram", file=sys.stderr
        )
    return 0


def add_command(commands: Any) -> None:
    """Register ``python -m fsm_agent diagram``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "diagram",
        help="draw the state machine (DOT, SVG, PNG or Mermaid)",
        description="Without options, write diagrams/agent_loop.dot, .mmd and (with Graphviz) .svg.",
    )
    parser.add_argument("--format", choices=list(FORMATS), help="one output format (default: dot, mermaid and svg)")
    parser.add_argument("--out", help="output path, '-' for stdout (default: diagrams/agent_loop.<suffix>)")
    parser.add_argument(
        "--table",
        default="fsm_agent.table:TABLE",
        help="module:attribute of the Table (or Agent) to draw (default: %(default)s)",
    )
    parser.add_argument(
        "--run",
        help="draw this run's path: a RunResult JSON (--trace of `run`) or a JSON Lines log (default out: RUN.svg)",
    )
    parser.set_defaults(handler=main)
