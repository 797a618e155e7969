"""The machine as Graphviz DOT text, and the thin last step that runs Graphviz's ``dot`` on it.

:func:`to_dot` is a pure function of the table (and optionally a run), so
the committed ``diagrams/agent_loop.dot`` can be compared byte for byte with
a fresh render; only :func:`render` and :func:`write_picture` run the ``dot``
program.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterable
from pathlib import Path

import graphviz  # type: ignore[import-untyped]  # graphviz ships no type information

from fsm_agent import RunResult, Table
from fsm_agent.render.model import (
    FADED_COLOR,
    FAILURE_COLOR,
    NAME,
    SUCCESS_COLOR,
    TAKEN_COLOR,
    Edge,
    count_label,
    diagram_edges,
    spine,
    terminal_kind,
)

INSTALL_HINT = "install Graphviz for SVG/PNG: apt-get install graphviz (Debian/Ubuntu) or brew install graphviz (macOS)"
"""The one line printed when ``dot`` is missing; the text outputs are written anyway."""

SPINE_WEIGHT = 10
"""Edge weight that keeps the happy path on one straight line."""


def _dot_label(lines: Iterable[str]) -> str:
    # graphviz.escape keeps a user's backslashes literal; the joining "\n" is DOT's own line break.
    return "\\n".join(graphviz.escape(line) for line in lines)


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
            color = FAILURE_COLOR if terminal_kind(table, state) == "failure" else SUCCESS_COLOR
            attributes.update(shape="doublecircle", color=color, fontcolor=color)
        else:
            attributes.update(shape="box", style="rounded")
        if state in line:
            attributes["group"] = "spine"
        if str(state) == final_state:
            tint = "mistyrose" if terminal_kind(table, state) == "failure" else "honeydew"
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
            lines = (*lines[:-1], f"{lines[-1]} {count_label(edge.count)}")
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
