"""A fork's origin in a store's listing: its own columns, on both stores, and a store file from before forks."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest
from support.pg_cluster import Cluster
from support.store_cases import tick_agent

from fsm_agent.persist import SqliteStore, open_store
from fsm_agent.persist.recording import RecordingError, read_recording
from fsm_agent.persist.summary import Summary, fork_origin


def forked_snapshot(run_id: str, source: str, at: int) -> dict[str, object]:
    """A finished run's snapshot as a fork of ``source`` at transition ``at`` would carry it."""
    run = tick_agent(2).start("go", run_id=run_id)
    run.finish()
    return json.loads(json.dumps({**run.snapshot(), "forked_from": [source, at]}))


def test_a_fork_s_origin_round_trips_through_the_listing(store_target: str) -> None:
    """A fork lists (source, at) and a run that is no fork None, on SQLite and PostgreSQL, saved or forked."""
    with open_store(store_target) as store:
        tick_agent(2).run("go", store=store, run_id="source")
        store.save("fork", forked_snapshot("fork", "source", 2))
        tick_agent(2).fork("source", 3, store=store, run_id="forked").finish()
        listed = {run.run_id: run.forked_from for run in store.list_runs()}
        assert listed == {"source": None, "fork": ("source", 2), "forked": ("source", 3)}
        assert store.load("fork")["forked_from"] == ["source", 2]


def test_a_fork_s_recording_names_its_source_and_a_recording_s_bad_origin_is_refused(store_target: str) -> None:
    """``export`` of a fork keeps ``forked_from``; a run that is no fork has none; a malformed one is named."""
    with open_store(store_target) as store:
        tick_agent(2).run("go", store=store, run_id="source")
        tick_agent(2).fork("source", 3, store=store, run_id="forked").finish()
        recording, source = store.export("forked"), store.export("source")
    assert read_recording(recording)["forked_from"] == ["source", 3]
    assert "forked_from" not in source
    with pytest.raises(RecordingError, match=r"forked_from must be \[source run id or null, transition index\]"):
        read_recording({**recording, "forked_from": ["source", "3"]})


@pytest.mark.parametrize(
    ("value", "origin"),
    [
        (["src", 0], ("src", 0)),
        (("src", 7), ("src", 7)),
        (None, None),
        (["src"], None),
        (["", 1], None),
        (["src", -1], None),
        (["src", True], None),
        (["src", "3"], None),
        ("src", None),
    ],
)
def test_only_a_run_id_and_a_transition_index_are_a_fork_s_origin(value: object, origin: object) -> None:
    """fork_origin keeps [run id, index >= 0] and lists anything else in the field as no fork."""
    assert fork_origin(value) == origin


def test_summary_of_a_fork_s_snapshot_carries_its_origin() -> None:
    """Summary.of reads forked_from, so a store's columns are filled when a fork is first written."""
    assert Summary.of(forked_snapshot("f", "s", 5)).forked_from == ("s", 5)


def _as_version_3(path: Path) -> None:
    """Turn a current store file back into one written before forks (schema version 3, no fork or created columns)."""
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE runs DROP COLUMN forked_from")
        db.execute("ALTER TABLE runs DROP COLUMN forked_at")
        db.execute("DROP INDEX runs_by_created")
        db.execute("ALTER TABLE runs DROP COLUMN created")
        db.execute("DROP INDEX runs_by_parent")
        db.execute("ALTER TABLE runs DROP COLUMN parent")
        db.execute("ALTER TABLE runs DROP COLUMN parent_call")
        db.execute("ALTER TABLE runs DROP COLUMN start_id")
        db.execute("PRAGMA user_version = 3")
    db.close()


def test_a_store_file_from_before_forks_is_migrated_without_reading_a_snapshot(tmp_path: Path) -> None:
    """A version-3 file gains the columns on open: its runs list as no fork (their snapshots unread), forks list."""
    path = tmp_path / "old.db"
    with SqliteStore(path) as store:
        tick_agent(2).run("go", store=store, run_id="old")
    _as_version_3(path)
    with sqlite3.connect(path) as db:  # a listing that read the snapshot would fail on this text
        db.execute("UPDATE runs SET snapshot = 'not a snapshot' WHERE run_id = 'old'")
    db.close()
    with SqliteStore(path) as store:
        assert [(run.run_id, run.state, run.forked_from) for run in store.list_runs()] == [("old", "Done", None)]
        store.save("fork", forked_snapshot("fork", "old", 1))
        assert {run.run_id: run.forked_from for run in store.list_runs()} == {"old": None, "fork": ("old", 1)}
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 7
        assert {"forked_from", "forked_at"} <= {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    db.close()


@pytest.mark.postgres
def test_a_postgres_database_from_before_forks_is_migrated(postgres_cluster: Cluster) -> None:
    """A database at schema version 2 gains the fork columns on first use; its runs list as no fork."""
    import psycopg

    from fsm_agent.persist.postgres import SCHEMA_VERSION

    dsn = postgres_cluster.new_database(f"before_forks_{uuid.uuid4().hex[:8]}")
    with open_store(dsn) as store:
        tick_agent(2).run("go", store=store, run_id="old")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE fsm_agent_runs DROP COLUMN forked_from, DROP COLUMN forked_at, DROP COLUMN created,"
            " DROP COLUMN parent, DROP COLUMN parent_call, DROP COLUMN start_id"
        )
        conn.execute("DELETE FROM fsm_agent_schema WHERE version >= 3")
    with open_store(dsn) as store:
        assert [(run.run_id, run.forked_from) for run in store.list_runs()] == [("old", None)]
        store.save("fork", forked_snapshot("fork", "old", 3))
        assert {run.run_id: run.forked_from for run in store.list_runs()} == {"old": None, "fork": ("old", 3)}
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT max(version) FROM fsm_agent_schema").fetchone()[0] == SCHEMA_VERSION == 6
