"""An MkDocs hook: the test suite's stop-path coverage, as ``make test`` last wrote it, on the stop-coverage page.

``make test`` runs the suite with ``--fsm-coverage=build/fsm-coverage/report.json``,
which writes the report and its drawing (``report.svg``).  When the report
is there, the drawing becomes a file of the site beside the page and the
page's marker is replaced by the totals, the reasons and every row; when it
is not (a fresh clone, or ``make docs`` before ``make test``), by a note
saying to run ``make test`` first.  The strict build passes either way.
Like the diagrams' hook, the report is found from the directory the build
runs in, the clone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPORT = Path("build/fsm-coverage/report.json")
"""Where ``make test`` writes the report, relative to the clone."""

PAGE = "how-to/stop-coverage.md"
MARKER = "<!-- the suite's stop-path coverage -->"
DRAWING = "how-to/stop-coverage-of-the-suite.svg"
"""The drawing's path in the site: beside the page, which links it by its name."""

MISSING = """!!! note "No report yet"
    This build found no `build/fsm-coverage/report.json`. Run `make test`
    first, then `make docs`, to see the suite's stop-path coverage here.
"""


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the report's drawing to the site, beside the page, when ``make test`` wrote one."""
    drawing = REPORT.resolve().with_suffix(".svg")
    if REPORT.resolve().is_file() and drawing.is_file():
        files.append(File.generated(config, DRAWING, abs_src_path=str(drawing)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Replace the page's marker by the report (or by a note that there is none)."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        msg = f"{PAGE} lost its marker {MARKER!r}: the suite's coverage has nowhere to go"
        raise ValueError(msg)
    try:
        report = json.loads(REPORT.resolve().read_text(encoding="utf-8"))
    except FileNotFoundError:
        return markdown.replace(MARKER, MISSING)
    drawn = files.get_file_from_path(DRAWING) is not None
    return markdown.replace(MARKER, _section(report, drawn))


def _section(report: dict[str, Any], drawn: bool) -> str:
    totals = report["totals"]
    never = ", ".join(f"`{reason}`" for reason in report["never_reached"]) or "none"
    lines = [
        f"**Rows taken: {totals['rows_taken']} of {totals['rows']} ({totals['percent']}%)**, "
        f"{totals['transitions']} transitions in all. Reasons never reached: {never}.",
        "",
    ]
    if drawn:
        name = Path(DRAWING).name
        alt = "The machine with the suite's counts: taken rows solid blue, rows never taken dashed red"
        lines += [f'[![{alt}]({name})]({name}){{ .machine-drawing title="Open the drawing at full size" }}', ""]
    lines += ["| reason | runs stopped with it |", "|---|---:|"]
    lines += [f"| `{reason}` | {count} |" for reason, count in report["reasons"].items()]
    lines += ["", "| row | trigger | taken |", "|---|---|---:|"]
    for row in report["rows"]:
        taken = str(row["taken"]) if row["taken"] else "**never**"
        lines.append(f"| `{row['id']}` | `{row['trigger']}` | {taken} |")
    return "\n".join(lines) + "\n"
