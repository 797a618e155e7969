"""Stop-path coverage: count the table rows runs take, and report them per row and per stop reason.

A :class:`Recorder` counts every row any run in this process takes while it
is on (it is one of ``core.coverage_watch.WATCHERS``); :func:`coverage_report`
turns its counts into the JSON the pytest plugin writes (``pytest
--fsm-coverage``).  Coverage is measured against the built-in table,
``fsm_agent.TABLE``: its rows are all listed, taken or not, and only they
count towards the percentage.  A row of a user's stop condition (a table
built with ``with_stops`` or ``with_rows``) is listed when a run took it,
by its edge id; a row no run took cannot be seen, since a trace entry names
its row but not its table.  Runs in subprocesses, Ray workers or other
processes are not seen (pytest-xdist's workers are: the plugin adds up
their counts).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from fsm_agent.core.coverage_watch import WATCHERS
from fsm_agent.definition.table import TABLE, Table
from fsm_agent.records import Transition
from fsm_agent.testing import edge_id


class Recorder:
    """Counts the rows taken by every run in this process between :meth:`start` and :meth:`stop` (or in a ``with``).

    Runs may fire rows on several threads at once (the batch runner, a
    timeout's worker thread); a lock keeps each count exact.  Coverage off
    costs nothing here: the recorder only exists while it is on.
    """

    def __init__(self) -> None:
        self.counts: Counter[Transition] = Counter()
        self._lock = threading.Lock()

    def __call__(self, entry: Transition, times: int = 1) -> None:
        """Count one taken row (``times`` over, for counts made elsewhere: another process's)."""
        with self._lock:
            self.counts[entry] += times

    def start(self) -> None:
        """Watch every row taken from now on."""
        if self not in WATCHERS:
            WATCHERS.append(self)

    def stop(self) -> None:
        """Stop watching; the counts so far stay."""
        if self in WATCHERS:
            WATCHERS.remove(self)

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def report(self, table: Table = TABLE) -> dict[str, Any]:
        """The counts so far as :func:`coverage_report` lays them out."""
        with self._lock:
            counts = Counter(self.counts)
        return coverage_report(counts, table)


def coverage_report(counts: Mapping[Transition, int], table: Table = TABLE) -> dict[str, Any]:
    """The JSON report of ``counts`` (taken row to times taken) against ``table``.

    ``rows``: every row of ``table`` in table order (``row`` is its index),
    then each other row a run took, by id; each with ``id``, ``source``,
    ``trigger``, ``dest``, ``guard``, ``reason`` and ``taken``.  An id is the
    edge id of ``fsm_agent.testing.edge_id`` (``Dispatch->Failed[repeated_action]``);
    where two rows share one (``cancelled`` on ``start`` and on
    ``interrupted``), both get their trigger in parentheses.  ``reasons``: times
    each stop reason was reached, every reason of ``table`` listed;
    ``never_reached``: the reasons of ``table`` no run reached; ``totals``:
    rows of ``table`` and how many were taken, their ``percent``, all taken
    rows counted together (``transitions``) and the other rows seen.
    """
    own = [(index, row.entry) for index, row in enumerate(table.rows)]
    known = {entry for _, entry in own}
    # Entries are equal when they name the same row, so a count is found by the table's own entry.
    other = sorted((entry for entry in counts if entry not in known), key=lambda e: (edge_id(e), e.trigger))
    listed: list[tuple[int | None, Transition]] = [*own, *((None, entry) for entry in other)]
    names = Counter(edge_id(entry) for _, entry in listed)
    rows = [
        {
            "id": edge_id(entry) + (f" ({entry.trigger})" if names[edge_id(entry)] > 1 else ""),
            "row": index,
            "source": entry.source,
            "trigger": entry.trigger,
            "dest": entry.dest,
            "guard": entry.guard,
            "reason": entry.reason,
            "taken": counts.get(entry, 0),
        }
        for index, entry in listed
    ]
    own_reasons = [row.reason for row in table.rows if row.reason is not None]
    reasons = dict.fromkeys(own_reasons, 0)
    for _, entry in listed:
        if entry.reason is not None:
            reasons[entry.reason] = reasons.get(entry.reason, 0) + counts.get(entry, 0)
    rows_taken = sum(1 for row in rows[: len(own)] if row["taken"])
    return {
        "rows": rows,
        "reasons": reasons,
        "never_reached": [reason for reason in dict.fromkeys(own_reasons) if not reasons[reason]],
        "totals": {
            "rows": len(own),
            "rows_taken": rows_taken,
            "percent": round(100 * rows_taken / len(own), 1) if own else 100.0,
            "transitions": sum(counts.values()),
            "other_rows": len(other),
        },
    }


def taken_by_index(report: Mapping[str, Any]) -> dict[int, int]:
    """Times each row of the report's table was taken, by row index: what ``to_dot(..., taken=)`` draws."""
    return {row["row"]: row["taken"] for row in report["rows"] if row["row"] is not None}


def below(report: Mapping[str, Any], percent: float) -> bool:
    """True if fewer than ``percent`` of the table's rows were taken (compared exactly, not the rounded figure)."""
    totals = report["totals"]
    return bool(100 * totals["rows_taken"] < percent * totals["rows"])


def summary(report: Mapping[str, Any]) -> str:
    """One line for the end of a session: rows taken n/N (percent), and the reasons never reached."""
    totals = report["totals"]
    never = ", ".join(report["never_reached"]) or "none"
    others = f"; rows of users' stops taken: {totals['other_rows']}" if totals["other_rows"] else ""
    return (
        f"rows taken {totals['rows_taken']}/{totals['rows']} ({totals['percent']}%){others}; "
        f"reasons never reached: {never}"
    )
