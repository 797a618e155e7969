"""The table as Markdown: the drawing, the stop list per state and the table of reasons, rendered, never hand-kept.

A page carries a rendered block between two comment lines,
``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, each on a line of its own.
``make diagram`` rewrites the blocks of ``README.md`` and of every page under
``docs/`` from the table (and the Mermaid picture), and a test fails when a
committed page differs from a fresh render, so the documentation cannot drift
from the engine.  A page carries any of the blocks, each as often as it likes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from fsm_agent.definition.table import Row, Table
from fsm_agent.definition.triggers import FINALIZE, TRIGGERS
from fsm_agent.render.model import LEGEND, LOOKS, first_line
from fsm_agent.testing import edge_id

BLOCKS = ("machine", "stops", "reasons")
"""The blocks rendered from a table: the drawing with its legend, every edge per state, the stop reasons."""


def _row_text(row: Row) -> str:
    """One row as its edge id (what ``edges()`` and the tests name it), its trigger, and when it is taken."""
    edge = f"`{edge_id(row)}` on `{row.trigger}`"
    if row.guard is None:
        return f"{edge}: {TRIGGERS.get(row.trigger, row.trigger)}" if row.reason else f"{edge}, otherwise (fallback)"
    guard = f" if `{row.guard_name}`" if row.reason else ""  # a row without a reason is named by its guard
    return f"{edge}{guard}: {first_line(row.guard.__doc__)}"


def stops_by_state(table: Table) -> str:
    """Each non-terminal state's edges in priority order (finalize edges apart), as nested Markdown lists.

    A row reads ``Source->Dest[label]`` on ``trigger``: the edge id of ``fsm_agent.testing.edge_id``, the
    form ``edges(result)`` and the tests name an edge by.
    """
    lines = []
    for state in table.states:
        rows = [r for r in table.rows_from(state) if r.trigger != FINALIZE]
        if not rows:
            continue
        lines.append(f"- **{state}**")
        lines.extend(f"  {i}. {_row_text(row)}" for i, row in enumerate(rows, 1))
    return "\n".join(lines)


def reasons_table(table: Table) -> str:
    """One row per stop reason: where it is checked, by which guard, its evidence and the policies it allows."""
    lines = ["| reason | checked at | guard | evidence | `on_stop` | `resume` |", "|---|---|---|---|---|---|"]
    stops = table.stop_for
    for reason in table.reasons:
        rows = [r for r in table.rows if r.reason == reason]
        places = ", ".join(f"{r.source} (`{r.trigger}`)" for r in rows)
        guards = ", ".join(dict.fromkeys(f"`{r.guard_name}`" if r.guard else "—" for r in rows))
        stop = stops.get(reason)
        evidence = stop.evidence.__doc__ if stop is not None else ""
        policies = ", ".join(stop.policies) if stop is not None else "raise, return"
        if stop is not None and stop.edge_only:
            policies = "— (the stop that asked for the finalize stands)"
        resume = _RESUME.get(stop.resume or "", "—") if stop is not None else "—"
        lines.append(f"| `{reason}` | {places} | {guards} | {first_line(evidence)} | {policies} | {resume} |")
    return "\n".join(lines)


_RESUME = {"lift": "new limits that lift it", "retry": "`retry=True`"}


def legend() -> str:
    """The drawing's legend as one Markdown line per kind of edge (Mermaid pictures carry none of their own)."""
    return "\n".join(f"- **{LOOKS[kind]}**: {meaning}" for kind, meaning in LEGEND)


def render_blocks(table: Table, mermaid: str) -> dict[str, str]:
    """The blocks rendered from ``table`` by marker name (see ``BLOCKS``); ``mermaid`` is the drawing's source."""
    return {
        "machine": f"```mermaid\n{mermaid.rstrip()}\n```\n\n{legend()}",
        "stops": stops_by_state(table),
        "reasons": reasons_table(table),
    }


def _marker(name: str, end: str) -> str:
    return f"<!-- {name}:{end} -->"


def _block(name: str) -> re.Pattern[str]:
    """One marked block: the start line, anything, the end line; the markers must stand on lines of their own."""
    start, end = re.escape(_marker(name, "start")), re.escape(_marker(name, "end"))
    return re.compile(rf"^{start}\n(?:.*?\n)?{end}$", re.DOTALL | re.MULTILINE)


def marked(text: str, names: Iterable[str]) -> list[str]:
    """Which of ``names`` ``text`` has a marker line of, start or end (a half-marked block is for ``fill`` to name)."""
    return [n for n in names if re.search(rf"^<!-- {re.escape(n)}:(?:start|end) -->$", text, re.MULTILINE)]


def fill(text: str, blocks: Mapping[str, str]) -> str:
    """Rewrite every block of ``text`` that ``blocks`` has a body for; ``text`` must mark at least one.

    A marker without its partner is an error naming the block, and so is a
    text with none of the blocks: a page given to ``make diagram`` that has
    nothing to render was almost certainly given by mistake.
    """
    names = marked(text, blocks)
    if not names:
        wanted = ", ".join(blocks)
        msg = f"no rendered block: none of the <!-- NAME:start --> ... <!-- NAME:end --> lines, NAME one of {wanted}"
        raise ValueError(msg)
    for name in names:
        pattern = _block(name)
        pairs = len(pattern.findall(text))
        lines = sum(1 for end in ("start", "end") for _ in re.finditer(rf"^{_marker(name, end)}$", text, re.MULTILINE))
        if pairs == 0 or lines != 2 * pairs:
            msg = f"the {name} block needs a {_marker(name, 'start')} line and then a {_marker(name, 'end')} line"
            raise ValueError(msg)
        body = f"{_marker(name, 'start')}\n{blocks[name]}\n{_marker(name, 'end')}"
        text = pattern.sub(body.replace("\\", r"\\"), text)  # the body as it is: no group references
    return text
