"""The machine as Graphviz DOT text, and the thin last step that runs Graphviz's ``dot`` on it.

:func:`to_dot` is a pure function of the table (and optionally a run), so
the committed ``diagrams/agent_loop.dot`` can be compared byte for byte with
a fresh render; only :func:`render` and :func:`write_picture` run the ``dot``
program.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

import graphviz  # type: ignore[import-untyped]  # graphviz ships no type information

from fsm_agent import RunResult, State, Table
from fsm_agent.render.model import (
    FADED_COLOR,
    FAILURE_COLOR,
    KIND_COLOR,
    LEGEND,
    NAME,
    STATE_TOOLTIPS,
    SUCCESS_COLOR,
    TAKEN_COLOR,
    Edge,
    EdgeKind,
    count_label,
    coverage_edges,
    diagram_edges,
    drawing_order,
    spine,
    terminal_kind,
)

INSTALL_HINT = "install Graphviz for SVG/PNG: apt-get install graphviz (Debian/Ubuntu) or brew install graphviz (macOS)"
"""The one line printed when ``dot`` is missing; the text outputs are written anyway."""

SPINE_WEIGHT = 10
"""Edge weight that keeps the happy path on one straight line."""

FONT = "Helvetica"

STYLE: dict[EdgeKind, dict[str, str]] = {
    "loop": {"penwidth": "3"},
    "success": {"penwidth": "2.5"},
    "failure": {"penwidth": "1.2"},
    "finalize": {"style": "dashed", "penwidth": "1.5"},
    # Resume edges leave the layout alone (constraint=false): they arc over the stops, out of the way.
    "resume": {"style": "dotted", "penwidth": "1.5", "constraint": "false"},
}
"""How each kind of edge is drawn; the legend draws its samples from the same table."""

GUARDED_LOOP_WIDTH = "1.8"
"""A guarded loop edge (``has_pending_calls``) is part of the loop but not its main line."""


FANNED = frozenset({"failure", "finalize"})
"""Kinds whose edges leave a state as a labelled fan into one trunk (or, compact, as one folded edge)."""

PREFIX: dict[EdgeKind, str] = {"failure": "stops", "finalize": "finalize"}

Look = Literal["plain", "run", "coverage"]
"""What a drawing shows over the machine: nothing, one run's path, or a test session's counts per row."""

NEVER_TAKEN = {"color": FAILURE_COLOR, "fontcolor": FAILURE_COLOR, "style": "dashed", "penwidth": "1.5"}
"""How a coverage drawing marks a row no run took; its label counts 0 and its tooltip says so."""


def fans_by_source(edges: tuple[Edge, ...]) -> dict[tuple[State, EdgeKind], tuple[Edge, ...]]:
    """The stop and finalize edges grouped by the state they leave, in the order the layout meets them."""
    fans: dict[tuple[State, EdgeKind], tuple[Edge, ...]] = {}
    for edge in drawing_order(edges):
        if edge.kind in FANNED:
            key = (edge.row.source, edge.kind)
            fans[key] = (*fans.get(key, ()), edge)
    return fans


def _text(text: str) -> str:
    # graphviz.escape keeps a user's backslashes literal; a joining "\\n" is DOT's own line break.
    escaped: str = graphviz.escape(text)
    return escaped


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _lines(lines: Iterable[str]) -> str:
    return "\\n".join(_text(line) for line in lines)


def to_dot(
    table: Table, result: RunResult | None = None, *, compact: bool = False, taken: Mapping[int, int] | None = None
) -> str:
    """The machine as Graphviz DOT text; with ``result``, its path drawn over it.

    Left to right, the happy loop first and thickest, on one line; the
    answer green into ``Done``; stops red and labelled with their reason
    alone, each state's stops running into a red junction of that state
    before one trunk into ``Failed``, so every stop can be traced back to the
    state it leaves; ``finalize`` edges dashed orange through a junction of
    their own; ``resume`` edges dotted grey, outside the layout; a legend.
    Every edge's ``tooltip`` (and ``id``: ``row<index>`` for a row,
    ``stops_<state>``/``finalize_<state>`` for a trunk) holds its full
    ``trigger [guard]`` and what it means.  ``compact`` folds each state's
    stops, and its finalize edges, into one labelled edge for small pages.
    With a run, the edges it took are blue with their counts, its final edge
    bold in its own colour, the rest faded.  With ``taken`` (row index to how
    often the runs of a test session took it) instead, taken edges are solid
    blue with their counts and never-taken ones dashed red, counted 0.  Same
    input, same bytes.
    """
    if result is not None and taken is not None:
        msg = "to_dot draws one run's path (result) or a session's counts (taken), not both"
        raise ValueError(msg)
    look: Look = "run" if result is not None else "plain" if taken is None else "coverage"
    edges = diagram_edges(table, result) if taken is None else coverage_edges(table, taken)
    graph = graphviz.Digraph(
        {"plain": NAME, "run": f"{NAME}_run", "coverage": f"{NAME}_coverage"}[look],
        graph_attr={"rankdir": "LR", "fontname": FONT, "nodesep": "0.2", "ranksep": "0.45"},
        node_attr={"fontname": FONT, "fontsize": "14"},
        edge_attr={"fontname": FONT, "fontsize": "12", "arrowsize": "0.8"},
    )
    graph.attr(label=_legend(result, edges, look), labelloc="b" if look == "plain" else "t", labeljust="l")
    fans = fans_by_source(edges)
    # Graphviz orders each rank by when it first meets a node: Failed and the stop junctions first puts
    # every stop above the loop, and the loop's way back and the finalize edges below it, so no red trunk
    # crosses the loop.
    _nodes(graph, table, edges, result, first=True)
    for (source, kind), fan in fans.items():
        if kind == "failure" and not compact:
            _junction(graph, source, kind, fan, look)
    _nodes(graph, table, edges, result, first=False)
    graph.edge("__start__", str(table.initial), weight=str(SPINE_WEIGHT), penwidth="3")
    steps = set(itertools.pairwise(spine(table)))
    for edge in drawing_order(edges):
        if edge.kind in FANNED:
            continue
        attributes = _edge(edge, look)
        if (edge.row.source, edge.row.dest) in steps:
            attributes["weight"] = str(SPINE_WEIGHT)
        graph.edge(str(edge.row.source), str(edge.row.dest), **attributes)
    for (source, kind), fan in fans.items():
        trunk = _trunk(source, kind)
        dest = str(fan[0].row.dest)
        if compact:
            graph.edge(str(source), dest, **_folded(trunk, fan, look))
            continue
        attributes = {"id": trunk, "tooltip": _lines(edge.tooltip for edge in fan)}
        attributes.update(_style(kind, sum(e.count for e in fan), any(e.final for e in fan), look))
        if kind == "failure":
            for edge in fan:
                graph.edge(str(source), trunk, arrowhead="none", **_edge(edge, look))
            graph.edge(trunk, dest, **attributes)
            continue
        # A finalize fan runs back to the model under the loop: declared forwards and drawn reversed,
        # its junction is ranked between the model and the state, not beyond every other node.
        _junction(graph, source, kind, fan, look)
        for edge in fan:
            graph.edge(trunk, str(source), dir="back", arrowtail="none", **_edge(edge, look))
        graph.edge(dest, trunk, dir="back", label="finalize", **attributes)
    text: str = graph.source
    return text


def _trunk(source: State, kind: EdgeKind) -> str:
    """The id of a fan's junction node and of the one edge that leaves it: ``stops_<state>``, ``finalize_<state>``."""
    return f"{PREFIX[kind]}_{source}"


def _junction(graph: graphviz.Digraph, source: State, kind: EdgeKind, fan: tuple[Edge, ...], look: Look) -> None:
    taken = any(edge.count for edge in fan)
    color = KIND_COLOR[kind] if look == "plain" or taken else FADED_COLOR if look == "run" else FAILURE_COLOR
    what = "stops" if kind == "failure" else "finalize edges"
    tip = _text(f"the {what} of {source}: {', '.join(edge.label for edge in fan)}")
    graph.node(_trunk(source, kind), label="", shape="point", width="0.1", color=color, tooltip=tip)


def _nodes(
    graph: graphviz.Digraph, table: Table, edges: tuple[Edge, ...], result: RunResult | None, *, first: bool
) -> None:
    """The state nodes: with ``first``, only the terminals stops lead into; else the start point and the rest."""
    line = spine(table)
    trace = result.trace if result is not None else ()
    visited = {entry.source for entry in trace} | {entry.dest for entry in trace}
    final_state = next((str(edge.row.dest) for edge in edges if edge.final), None)
    if not first:
        graph.node("__start__", label="", shape="point", width="0.15", group="spine")
    for state in table.states:
        if first != (state in table.terminal and terminal_kind(table, state) == "failure"):
            continue
        attributes = {"id": f"state_{state}", "tooltip": _text(f"{state}: {STATE_TOOLTIPS.get(state, state)}")}
        if state in table.terminal:
            color = FAILURE_COLOR if terminal_kind(table, state) == "failure" else SUCCESS_COLOR
            attributes.update(shape="doublecircle", color=color, fontcolor=color, penwidth="2")
        else:
            attributes.update(shape="box", style="rounded", penwidth="1.5")
        if state in line:
            attributes["group"] = "spine"
        if str(state) == final_state:
            tint = "mistyrose" if terminal_kind(table, state) == "failure" else "honeydew"
            attributes.update(style="filled", fillcolor=tint, penwidth="3")
        elif str(state) in visited and state not in table.terminal:
            attributes.update(style="rounded,filled", fillcolor="aliceblue")
        graph.node(str(state), **attributes)


def _style(kind: EdgeKind, count: int, final: bool, look: Look) -> dict[str, str]:
    """Colour, width and dashes of an edge of ``kind``, plain or as ``look`` shows it.

    Over a run: final (bold), taken (blue) or faded; over a session's counts:
    taken (solid blue) or never taken (dashed red).
    """
    attributes = {"color": KIND_COLOR[kind], "fontcolor": KIND_COLOR[kind], **STYLE[kind]}
    if look == "plain":
        return attributes
    if final:
        attributes.update(penwidth="4", style="bold")
    elif count:
        attributes.update(color=TAKEN_COLOR, fontcolor=TAKEN_COLOR, penwidth="2.5")
        if look == "coverage":
            attributes["style"] = "solid"
    elif look == "run":
        attributes.update(color=FADED_COLOR, fontcolor=FADED_COLOR, penwidth="1")
    else:
        attributes.update(NEVER_TAKEN)
    return attributes


def _edge(edge: Edge, look: Look) -> dict[str, str]:
    never = look == "coverage" and not edge.count
    attributes = {"id": edge.id, "tooltip": _text(f"never taken: {edge.tooltip}" if never else edge.tooltip)}
    attributes.update(_style(edge.kind, edge.count, edge.final, look))
    if edge.kind == "loop" and edge.row.guard is not None and look == "plain":
        attributes["penwidth"] = GUARDED_LOOP_WIDTH
    counted = edge.count or never
    attributes["label"] = _text(f"{edge.label} {count_label(edge.count)}" if counted else edge.label)
    return attributes


def _folded(trunk: str, fan: tuple[Edge, ...], look: Look) -> dict[str, str]:
    """One edge standing for a fan: its reasons one to a line, its tooltips joined, its counts summed."""
    names = list(dict.fromkeys(edge.row.reason or edge.label for edge in fan))
    counts = {name: sum(e.count for e in fan if (e.row.reason or e.label) == name) for name in names}
    shown = {name for name in names if counts[name] or look == "coverage"}
    words = [name + (f" {count_label(counts[name])}" if name in shown else "") for name in names]
    # One reason a line: a tall label costs a page less than a wide one, which widens its whole rank.
    lines = ["finalize:", *words] if fan[0].kind == "finalize" else words
    attributes = {"id": trunk, "tooltip": _lines(edge.tooltip for edge in fan), "label": _lines(lines)}
    attributes.update(_style(fan[0].kind, sum(counts.values()), any(edge.final for edge in fan), look))
    return attributes


def _legend(result: RunResult | None, edges: tuple[Edge, ...], look: Look) -> str:
    """An HTML-like label: the run's ending or the session's count, then one sample line per kind of edge."""
    rows = []
    if look == "coverage":
        taken = sum(1 for edge in edges if edge.count)
        rows.append(f'<TR><TD COLSPAN="2" ALIGN="LEFT"><B>{taken}/{len(edges)} rows taken by the session</B></TD></TR>')
        entries = [(TAKEN_COLOR, "solid", "2", "taken, ×count"), (FAILURE_COLOR, "dashed", "1.5", "never taken, ×0")]
    elif result is not None:
        ending = "Done" if result.ok else f"Failed({_html(result.reason)})"
        rows.append(
            f'<TR><TD COLSPAN="2" ALIGN="LEFT"><B>run ended in {ending} after {len(result.trace)} '
            "transitions</B></TD></TR>"
        )
        entries = [(TAKEN_COLOR, "solid", "2", "taken by this run, ×count"), (FADED_COLOR, "solid", "1", "not taken")]
        entries.insert(1, (FAILURE_COLOR, "solid", "4", "the run's last edge (green into Done)"))
    else:
        entries = [
            (KIND_COLOR[kind], STYLE[kind].get("style", "solid"), STYLE[kind]["penwidth"], meaning)
            for kind, meaning in LEGEND
        ]
    for color, style, width, meaning in entries:
        dashes = "" if style == "solid" else f' STYLE="{style}"'
        border = str(max(1, round(float(width))))
        # The sample is the bottom border of the upper of two stacked cells, so the line sits mid-row.
        line = f'<TD WIDTH="36" HEIGHT="6" SIDES="B" BORDER="{border}" COLOR="{color}"{dashes}></TD>'
        sample = f'<TD><TABLE BORDER="0" CELLSPACING="0"><TR>{line}</TR><TR><TD HEIGHT="6"></TD></TR></TABLE></TD>'
        rows.append(f'<TR>{sample}<TD ALIGN="LEFT"><FONT POINT-SIZE="12">{_html(meaning)}</FONT></TD></TR>')
    return f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2" CELLPADDING="2">{"".join(rows)}</TABLE>>'


def dot_installed() -> bool:
    """True if Graphviz's ``dot`` program is on ``PATH``, which SVG and PNG output need."""
    return shutil.which("dot") is not None


def render(dot_source: str, fmt: str = "svg") -> bytes:
    """Run Graphviz's ``dot`` on DOT text and return the picture; ``graphviz.ExecutableNotFound`` without ``dot``."""
    picture: bytes = graphviz.Source(dot_source).pipe(format=fmt)
    return picture


def write_picture(dot_source: str, path: Path, fmt: str | None = None) -> Path:
    """Write ``path`` with ``dot`` (format ``fmt``, else its suffix); without ``dot``, the DOT text beside it instead.

    Returns the path written, so a caller can tell (suffix ``.dot``) that
    Graphviz was missing and say how to install it, once.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if not dot_installed():
        path = path.with_suffix(".dot")
        path.write_text(dot_source, encoding="utf-8")
        return path
    path.write_bytes(render(dot_source, fmt or path.suffix.lstrip(".")))
    return path


def write_runs(results: Iterable[tuple[str, RunResult]], directory: Path, table: Table) -> list[Path]:
    """One run-path picture per named result, ``<name>.svg`` (``<name>.dot`` without ``dot``); the paths written."""
    return [write_picture(to_dot(table, result), directory / f"{name}.svg") for name, result in results]
