"""The machine as a Mermaid flowchart, which GitHub draws without Graphviz.

A pure function of the table (and optionally a run): the README's picture is
this text, checked against a fresh render by the tests.  It is a
``flowchart`` rather than a ``stateDiagram`` because only flowcharts let each
edge have its own colour, width and dashes (``linkStyle``), which is how the
loop, the answer, the stops, finalize and resume are told apart, as in the
DOT drawing.
"""

from __future__ import annotations

from fsm_agent import RunResult, State, Table
from fsm_agent.render.model import (
    FADED_COLOR,
    FAILURE_COLOR,
    HEX,
    KIND_COLOR,
    SUCCESS_COLOR,
    TAKEN_COLOR,
    Edge,
    EdgeKind,
    count_label,
    diagram_edges,
    drawing_order,
    terminal_kind,
    visited_states,
)

SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,×()[]/")

WIDTH: dict[EdgeKind, str] = {
    "loop": "3px",
    "success": "2.5px",
    "failure": "1.2px",
    "finalize": "1.5px",
    "resume": "1.5px",
}
DASHES: dict[EdgeKind, str] = {"finalize": "6 4", "resume": "2 4"}
ARROW: dict[EdgeKind, str] = {"loop": "==>", "success": "==>", "failure": "-->", "finalize": "-.->", "resume": "-.->"}


def _text(text: str) -> str:
    # Everything but plain characters becomes a Mermaid entity code (#34; for a quote), so a user's
    # reason or guard name can neither end a label early nor inject markup.
    return "".join(char if char in SAFE else f"#{ord(char)};" for char in text)


def _label(edge: Edge) -> str:
    return _text(edge.label + (f" {count_label(edge.count)}" if edge.count else ""))


def _link_style(kind: EdgeKind, count: int, final: bool, result: RunResult | None) -> str:
    color, width = HEX[KIND_COLOR[kind]], WIDTH[kind]
    if result is not None:
        if final:
            width = "4px"
        elif count:
            color, width = HEX[TAKEN_COLOR], "2.5px"
        else:
            color, width = HEX[FADED_COLOR], "1px"
    dashes = f",stroke-dasharray:{DASHES[kind]}" if kind in DASHES else ""
    return f"stroke:{color},stroke-width:{width}{dashes},color:{color}"


def to_mermaid(table: Table, result: RunResult | None = None, *, compact: bool = False) -> str:
    """The machine as a Mermaid ``flowchart LR``; with ``result``, its path marked on it.

    The same picture as the DOT one: the loop thick and first, the answer
    green, each state's stops as a red fan, labelled with their reasons, into
    a junction of that state and one trunk into ``Failed``; finalize edges
    dashed orange, resume edges dotted grey.  A run's path shows as counts on
    the edges it took, those edges blue, its last edge bold, the rest faded,
    and its visited states tinted.  ``compact`` folds each state's stops,
    and its finalize edges, into one edge labelled with their reasons.
    """
    edges = diagram_edges(table, result)
    out = ["flowchart LR"]
    out.append('    start((" "))')
    for state in table.states:
        shape = f"((({state})))" if state in table.terminal else f"({state})"
        out.append(f"    {state}{shape}")
    links: list[str] = []
    styles: list[str] = []

    def link(source: str, arrow: str, dest: str, label: str, style: str) -> None:
        text = f'|"{label}"|' if label else ""
        links.append(f"    {source} {arrow}{text} {dest}")
        styles.append(style)

    link("start", "==>", str(table.initial), "", f"stroke:{HEX[KIND_COLOR['loop']]},stroke-width:3px")
    fans: dict[State, list[Edge]] = {}
    folded: dict[tuple[State, EdgeKind], list[Edge]] = {}
    for edge in drawing_order(edges):
        style = _link_style(edge.kind, edge.count, edge.final, result)
        if compact and edge.kind in ("failure", "finalize"):
            folded.setdefault((edge.row.source, edge.kind), []).append(edge)
        elif edge.kind == "failure":
            fans.setdefault(edge.row.source, []).append(edge)
            link(str(edge.row.source), "---", f"stops_{edge.row.source}", _label(edge), style)
        else:
            link(str(edge.row.source), ARROW[edge.kind], str(edge.row.dest), _label(edge), style)
    for (source, kind), group in folded.items():
        count, final = sum(e.count for e in group), any(e.final for e in group)
        names = dict.fromkeys(e.row.reason or e.label for e in group)
        label = _text(f"finalize ({', '.join(names)})" if kind == "finalize" else ", ".join(names))
        label += f" {count_label(count)}" if count else ""
        link(str(source), ARROW[kind], str(group[0].row.dest), label, _link_style(kind, count, final, result))
    for source, fan in fans.items():
        out.append(f'    stops_{source}((" "))')
        count, final = sum(e.count for e in fan), any(e.final for e in fan)
        link(f"stops_{source}", "-->", str(fan[0].row.dest), "", _link_style("failure", count, final, result))
    out.extend(links)
    out.extend(f"    linkStyle {index} {style}" for index, style in enumerate(styles))
    out.append(f"    classDef junction fill:{HEX[FAILURE_COLOR]},stroke:{HEX[FAILURE_COLOR]}")
    out.append("    classDef entry fill:#000000,stroke:#000000")
    for kind, color in (("failure", HEX[FAILURE_COLOR]), ("success", HEX[SUCCESS_COLOR])):
        out.append(f"    classDef {kind} stroke:{color},stroke-width:3px,color:{color}")
    out.append("    class start entry")
    if fans:
        out.append(f"    class {','.join(f'stops_{source}' for source in fans)} junction")
    if result is not None:
        out.append(f"    classDef taken fill:#eef3ff,stroke:{HEX[TAKEN_COLOR]},stroke-width:2px")
        visited = visited_states(result)
        taken = [state for state in table.states if str(state) in visited and state not in table.terminal]
        if taken:
            out.append(f"    class {','.join(taken)} taken")
    for state in table.states:
        if state in table.terminal:
            out.append(f"    class {state} {terminal_kind(table, state)}")
    return "\n".join(out) + "\n"
