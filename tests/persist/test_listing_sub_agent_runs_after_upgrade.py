"""A store written before runs were listed by parent upgrades on first use and lists the sub-agent runs it held.

The contract of ``list_runs(parent=...)`` is checked by the conformance suite
on both stores (``fsm_agent.testing.store_children``, run by
``TestBundledStores``); what is here is each bundled store's upgrade: a
database turned back into the previous schema version (the new columns and
index dropped, the version set back), holding a parent, its sub-agent runs
and their own, a run whose base is not JSON, and, written after the upgrade
as a worker of the previous version still running writes it, a sub-agent run
without the link columns.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.pg_cluster import Cluster

from fsm_agent.persist import SqliteStore, open_store
from fsm_agent.testing.store_children import PARENT, family
from fsm_agent.testing.store_kit import adding_agent

CHILDREN = {f"{PARENT}/h0": (PARENT, "h0"), f"{PARENT}/h1": (PARENT, "h1")}
OLD_WORKER = (
    "INSERT INTO {runs} (run_id, state, reason, paused, updated, steps, tokens, seq, base_seq, snapshot, created)"
    " SELECT 'boss/h9', state, reason, paused, updated, steps, tokens, 1, 1,"
    " replace(replace(snapshot, '\"boss/h0\"', '\"boss/h9\"'), '\"h0\"', '\"h9\"'), created"
    " FROM {runs} WHERE run_id = 'boss/h0'"
)
"""An insert as the previous version's ``put`` writes it (no link columns): a copy of ``boss/h0`` made for call h9."""


def _linked(store: Any, parent: str = PARENT) -> dict[str, Any]:
    return {run.run_id: run.parent for run in store.list_runs(parent=parent)}


def _filled(store: Any) -> None:
    """The family (boss, two children, a grandchild each), a run of no call's, and a base that is no JSON at all."""
    family(store)
    adding_agent(1).run("add", store=store, run_id="alone")


def _checked_after_upgrade(store: Any) -> None:
    assert _linked(store) == CHILDREN
    assert _linked(store, f"{PARENT}/h1") == {f"{PARENT}/h1/d0": (f"{PARENT}/h1", "d0")}
    assert {run.run_id: run.parent for run in store.list_runs()}["alone"] is None
    assert _linked(store, "broken") == {}, "a base that is not JSON was linked"


def _old_worker_child_listed_once_written_again(store: Any, insert: Any) -> None:
    """A child an old worker inserts is not listed by parent; once this version claims it, it is."""
    insert()
    assert _linked(store) == CHILDREN, "a run without link columns listed by parent"
    data = store.load(f"{PARENT}/h9")
    assert (data["parent_run_id"], data["parent_call_id"]) == (PARENT, "h9")
    store.renew(f"{PARENT}/h9", owner="new", seq=store.claim(f"{PARENT}/h9", data, owner="new"), release=True)
    assert _linked(store) == {**CHILDREN, f"{PARENT}/h9": (PARENT, "h9")}


def _as_version_5(path: Path) -> None:
    """Turn a current store file back into one written before runs were listed by parent (schema version 5)."""
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX runs_by_parent")
        db.execute("ALTER TABLE runs DROP COLUMN parent")
        db.execute("ALTER TABLE runs DROP COLUMN parent_call")
        db.execute("ALTER TABLE runs DROP COLUMN start_id")
        db.execute("UPDATE runs SET snapshot = '{\"parent_run_id\": \"boss\", not json' WHERE run_id = 'alone'")
        db.execute(
            "INSERT INTO runs SELECT 'broken/x', state, reason, paused, updated, '{\"parent_run_id\": "
            '"broken", "parent_call_id": "x"\' || \' trailing\', steps, tokens, seq, base_seq, owner,'
            " lease_until, session, forked_from, forked_at, created FROM runs WHERE run_id = 'boss'"
        )
        db.execute("PRAGMA user_version = 5")
    db.close()


def test_a_sqlite_file_from_before_the_parent_listing_lists_the_sub_agent_runs_it_held(tmp_path: Path) -> None:
    """Version 5 gains ``parent`` and ``parent_call`` from each base on open; bases that are not JSON stay unlinked."""
    path = tmp_path / "old.db"
    with SqliteStore(path) as store:
        _filled(store)
    _as_version_5(path)
    with SqliteStore(path) as store:
        _checked_after_upgrade(store)
        assert {run.run_id for run in store.list_runs()} >= {"alone", "broken/x"}, "an unreadable base was dropped"

        def insert() -> None:
            with sqlite3.connect(path) as db:
                db.execute(OLD_WORKER.format(runs="runs"))
            db.close()

        _old_worker_child_listed_once_written_again(store, insert)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 7
        assert "runs_by_parent" in {row[1] for row in db.execute("PRAGMA index_list(runs)")}
    db.close()


@pytest.mark.postgres
def test_a_postgres_database_from_before_the_parent_listing_lists_the_sub_agent_runs_it_held(
    postgres_cluster: Cluster,
) -> None:
    """At schema version 4, the runs gain their link on first use, read from each base as jsonb where it is JSON."""
    import psycopg

    from fsm_agent.persist.postgres import SCHEMA_VERSION

    dsn = postgres_cluster.new_database(f"before_parent_{uuid.uuid4().hex[:8]}")
    with open_store(dsn) as store:
        _filled(store)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP INDEX fsm_agent_runs_by_parent")
        conn.execute("ALTER TABLE fsm_agent_runs DROP COLUMN parent, DROP COLUMN parent_call, DROP COLUMN start_id")
        conn.execute("DELETE FROM fsm_agent_schema WHERE version >= 5")
        conn.execute(
            "UPDATE fsm_agent_runs SET snapshot = '{\"parent_run_id\": \"boss\", not json' WHERE run_id = 'alone'"
        )
        conn.execute(  # jsonb takes no NUL: a base that escapes one is left unlinked, not the upgrade failed
            "INSERT INTO fsm_agent_runs SELECT 'broken/x', state, reason, paused, updated, steps, tokens, seq,"
            ' base_seq, owner, lease_until, \'{"parent_run_id": "broken", "parent_call_id": "x",'
            ' "text": "a\\u0000b"}\', session, forked_from, forked_at, created'
            " FROM fsm_agent_runs WHERE run_id = 'boss'"
        )
    with open_store(dsn) as store:
        _checked_after_upgrade(store)

        def insert() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(OLD_WORKER.format(runs="fsm_agent_runs"))

        _old_worker_child_listed_once_written_again(store, insert)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT max(version) FROM fsm_agent_schema").fetchone()[0] == SCHEMA_VERSION == 6
        indexes = {row[0] for row in conn.execute("SELECT indexname FROM pg_indexes")}
        assert "fsm_agent_runs_by_parent" in indexes
