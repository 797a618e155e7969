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


def test_the_coverage_line_and_report_on_the_page_count_the_tables_rows() -> None:
    page = PAGE.read_text(encoding="utf-8")
    line = re.search(r"rows taken (\d+)/(\d+) \(([\d.]+)%\)", page)
    assert line is not None
    taken, rows, percent = int(line.group(1)), int(line.group(2)), float(line.group(3))
    assert rows == len(TABLE.rows)
    assert percent == round(100 * taken / rows, 1)
    totals = re.search(r'"totals": (\{[^}]*\})', page)
    assert totals is not None
    report = json.loads(totals.group(1))
    assert report["rows"] == len(TABLE.rows)
    assert report["percent"] == round(100 * report["rows_taken"] / report["rows"], 1)
