"""docs/how-to/stop-coverage.md shows a coverage line and a report of the built-in table: their row counts are its.

The examples are shown, not run (they come from a user's session), so
nothing else notices when a new row makes them stale.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from fsm_agent import TABLE

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "stop-coverage.md"

SHOWN = "docs/how-to/stop-coverage.md"
"""The page, as the failure messages name it."""

BY_HAND = (
    "the examples there are written by hand (shown, not run), so a new row of the table leaves them stale: "
    "set their row count to len(fsm_agent.TABLE.rows) and work their percentage out again"
)


def test_the_coverage_line_and_report_on_the_page_count_the_tables_rows() -> None:
    page = PAGE.read_text(encoding="utf-8")
    line = re.search(r"rows taken (\d+)/(\d+) \(([\d.]+)%\)", page)
    assert line is not None, f"{SHOWN} no longer shows a coverage line 'rows taken N/M (P%)'"
    taken, rows, percent = int(line.group(1)), int(line.group(2)), float(line.group(3))
    assert rows == len(TABLE.rows), (
        f"{SHOWN}: its coverage line says {rows} rows, the built-in table has {len(TABLE.rows)}; {BY_HAND}"
    )
    assert percent == round(100 * taken / rows, 1), (
        f"{SHOWN}: its coverage line's {percent}% is not {taken}/{rows}; the percentage is written by hand too"
    )
    totals = re.search(r'"totals": (\{[^}]*\})', page)
    assert totals is not None, f"{SHOWN} no longer shows a report with its 'totals'"
    report = json.loads(totals.group(1))
    assert report["rows"] == len(TABLE.rows), (
        f"{SHOWN}: its report's totals say {report['rows']} rows, the built-in table has {len(TABLE.rows)}; {BY_HAND}"
    )
    assert report["percent"] == round(100 * report["rows_taken"] / report["rows"], 1), (
        f"{SHOWN}: its report's percent is not rows_taken/rows; the percentage is written by hand too"
    )
