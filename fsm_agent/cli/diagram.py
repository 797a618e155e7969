"""The ``diagram`` command: draw a table, or one run's path over it, as DOT, SVG, PNG or Mermaid.

``python -m fsm_agent diagram`` writes ``diagrams/agent_loop.dot``, ``.mmd``
and ``agent_loop_compact.dot`` (and, with Graphviz, the two ``.svg``) under
the current directory, and nothing else; ``--out`` writes one file instead,
``--compact`` folding each state's stops into one edge.  It rewrites a page's
rendered blocks (``fsm_agent.render.markdown``) only when given
``--update-readme FILE`` or ``--update-docs DIR``, which is what this
repository's ``make diagram`` does: an installed command must not edit a
user's README.  Besides the table's blocks there is ``cli``, this command
line's reference (``fsm_agent.cli.reference``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from fsm_agent import RunResult, State, Table
from fsm_agent.cli import EXIT_DONE, EXIT_SETUP, SetupError
from fsm_agent.cli.reference import cli_reference
from fsm_agent.observe.events import read_log
from fsm_agent.render.dot import INSTALL_HINT, dot_installed, render, to_dot, write_picture
from fsm_agent.render.markdown import BLOCKS, fill, marked, render_blocks
from fsm_agent.render.mermaid import to_mermaid
from fsm_agent.render.model import NAME, diagram_edges

DIAGRAM_DIR = Path("diagrams")
"""Where ``diagram`` without ``--out`` writes, relative to the current directory."""

FORMATS = {"svg": "svg", "png": "png", "dot": "dot", "mermaid": "mmd"}
"""Output format -> file suffix; ``svg`` and ``png`` need Graphviz's ``dot`` program."""

PICTURES = ("svg", "png")


def write_all(table: Table, directory: Path = DIAGRAM_DIR) -> list[Path]:
    """The machine's files: ``agent_loop.dot``, ``.mmd``, ``agent_loop_compact.dot`` and, with ``dot``, their SVGs."""
    directory.mkdir(parents=True, exist_ok=True)
    mermaid_path = directory / f"{NAME}.mmd"
    mermaid_path.write_text(to_mermaid(table), encoding="utf-8")
    written = [mermaid_path]
    for stem, compact in ((NAME, False), (f"{NAME}_compact", True)):
        source = to_dot(table, compact=compact)
        dot_path = directory / f"{stem}.dot"
        dot_path.write_text(source, encoding="utf-8")
        written.append(dot_path)
        if dot_installed():
            svg_path = directory / f"{stem}.svg"
            svg_path.write_bytes(render(source, "svg"))
            written.append(svg_path)
    return written


def load_table(spec: str) -> Table:
    """The table named by ``module:attribute``: a ``Table``, or anything with a ``.table`` (an ``Agent``)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        msg = f"--table wants module:attribute (e.g. fsm_agent:TABLE), got {spec!r}"
        raise ValueError(msg)
    found = getattr(importlib.import_module(module_name), attribute)
    table = getattr(found, "table", found)
    if not isinstance(table, Table):
        msg = f"{spec} is a {type(found).__name__}, not a Table or an object with a .table"
        raise TypeError(msg)
    return table


def load_run(path: str | Path) -> RunResult:
    """A run to draw: a ``RunResult`` JSON file (``run --trace``, ``to_json()``) or a JSON Lines log (trace only).

    The result is told apart by parsing the whole file as one JSON object with
    a ``format`` field, so indented JSON (what ``--trace`` writes) and one-line
    JSON both load; anything else is read as a log, line by line.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError:
        data = None  # several JSON documents, one per line: a log
    if isinstance(data, dict) and "format" in data:
        return RunResult.from_dict(data)
    trace = read_log(path)
    if not trace:
        msg = f"{path}: no transitions in this log"
        raise ValueError(msg)
    reason = trace[-1].reason or ("done" if trace[-1].dest == State.Done else "running")
    return RunResult(messages=(), steps=(), final="", reason=reason, trace=trace)


def format_for(out: str | None, fmt: str | None) -> str:
    """The output format: ``fmt`` if given, else the one ``out``'s suffix names; ``ValueError`` if neither says."""
    if fmt is not None:
        return fmt
    suffix = Path(out or "").suffix.lstrip(".")
    for name, known in FORMATS.items():
        if suffix in (name, known):
            return name
    msg = f"cannot tell the format from {out!r}; give --format ({', '.join(FORMATS)})"
    raise ValueError(msg)


def draw(table: Table, result: RunResult | None, fmt: str, compact: bool = False) -> str:
    """The text of one picture: Mermaid for ``mermaid``, DOT for every other format."""
    return to_mermaid(table, result, compact=compact) if fmt == "mermaid" else to_dot(table, result, compact=compact)


def write_diagram(
    table: Table, result: RunResult | None, path: Path, fmt: str | None = None, *, compact: bool = False
) -> Path:
    """Draw ``table`` (with ``result``'s path) to ``path``; the path written, a ``.dot`` beside it without Graphviz."""
    fmt = format_for(str(path), fmt)
    text = draw(table, result, fmt, compact)
    if fmt in PICTURES:
        return write_picture(text, path, fmt)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def written_line(asked: Path, written: Path) -> str:
    """The line that tells the user what :func:`write_diagram` wrote, and how to get the picture if it could not."""
    if written == asked:
        return f"wrote {written}"
    return f"{asked} not drawn, DOT text written to {written} instead; {INSTALL_HINT}"


def diagram_format(path: Path) -> str:
    """The format ``--diagram`` (of ``run`` or ``runs show``) names by its suffix; else a ``SetupError`` saying which.

    Those commands have no ``--format``: unlike :func:`format_for`'s, the error names only the suffixes drawn.
    """
    try:
        return format_for(str(path), None)
    except ValueError:
        suffixes = ", ".join(f".{suffix}" for suffix in FORMATS.values())
        msg = f"--diagram {path}: cannot tell the format from its suffix; give a file ending in {suffixes}"
        raise SetupError(msg) from None


def draw_run(table: Table, result: RunResult, path: Path) -> str:
    """``--diagram``: ``result``'s path over ``table`` to ``path`` (format from its suffix); the line to show.

    A ``SetupError`` naming ``--diagram`` if it cannot be drawn or written.
    """
    try:
        return written_line(path, write_diagram(table, result, path))
    except ValueError as exc:
        msg = f"--diagram: {exc}"
        raise SetupError(msg) from None
    except OSError as exc:
        msg = f"cannot write --diagram: {exc}"
        raise SetupError(msg) from None


def _to_stdout(table: Table, fmt: str, result: RunResult | None, compact: bool) -> int:
    text = draw(table, result, fmt, compact)
    if fmt not in PICTURES:
        sys.stdout.write(text)
        return EXIT_DONE
    if not dot_installed():
        print(f"error: cannot draw {fmt} without Graphviz's dot; {INSTALL_HINT}", file=sys.stderr)
        return EXIT_SETUP
    sys.stdout.buffer.write(render(text, fmt))
    return EXIT_DONE


def _write(table: Table, fmt: str | None, out: str | None, result: RunResult | None, compact: bool) -> int:
    if fmt is None:  # every file, the compact drawing among them
        for path in write_all(table):
            print(f"wrote {path}")
        if not dot_installed():
            svg = DIAGRAM_DIR / f"{NAME}.svg"
            print(f"{svg} not drawn: Graphviz's dot is not installed; {INSTALL_HINT}", file=sys.stderr)
        return EXIT_DONE
    if out == "-":
        return _to_stdout(table, fmt, result, compact)
    stem = f"{NAME}_compact" if compact else NAME
    asked = Path(out) if out is not None else DIAGRAM_DIR / f"{stem}.{FORMATS[fmt]}"
    written = write_diagram(table, result, asked, fmt, compact=compact)
    print(written_line(asked, written), file=sys.stdout if written == asked else sys.stderr)
    return EXIT_DONE


ALL_BLOCKS = (*BLOCKS, "cli", "proof")
"""Every block ``--update-readme`` and ``--update-docs`` fill: the table's, ``cli`` (the command-line reference)
and ``proof`` (what ``check`` proves of an agent with the default settings)."""


def pages_to_update(files: list[Path], directories: list[Path]) -> list[Path]:
    """``files`` and each Markdown page under ``directories`` that marks a rendered block, in a stable order.

    A page without blocks is skipped in a directory, but a directory with no
    such page, or a file without one, is a ``ValueError`` naming it.
    """
    pages = list(files)
    for directory in directories:
        if not directory.is_dir():
            msg = f"{directory}: not a directory"
            raise ValueError(msg)
        found = [p for p in sorted(directory.rglob("*.md")) if marked(p.read_text(encoding="utf-8"), ALL_BLOCKS)]
        if not found:
            msg = f"{directory}: no page under it has a rendered block ({', '.join(ALL_BLOCKS)})"
            raise ValueError(msg)
        pages += found
    return list(dict.fromkeys(pages))


def filled_pages(table: Table, pages: list[Path]) -> dict[Path, str]:
    """The new text of each of ``pages`` whose rendered blocks change; a page at fault is a ``ValueError`` naming it.

    The README and the docs show the compact picture, which stays legible at
    page width; the ``.mmd`` file is whole.
    """
    from fsm_agent.proof.report import proof_block  # the checker reads an agent; only this command needs it

    blocks = render_blocks(table, to_mermaid(table, compact=True)) | {
        "cli": cli_reference(),
        "proof": proof_block(table),
    }
    changed: dict[Path, str] = {}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        try:
            new = fill(text, blocks)
        except ValueError as exc:
            msg = f"{page}: {exc}"
            raise ValueError(msg) from exc
        if new != text:
            changed[page] = new
    return changed


def main(args: argparse.Namespace) -> int:
    """Write the diagram(s) the options ask for (and the pages' blocks with ``--update-*``); exit 0 or 1.

    Every page is filled before anything is written, so a page at fault
    (no block, or half of one) leaves every file as it was.  A missing
    ``dot`` is not an error: the DOT text is the diagram's source and still
    gets written, with one line on installing Graphviz.
    """
    out: str | None = args.out
    try:
        table = load_table(args.table)
        result = None if args.run is None else load_run(args.run)
        if result is not None and args.format is None and out is None:
            out = str(Path(args.run).with_suffix(".svg"))
        fmt = None if args.format is None and out is None else format_for(out, args.format)
        if result is not None:
            diagram_edges(table, result)  # a trace from another table is reported here, not half-drawn
        changed = filled_pages(table, pages_to_update(args.update_readme, args.update_docs))
    except (ValueError, TypeError, ImportError, AttributeError, OSError) as exc:
        print(f"error: diagram: {exc}", file=sys.stderr)
        return EXIT_SETUP
    try:
        code = _write(table, fmt, out, result, args.compact)
        for page, text in changed.items() if code == EXIT_DONE else ():
            page.write_text(text, encoding="utf-8")
            print(f"updated the rendered blocks of {page}")
    except OSError as exc:
        print(f"error: diagram: could not write: {exc}", file=sys.stderr)
        return EXIT_SETUP
    return code


def add_command(commands: Any) -> None:
    """Register ``python -m fsm_agent diagram``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "diagram",
        help="draw the state machine (DOT, SVG, PNG or Mermaid)",
        description="Without options, write diagrams/agent_loop.dot, .mmd, agent_loop_compact.dot and "
        "(with Graphviz) their .svg under the current directory, and nothing else.",
    )
    parser.add_argument("--format", choices=list(FORMATS), help="one output format (default: dot, mermaid and svg)")
    parser.add_argument("--out", help="output path, '-' for stdout (default: diagrams/agent_loop.<suffix>)")
    parser.add_argument(
        "--table",
        default="fsm_agent:TABLE",
        help="module:attribute of the Table (or Agent) to draw (default: %(default)s)",
    )
    parser.add_argument(
        "--run",
        help="draw this run's path: a RunResult JSON (--trace of `run`) or a JSON Lines log (default out: RUN.svg)",
    )
    parser.add_argument(
        "--compact",
        action="store_true",
        help="fold each state's stops (and finalize edges) into one labelled edge, for small pages",
    )
    blocks = ", ".join(ALL_BLOCKS)
    parser.add_argument(
        "--update-readme",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help=f"also rewrite the rendered blocks FILE has ({blocks}: between <!-- NAME:start --> and "
        "<!-- NAME:end --> lines) from the table; repeatable",
    )
    parser.add_argument(
        "--update-docs",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="the same for every Markdown page under DIR that has a rendered block; repeatable (`make diagram`)",
    )
    parser.set_defaults(handler=main)
