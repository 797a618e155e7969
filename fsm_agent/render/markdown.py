"""The table as Markdown: the README's stop list per state and its table of reasons, rendered, never hand-kept.

``make diagram`` rewrites the marked blocks of ``README.md`` from the table
(and the Mermaid picture), and a test fails when the committed README differs
from a fresh render, so the documentation cannot drift from the engine.
"""

from __future__ import annotations

import re
from pathlib import Path

from fsm_agent.definition.table import FINALIZE, TRIGGERS, Row, Table
from fsm_agent.render.model import LEGEND, LOOKS, first_line

README = Path("README.md")


def _row_text(row: Row) -> str:
    if row.guard is None:
        why = TRIGGERS.get(row.trigger, row.trigger)
        condition = f"`{row.trigger}`: {why}" if row.reason else f"`{row.trigger}`, otherwise (fallback)"
    else:
        condition = f"`{row.trigger}` [`{row.guard_name}`]: {first_line(row.guard.__doc__)}"
    dest = f"**Failed({row.reason})**" if row.reason else f"**{row.dest}**"
    return f"{dest} when {condition}"


def stops_by_state(table: Table) -> str:
    """Each non-terminal state's edges in priority order (finalize edges apart), as nested Markdown lists."""
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
    """The README blocks by marker name."""
    return {
        "machine": f"```mermaid\n{mermaid.rstrip()}\n```\n\n{legend()}",
        "stops": stops_by_state(table),
        "reasons": reasons_table(table),
    }


def fill(text: str, blocks: dict[str, str]) -> str:
    """Replace each ``<!-- name:start -->…<!-- name:end -->`` block of ``text``; a missing marker is an error."""
    for name, body in blocks.items():
        match = re.search(rf"<!-- {name}:start -->\n(?:.*?\n)?<!-- {name}:end -->", text, re.DOTALL)
        if match is None:
            msg = f"README has no <!-- {name}:start --> ... <!-- {name}:end --> block"
            raise ValueError(msg)
        text = text[: match.start()] + f"<!-- {name}:start -->\n{body}\n<!-- {name}:end -->" + text[match.end() :]
    return text


def update_readme(table: Table, mermaid: str, path: Path = README) -> bool:
    """Rewrite the rendered blocks of ``path``; return whether anything changed."""
    text = path.read_text(encoding="utf-8")
    new = fill(text, render_blocks(table, mermaid))
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text
