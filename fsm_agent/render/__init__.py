"""Pictures and text drawn from a transition table: never imported on the run path.

``model`` turns a table (and optionally one run's trace) into plain edges;
``dot`` and ``mermaid`` draw those edges as text, and ``dot`` alone runs
Graphviz as a thin last step; ``markdown`` renders the README's stop lists.
Each renderer is a pure function of the table, so the committed diagrams and
README blocks can be compared with a fresh render.
"""

from fsm_agent.render.dot import INSTALL_HINT, dot_installed, render, to_dot, write_picture, write_runs
from fsm_agent.render.mermaid import to_mermaid
from fsm_agent.render.model import Edge, EdgeKind, diagram_edges, edge_kind, row_index, spine

__all__ = [
    "INSTALL_HINT",
    "Edge",
    "EdgeKind",
    "diagram_edges",
    "dot_installed",
    "edge_kind",
    "render",
    "row_index",
    "spine",
    "to_dot",
    "to_mermaid",
    "write_picture",
    "write_runs",
]
