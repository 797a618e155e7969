"""A snapshot read before its run was deleted resumes nothing once another run is started under the same id.

A run deleted and started again under its id counts its versions from 1
again, so a snapshot of the deleted run (a worker still holding it, after
``runs prune`` and a batch rerun deriving the same id) names a version of
the new run.  The store checks the run's start (``start_id``) with the
version: the resume is a ``StaleRunError``, the new run stays as it is, and
the deleted run's owed call is not made.  A store from before the check
learns each run's start from its snapshot when it is opened.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.pg_cluster import Cluster

from fsm_agent import Agent, Message, ModelResponse, StaleRunError, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn


class Mailer:
    """Mails the person the question names, then says so; decides from the messages alone."""

    def complete(self, messages: Sequence[Message], tools: Any) -> ModelResponse:
        who = next(message.content for message in messages if message.role == "user")
        if any(message.role == "tool" for message in messages):
            return reply(f"mailed {who}")
        return tool_turn(tool_call("send", id="s1", to=who))


def _agent(sent: Counter[str]) -> Agent:
    tools = ToolRegistry()

    @tools.register
    def send(to: str) -> str:
        """Send a mail: the side effect counted."""
        sent[to] += 1
        return f"sent to {to}"

    return Agent(Mailer(), tools, approve={"send"})


def _paused(sent: Counter[str], who: str, store: Any) -> None:
    """A run that mails ``who`` once a person approves: paused before its send."""
    assert _agent(sent).run(who, store=store, run_id="mail").reason == "paused"


def _resumed(sent: Counter[str], held: dict[str, Any], store: Any, driver: str) -> None:
    """``held`` resumed with its send approved."""
    if driver == "sync":
        _agent(sent).resume(held, store=store, approvals={"s1": True})
    else:
        asyncio.run(_agent(sent).aresume(held, store=store, approvals={"s1": True}))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_snapshot_of_a_deleted_run_is_stale_for_the_run_started_again(store_target: str, driver: str) -> None:
    sent: Counter[str] = Counter()
    with open_store(store_target) as store:
        _paused(sent, "ada", store)
        held = store.load("mail")  # a worker keeps this while the run is pruned
        assert store.delete("mail")
        _paused(sent, "bob", store)
        bobs = store.load("mail")
        assert bobs["stored_seq"] == held["stored_seq"]  # the versions alone cannot tell the two runs apart
        with pytest.raises(StaleRunError, match="deleted and started again"):
            _resumed(sent, held, store, driver)
        assert store.load("mail") == bobs
        assert sent == Counter()  # the deleted run's approved send was not made
        assert _agent(sent).resume(bobs, store=store, approvals={"s1": True}).finish().final == "mailed bob"
        assert sent == Counter({"bob": 1})


def _deleted_and_started_again_refuses_the_old_snapshot(sent: Counter[str], store: Any) -> None:
    """Ada's paused run deleted and bob's started under its id: ada's snapshot resumes nothing, sends nothing."""
    held = store.load("mail")
    assert store.delete("mail")
    _paused(sent, "bob", store)
    with pytest.raises(StaleRunError):
        _resumed(sent, held, store, "sync")
    assert sent == Counter()


def test_a_sqlite_file_from_before_the_check_learns_each_runs_start_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    sent: Counter[str] = Counter()
    with open_store(str(path)) as store:
        _paused(sent, "ada", store)
        start = store.load("mail")["start_id"]
    with sqlite3.connect(path) as db:  # turned back into a file of schema version 6
        db.execute("ALTER TABLE runs DROP COLUMN start_id")
        db.execute("PRAGMA user_version = 6")
    db.close()
    with open_store(str(path)) as store:
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == 7
            assert db.execute("SELECT start_id FROM runs").fetchone()[0] == start  # learnt on opening
        db.close()
        _deleted_and_started_again_refuses_the_old_snapshot(sent, store)


@pytest.mark.postgres
def test_a_postgres_database_from_before_the_check_learns_each_runs_start(postgres_cluster: Cluster) -> None:
    import psycopg

    dsn = postgres_cluster.new_database(f"before_start_{uuid.uuid4().hex[:8]}")
    sent: Counter[str] = Counter()
    with open_store(dsn) as store:
        _paused(sent, "ada", store)
        start = store.load("mail")["start_id"]
    with psycopg.connect(dsn, autocommit=True) as conn:  # turned back into a database of schema version 5
        conn.execute("ALTER TABLE fsm_agent_runs DROP COLUMN start_id")
        conn.execute("DELETE FROM fsm_agent_schema WHERE version >= 6")
    with open_store(dsn) as store:
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT start_id FROM fsm_agent_runs").fetchone()[0] == start  # learnt on opening
        _deleted_and_started_again_refuses_the_old_snapshot(sent, store)


def _stale_start_column(target: str) -> None:
    """Leave the run's ``start_id`` column at another start, as an older worker's overwrite (which writes no start)
    leaves it under the snapshot it writes."""
    if target.startswith("postgresql"):
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("UPDATE fsm_agent_runs SET start_id = 'an-earlier-start' WHERE run_id = 'mail'")
        return
    with sqlite3.connect(target) as db:
        db.execute("UPDATE runs SET start_id = 'an-earlier-start' WHERE run_id = 'mail'")
    db.close()


def test_a_start_column_an_older_worker_left_stale_refuses_no_resume_of_the_run_it_holds(store_target: str) -> None:
    sent: Counter[str] = Counter()
    with open_store(store_target) as store:
        _paused(sent, "ada", store)
        assert _agent(sent).run("bob", store=store, run_id="mail", overwrite=True).reason == "paused"
        _stale_start_column(store_target)
        held = store.load("mail")
        assert _agent(sent).resume(held, store=store, approvals={"s1": True}).finish().final == "mailed bob"
    assert sent == Counter({"bob": 1})
