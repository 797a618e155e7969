"""The machine as Mermaid ``stateDiagram-v2`` text, which GitHub draws without Graphviz.

A pure function of the table (and optionally a run): the README's picture is
this text, checked against a fresh render by the tests.
"""

from __future__ import annotations

from fsm_agent import RunResult, Table
from fsm_agent.render.model import (
    FAILURE_COLOR,
    HEX,
    SUCCESS_COLOR,
    TAKEN_COLOR,
    count_label,
    diagram_edges,
    terminal_kind,
    visited_states,
)


def _mermaid_text(text: str) -> str:
    # Mermaid's state grammar ends a transition label at ":", ";" or a newline, and its entity
    # codes end in ";" too, so such characters in a user's trigger, guard or reason become spaces.
    return text.translate(str.maketrans(":;\n", "   "))


def to_mermaid(table: Table, result: RunResult | None = None) -> str:
    """The machine as Mermaid ``stateDiagram-v2`` text; with ``result``, its path marked on it.

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
            label += f" {count_label(edge.count)}"
        out.append(f"    {edge.row.source} --> {edge.row.dest}: {_mermaid_text(label)}")
    out.extend(f"    {state} --> [*]" for state in table.states if state in table.terminal)
    hexes = {"failure": HEX[FAILURE_COLOR], "success": HEX[SUCCESS_COLOR]}
    for kind, color in hexes.items():
        out.append(f"    classDef {kind} stroke:{color},stroke-width:3px,color:{color}")
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
