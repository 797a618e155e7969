"""Store files and text: places that are not stores, a file from the first ``SqliteStore``, exact text in logs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.store_cases import LONE, as_json, tick_agent

import fsm_agent
from fsm_agent.persist import PostgresStore, SqliteStore, StoreError, open_store

# --- locations that are not stores -----------------------------------------------------------------------------


def test_a_text_file_is_not_a_store(tmp_path: Path) -> None:
    """Opening a text file is one StoreError naming it, and the file is left alone."""
    text = tmp_path / "notes.txt"
    text.write_text("shopping list\n" * 100, encoding="utf-8")
    with pytest.raises(StoreError, match=r"notes\.txt cannot be used as a run store"):
        SqliteStore(text)
    assert text.read_text(encoding="utf-8") == "shopping list\n" * 100


def test_a_directory_or_unwritable_place_is_not_a_store(tmp_path: Path) -> None:
    """A directory, or a file in a place nobody may write (read-only for root too: /proc), is a StoreError."""
    with pytest.raises(StoreError, match="cannot be used as a run store"):
        SqliteStore(tmp_path)
    with pytest.raises(StoreError, match="cannot be used as a run store"):
        SqliteStore("/proc/fsm-agent-runs.db")


def test_another_program_s_runs_table_is_not_a_store(tmp_path: Path) -> None:
    """An SQLite file whose runs table has other columns is refused, not written into."""
    import sqlite3

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, distance REAL)")
        db.execute("PRAGMA user_version = 2")
    db.close()
    with pytest.raises(StoreError, match="not a run store's"):
        SqliteStore(path)


def test_an_unreachable_postgres_server_is_a_store_error(unused_port: int) -> None:
    """A URL nobody answers is a StoreError naming it without its password."""
    pytest.importorskip("psycopg")
    with pytest.raises(StoreError) as info:
        PostgresStore(f"postgresql://fsm:secret@127.0.0.1:{unused_port}/x?connect_timeout=3")
    assert "[redacted]" in str(info.value)
    assert "secret" not in str(info.value)


def test_open_store_picks_the_store_from_the_url(tmp_path: Path) -> None:
    """A path opens a SqliteStore; postgresql:// and postgres:// URLs open a PostgresStore."""
    with open_store(tmp_path / "a.db") as store:
        assert isinstance(store, SqliteStore)
    with open_store(str(tmp_path / "b.db"), every="turn") as store:
        assert store.every == "turn"


@pytest.mark.subprocess
def test_import_fsm_agent_does_not_import_psycopg() -> None:
    """psycopg is an optional extra: the package and its stores import without it."""
    code = "import sys, fsm_agent, fsm_agent.persist; print('psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- a store file written before journals ---------------------------------------------------------------------

V1_FILE = Path(__file__).resolve().parents[1] / "support" / "store_files" / "sqlite_v1.db"
"""Written by the first ``SqliteStore`` (one whole snapshot per run, no schema version): a done, a stopped and a
paused run."""


def test_a_store_file_from_the_first_sqlitestore_still_loads_and_resumes(tmp_path: Path) -> None:
    """The old file is migrated on open: its runs list with steps and tokens, load, and resume into the journal."""
    path = tmp_path / "old.db"
    shutil.copyfile(V1_FILE, path)
    with SqliteStore(path) as store:
        listed = {r.run_id: (r.state, r.reason, r.paused, r.steps, r.tokens) for r in store.list_runs()}
        assert listed == {
            "done": ("Done", "done", False, 3, 15),
            "stopped": ("Failed", "max_steps", False, 1, 5),
            "paused": ("ExecuteTool", None, True, 0, 5),
        }
        assert store.load("done")["final"] == "tick: done after 2"
        agent = tick_agent(3, approve={"tick"})
        run = agent.resume(store.load("paused"), store=store, approvals={"t0": True})
        run.advance()
        assert store.load("paused") == as_json(run.snapshot())
        resumed = tick_agent(3).resume(store.load("stopped"), store=store, max_steps=4).finish()
        assert store.load("stopped")["final"] == resumed.final == "tick: done after 3"
    with SqliteStore(path) as again:  # migrated once: opening it again changes nothing
        assert len(again.list_runs()) == 3


def test_the_jsonl_log_and_trace_keep_lone_surrogates(tmp_path: Path) -> None:
    """run(log=...) writes valid UTF-8 lines that read back; the --trace JSON round-trips the exact text."""
    from fsm_agent.cli.run import trace_json
    from fsm_agent.observe.events import read_log

    log = tmp_path / "run.jsonl"
    result = tick_agent(2, text=LONE).run("go", log=log)
    lines = log.read_bytes().decode("utf-8").splitlines()
    assert json.loads(lines[0])["response"]["content"] == LONE
    assert [t.dest for t in read_log(log)] == [t.dest for t in result.trace]
    trace = tmp_path / "trace.json"
    trace.write_text(trace_json(result), encoding="utf-8")
    assert fsm_agent.RunResult.from_json(trace.read_text(encoding="utf-8")) == result
