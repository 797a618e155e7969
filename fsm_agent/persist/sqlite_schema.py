"""The SQLite store's schema: each version's statements, and the columns a file of this version has.

Apart from ``SqliteStore`` (``persist/sqlite.py``), which brings a file
to ``SCHEMA_VERSION`` when it opens it: what the tables are, and how each
version got there, read apart from how the store uses them.
"""

from __future__ import annotations

SCHEMA_VERSION = 7

V1 = (
    "CREATE TABLE runs (run_id TEXT PRIMARY KEY, state TEXT NOT NULL, reason TEXT,"
    " paused INTEGER NOT NULL, updated REAL NOT NULL, snapshot TEXT NOT NULL)"
)
V2 = (
    "ALTER TABLE runs ADD COLUMN steps INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE runs ADD COLUMN tokens INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE runs ADD COLUMN seq INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE runs ADD COLUMN base_seq INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE runs ADD COLUMN owner TEXT",
    "ALTER TABLE runs ADD COLUMN lease_until REAL",
    "CREATE TABLE journal (run_id TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL,"
    " PRIMARY KEY (run_id, seq)) WITHOUT ROWID",
    "CREATE INDEX runs_by_updated ON runs (updated)",
)
V3 = (
    "ALTER TABLE runs ADD COLUMN session TEXT",
    "CREATE INDEX runs_by_session ON runs (session, updated)",
)
V4 = (
    "ALTER TABLE runs ADD COLUMN forked_from TEXT",
    "ALTER TABLE runs ADD COLUMN forked_at INTEGER",
)
V5 = (
    # The default is for the ALTER (SQLite adds no NOT NULL column without a constant one): every insert of this
    # version sets ``created``; one of an older version's process still running lists its run as the oldest.
    "ALTER TABLE runs ADD COLUMN created REAL NOT NULL DEFAULT 0",
    "UPDATE runs SET created = updated",
    "CREATE INDEX runs_by_created ON runs (created, run_id)",
)
_LINK = " AND ".join(
    f"json_type(snapshot, '$.{name}') = 'text' AND json_extract(snapshot, '$.{name}') <> ''"
    for name in ("parent_run_id", "parent_call_id")
)
"""Where a run's base names its parent run and call, each as text, not empty (``summary.parent_link``)."""
V6 = (
    # A worker of an older version still running inserts no link: its sub-agent runs are not listed by parent
    # until a worker of this version writes them whole again (a claim, a save); the viewer loads those a run's
    # steps name, but cannot see one still in flight.
    "ALTER TABLE runs ADD COLUMN parent TEXT",
    "ALTER TABLE runs ADD COLUMN parent_call TEXT",
    # A run's link is written when it is created and never changes, so its base snapshot holds it.  Only a base
    # that names one is parsed (one that is not JSON is left unlinked, not the upgrade failed; CASE runs the check
    # first, which AND does not promise).
    "UPDATE runs SET parent = json_extract(snapshot, '$.parent_run_id'),"
    " parent_call = json_extract(snapshot, '$.parent_call_id')"
    f" WHERE instr(snapshot, 'parent_run_id') > 0 AND CASE WHEN json_valid(snapshot) THEN {_LINK} ELSE 0 END",
    "CREATE INDEX runs_by_parent ON runs (parent, updated)",
)
V7 = (
    # A worker of an older version still running inserts no start: a version it writes is checked as before, by its
    # number alone, until a worker of this version writes the run whole again.  A run's start is in its base.
    "ALTER TABLE runs ADD COLUMN start_id TEXT",
    "UPDATE runs SET start_id = json_extract(snapshot, '$.start_id') WHERE instr(snapshot, 'start_id') > 0"
    " AND CASE WHEN json_valid(snapshot) THEN json_type(snapshot, '$.start_id') = 'text' ELSE 0 END",
)
COLUMNS = {
    *("run_id", "state", "reason", "paused", "updated", "snapshot", "steps", "tokens", "seq", "base_seq", "owner"),
    *("session", "forked_from", "forked_at", "created", "parent", "parent_call", "start_id"),
}
LATER = {"parent", "parent_call", "start_id"}
