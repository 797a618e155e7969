"""Paging a store's runs by cursor: the cursor's text, its refusals, the creation time a run keeps, the migrations.

The contract itself (each run once across pages while runs are added and
saved, the order) is checked by the conformance suite on both stores
(``TestBundledStores`` in test_stores.py); what is here is the cursor's own
rules and what each bundled store does to record creation times.
"""

from __future__ import annotations

import math
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.pg_cluster import Cluster
from support.store_cases import tick_agent

from fsm_agent.persist import SqliteStore, StoredRun, open_store
from fsm_agent.persist.cursor import RunCursor, check_listing
from fsm_agent.testing.store_kit import adding_agent, fresh_snapshot

IDS = ["r", "a:b:c", "1.5:x", " spaced ", "é/😀", "x" * 1024]
TIMES = [0.0, 1796438471.1890867, 1e-7, -3.25, 1e16, 1712345678.000001]


@pytest.mark.parametrize("run_id", IDS)
@pytest.mark.parametrize("created", TIMES)
def test_a_cursor_s_text_reads_back_as_the_very_same_cursor(run_id: str, created: float) -> None:
    """``RunCursor.parse(str(cursor)) == cursor``: a colon in the id, any time Python writes; the float to the bit."""
    cursor = RunCursor(created, run_id)
    again = RunCursor.parse(str(cursor))
    assert again == cursor
    assert math.copysign(1, again.created) == math.copysign(1, created)
    assert again.created.hex() == float(created).hex()


@pytest.mark.parametrize(
    "text",
    ["", "r1", "1.5", ":r1", "1.5:", "nan:r1", "inf:r1", "-inf:r1", "1e999:r1", " 1.5:r1", "1_5:r1", "0x1p3:r"],
)
def test_text_that_is_no_cursor_is_a_value_error_saying_what_a_cursor_is(text: str) -> None:
    """A time that is no finite number as Python writes one, or no run id after the colon: refused, saying so."""
    with pytest.raises(ValueError, match=r"a run cursor is '<created>:<run id>'|RunCursor run_id"):
        RunCursor.parse(text)


def test_a_cursor_is_refused_naming_the_field_no_store_could_page_by() -> None:
    """No finite time, no run id a store could hold, a run listed without its time: each refused by name."""
    for created in (math.nan, math.inf, True, "1.5"):
        with pytest.raises(ValueError, match="RunCursor created must be a finite number"):
            RunCursor(created, "r")  # type: ignore[arg-type]
    for run_id, error in (("", ValueError), ("a\x00b", ValueError), ("x" * 1025, ValueError), (5, TypeError)):
        with pytest.raises(error, match="RunCursor run_id"):
            RunCursor(1.0, run_id)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a run cursor's text must be a str, got int"):
        RunCursor.parse(5)  # type: ignore[arg-type]
    untimed = StoredRun("r", "Done", "done", False, 1.0)
    with pytest.raises(ValueError, match="run 'r' was listed without its creation time"):
        RunCursor.of(untimed)
    assert RunCursor.of(StoredRun("r", "Done", "done", False, 2.0, created=1.0)) == RunCursor(1.0, "r")


def test_a_listing_s_order_cursor_and_offset_are_checked_together() -> None:
    """check_listing: the orders there are, a cursor for the creation order only, and never with an offset."""
    cursor = RunCursor(1.0, "r")
    assert check_listing("updated", None, 5) == ("updated", None)
    assert check_listing("created", cursor, 0) == ("created", cursor)
    with pytest.raises(ValueError, match="list_runs order must be one of 'updated', 'created', got 'started'"):
        check_listing("started", None, 0)
    with pytest.raises(TypeError, match=r"list_runs after must be a RunCursor or None, got str \(RunCursor.parse"):
        check_listing("created", "1.0:r", 0)
    with pytest.raises(ValueError, match="list_runs after pages the creation order: pass order='created'"):
        check_listing("updated", cursor, 0)
    with pytest.raises(ValueError, match="list_runs takes after or offset, not both"):
        check_listing("created", cursor, 3)


def _created(store: Any, run_id: str) -> float:
    (run,) = [run for run in store.list_runs(order="created") if run.run_id == run_id]
    assert run.created is not None
    return run.created


def test_a_run_keeps_its_creation_time_through_every_write_and_a_new_run_of_its_id_gets_a_new_one(
    store_target: str,
) -> None:
    """Appends, a save, a claim, an overwrite, a decision: created stays; deleted and started again: it moves on."""
    with open_store(store_target) as store:
        adding_agent(1, approve={"add"}).run("add", store=store, run_id="paused")
        made = _created(store, "paused")
        store.decide("paused", "c0", True)
        store.save("paused", store.load("paused"))
        store.renew("paused", owner="B", seq=store.claim("paused", store.load("paused"), owner="B"), release=True)
        store.create("paused", fresh_snapshot("paused", "again"), owner="B", overwrite=True)
        assert _created(store, "paused") == made
        assert store.list_runs()[0].updated > made
        store.delete("paused")
        time.sleep(0.01)
        store.create("paused", fresh_snapshot("paused"), owner="C")
        assert _created(store, "paused") > made


def _as_version_4(path: Path) -> None:
    """Turn a current store file back into one written before creation times (schema version 4)."""
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX runs_by_created")
        db.execute("ALTER TABLE runs DROP COLUMN created")
        db.execute("DROP INDEX runs_by_parent")
        db.execute("ALTER TABLE runs DROP COLUMN parent")
        db.execute("ALTER TABLE runs DROP COLUMN parent_call")
        db.execute("ALTER TABLE runs DROP COLUMN start_id")
        db.execute("PRAGMA user_version = 4")
    db.close()


def test_a_store_file_from_before_creation_times_lists_its_runs_by_their_last_save_then_new_runs_first(
    tmp_path: Path,
) -> None:
    """A version-4 file gains ``created`` on open, set to each run's last save; a run started after lists first."""
    path = tmp_path / "old.db"
    with SqliteStore(path) as store:
        for run_id in ("second", "first"):
            tick_agent(1).run("go", store=store, run_id=run_id)
        store.save("second", store.load("second"))  # saved last: before the upgrade, the latest
        saved = {run.run_id: run.updated for run in store.list_runs()}
    _as_version_4(path)
    with SqliteStore(path) as store:
        listed = store.list_runs(order="created")
        assert [(run.run_id, run.created) for run in listed] == [("second", saved["second"]), ("first", saved["first"])]
        tick_agent(1).run("go", store=store, run_id="new")
        assert [run.run_id for run in store.list_runs(order="created")] == ["new", "second", "first"]
        after = RunCursor.of(store.list_runs(order="created", limit=2)[-1])
        assert [run.run_id for run in store.list_runs(order="created", after=after)] == ["first"]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 7
        assert "runs_by_created" in {row[1] for row in db.execute("PRAGMA index_list(runs)")}
    db.close()


@pytest.mark.postgres
def test_a_postgres_database_from_before_creation_times_is_migrated(postgres_cluster: Cluster) -> None:
    """At schema version 3, the runs gain ``created`` = their last save on first use; an old worker's insert a time."""
    import psycopg

    from fsm_agent.persist.postgres import SCHEMA_VERSION

    dsn = postgres_cluster.new_database(f"before_created_{uuid.uuid4().hex[:8]}")
    with open_store(dsn) as store:
        tick_agent(1).run("go", store=store, run_id="old")
        saved = store.list_runs()[0].updated
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE fsm_agent_runs DROP COLUMN created, DROP COLUMN parent, DROP COLUMN parent_call,"
            " DROP COLUMN start_id"
        )
        conn.execute("DELETE FROM fsm_agent_schema WHERE version >= 4")
    with open_store(dsn) as store:
        assert [(run.run_id, run.created) for run in store.list_runs(order="created")] == [("old", saved)]
        tick_agent(1).run("go", store=store, run_id="new")
        assert [run.run_id for run in store.list_runs(order="created")] == ["new", "old"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT max(version) FROM fsm_agent_schema").fetchone()[0] == SCHEMA_VERSION == 6
        before = time.time()
        conn.execute(  # as a worker of the version before still running inserts: no created column named
            "INSERT INTO fsm_agent_runs (run_id, state, reason, paused, updated, steps, tokens, seq, base_seq,"
            " snapshot) SELECT 'by an old worker', state, reason, paused, updated, steps, tokens, 1, 1, snapshot"
            " FROM fsm_agent_runs WHERE run_id = 'old'"
        )
        (created,) = conn.execute("SELECT created FROM fsm_agent_runs WHERE run_id = 'by an old worker'").fetchone()
        assert before - 60 < created < time.time() + 60, "the server's clock stands in for an old worker's run"
