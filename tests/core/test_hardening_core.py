"""Bad provider data and odd tools never leave a run half-done: it ends in a terminal state, stored and free."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, SnapshotError, ToolRegistry, Usage
from fsm_agent.__main__ import main as cli
from fsm_agent.core.reply_checks import MAX_NESTING
from fsm_agent.persist import is_url, open_store
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn


def _finish(agent: Agent, driver: str, **options: Any) -> AgentLoopError:
    with pytest.raises(AgentLoopError) as info:
        agent.run("q", **options) if driver == "sync" else asyncio.run(agent.arun("q", **options))
    return info.value


def _nested(levels: int) -> dict[str, Any]:
    """A dict nested ``levels`` deep (``{"a": {"a": ... {}}}``)."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_token_count_past_2_53_is_a_model_error_and_the_stored_run_ends_free(store_target: str, driver: str) -> None:
    """``Usage(2**63, 0)`` stops the run on model_error naming the field; the store holds it Failed, lease given up."""
    with open_store(store_target) as store:
        agent = Agent(FakeModel([reply("x", usage=Usage(2**63, 0)), reply("again")]), demo_registry())
        exc = _finish(agent, driver, store=store, run_id="huge")
        assert exc.reason == "model_error"
        assert "usage.input_tokens must be a whole number from 0 to 2**53 - 1" in exc.evidence["error"]
        (listed,) = store.list_runs()
        assert (listed.state, listed.reason, listed.tokens) == ("Failed", "model_error", 0)
        resumed = agent.resume(store.load("huge"), store=store, retry=True).finish()  # nobody holds it
        assert resumed.final == "again"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_tool_arguments_nested_700_deep_are_a_model_error_not_a_recursion_error(store_target: str, driver: str) -> None:
    """Valid JSON nested past the bound is refused once, as the reply arrives: model_error, run Failed and stored."""
    with open_store(store_target) as store:
        deep = tool_call("echo", id="c1", text=_nested(700))
        exc = _finish(Agent(FakeModel([tool_turn(deep)]), demo_registry()), driver, store=store, run_id="deep")
        assert exc.reason == "model_error"
        assert f"nested more than {MAX_NESTING} levels deep" in exc.evidence["error"]
        assert store.load("deep")["state"] == "Failed"


def test_tool_arguments_at_the_nesting_bound_are_kept_and_stored(store_target: str) -> None:
    """Arguments exactly at the bound (the arguments object is a level) are a normal call, stored as they were."""
    with open_store(store_target) as store:
        value = _nested(MAX_NESTING - 1)
        call = tool_call("echo", id="c1", text=value)
        result = Agent(FakeModel([tool_turn(call), reply("ok")]), demo_registry()).run("q", store=store, run_id="ok")
        assert result.final == "ok"
        assert store.load("ok")["messages"][1]["tool_calls"][0]["arguments"] == {"text": value}


def _exiting_registry() -> ToolRegistry:
    registry = ToolRegistry()

    def leave() -> str:
        """Raise GeneratorExit, as a tool wrapping a generator may."""
        raise GeneratorExit("closed early")

    registry.register(leave)
    return registry


@pytest.mark.parametrize("tool_timeout", [None, 5.0])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_sync_tool_raising_generator_exit_is_a_tool_failure_in_both_drivers(
    driver: str, tool_timeout: float | None
) -> None:
    """GeneratorExit from a sync tool (worker thread or not, with a timeout or not) is an error result; run goes on."""
    agent = Agent(
        FakeModel([tool_turn(tool_call("leave", id="c1")), reply("ok")]),
        _exiting_registry(),
        tool_timeout=tool_timeout,
    )
    result = agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    assert result.final == "ok"
    assert result.messages[2].content == '{"error": "tool \'leave\' raised GeneratorExit: closed early"}'


def _tamper(target: str, table: str, column: str, value: str) -> None:
    """Overwrite one column of every row of the store's ``runs`` or ``journal`` table, as a hand edit would."""
    if is_url(target):
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(f"UPDATE fsm_agent_{table} SET {column} = %s", (value,))  # type: ignore[arg-type]
    else:
        with contextlib.closing(sqlite3.connect(target)) as db, db:
            db.execute(f"UPDATE {table} SET {column} = ?", (value,))


TAMPERED = {
    "base not JSON": ("runs", "snapshot", "{not json", "its base snapshot: not JSON text"),
    "base a list": ("runs", "snapshot", "[1, 2]", "its base snapshot: a JSON list, not an object"),
    "base without lists": ("runs", "snapshot", '{"messages": 3}', "messages, steps, trace must be lists"),
    "entry adds bogus": ("journal", "entry", '{"add": {"bogus": [1]}}', "'add' holds bogus, not lists of"),
    "entry sets a list": ("journal", "entry", '{"set": [1]}', "'add' and 'set' must be objects"),
}


@pytest.mark.parametrize(("table", "column", "value", "why"), TAMPERED.values(), ids=TAMPERED)
def test_a_tampered_stored_row_is_one_snapshot_error_naming_the_run_and_the_part(
    store_target: str, table: str, column: str, value: str, why: str
) -> None:
    """Broken JSON or wrong shapes in a stored row: ``SnapshotError`` naming run and part, on load and decide."""
    with open_store(store_target) as store:
        Agent(FakeModel([tool_turn(tool_call("echo", id="c1", text="x")), reply("ok")]), demo_registry()).run(
            "q", store=store, run_id="bent"
        )
        _tamper(store_target, table, column, value)
        for read in (store.load, lambda run_id: store.decide(run_id, "c1", True)):
            with pytest.raises(SnapshotError, match=r"stored run 'bent' in .* is corrupted: ") as info:
                read("bent")
            assert why in str(info.value)


def test_a_tampered_run_is_one_line_on_the_command_line_and_a_422_in_the_viewer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runs show`` says what is corrupted in one line (exit 1); the viewer answers 422 with that text, not 404."""
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")
    from starlette.testclient import TestClient

    from fsm_agent.ui import create_app

    db = str(tmp_path / "runs.db")
    with open_store(db) as store:
        Agent(FakeModel([reply("ok")]), demo_registry()).run("q", store=store, run_id="bent")
    _tamper(db, "journal", "entry", '{"add": {"bogus": [1]}}')
    assert cli(["runs", "show", "bent", "--store", db]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: stored run 'bent' in ")
    assert "journal entry" in line
    with open_store(db) as store:
        response = TestClient(create_app(store), base_url="http://127.0.0.1").get("/api/run", params={"id": "bent"})
    assert response.status_code == 422
    assert "is corrupted: journal entry" in response.json()["error"]


# --- PostgreSQL connections: bounded while in use, none after close() ---------------------------------------


def _connections(url: str) -> int:
    """Connections to the test database other than this one, as the server counts them."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _closed(url: str) -> int:
    """``_connections`` once the server has seen the closed ones go: a backend leaves pg_stat_activity a moment
    after its client hung up, so the count is read again for up to five seconds while it is not 0."""
    deadline = time.monotonic() + 5
    count = _connections(url)
    while count and time.monotonic() < deadline:
        time.sleep(0.05)
        count = _connections(url)
    return count


@pytest.fixture
def pg_url(postgres_cluster: Any) -> str:
    """A fresh PostgreSQL database."""
    import uuid

    return str(postgres_cluster.new_database(f"leak_{uuid.uuid4().hex[:12]}"))


def test_each_asyncio_run_of_a_stored_run_leaves_no_connection_behind(pg_url: str) -> None:
    """Thirty ``asyncio.run(agent.arun(..., store=pg))`` keep the connections bounded; ``close()`` leaves none."""
    from fsm_agent.persist import PostgresStore

    store = PostgresStore(pg_url, max_size=3)
    counts = []
    for i in range(30):
        agent = Agent(FakeModel([tool_turn(tool_call("echo", id="c", text="x")), reply("ok")]), demo_registry())
        assert asyncio.run(agent.arun("q", store=store, run_id=f"r{i}")).final == "ok"
        counts.append(_connections(pg_url))
    assert max(counts) <= 3
    store.close()
    assert _closed(pg_url) == 0


def test_sixteen_threads_making_their_first_call_at_once_share_one_pool(pg_url: str) -> None:
    """Sixteen threads' first calls open one pool between them: connections stay within ``max_size``."""
    from fsm_agent.persist import PostgresStore

    store = PostgresStore(pg_url, max_size=4)
    start = threading.Barrier(16)
    errors: list[BaseException] = []
    pools: set[int] = set()

    def first_call() -> None:
        start.wait()
        try:
            store.list_runs()
            pools.add(id(store._sync_pool()))  # the pool this thread's call went through
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=first_call) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (errors, len(pools)) == ([], 1)
    assert _connections(pg_url) <= 4
    store.close()
    assert _closed(pg_url) == 0


def test_a_local_batch_on_postgres_exits_without_loop_warnings(pg_url: str, tmp_path: Path) -> None:
    """The local executor with a PostgreSQL store: no "Task was destroyed" or "Event loop is closed" at exit."""
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from support.batch_agents import factory
from pathlib import Path
from fsm_agent.batch import run_batch
results = run_batch(factory(Path({str(tmp_path)!r})), ["a", "b", "c"], store={pg_url!r}, executor="local",
                    progress=False)
print(sorted(r.reason for r in results))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['done', 'done', 'done']"
    assert "Task was destroyed" not in done.stderr
    assert "Event loop is closed" not in done.stderr


# --- the same rules in both stores ------------------------------------------------------------------------


def test_run_ids_past_the_bound_or_with_nul_get_the_same_answers_in_both_stores(store_target: str) -> None:
    """A new run's id over 1,024 bytes is a ValueError; looking one up (or one with NUL) finds no run, in each store."""
    long = "é" * 1500  # 3,000 bytes: past PostgreSQL's index row limit of 2,704
    agent = Agent(FakeModel([reply("ok")]), demo_registry())
    with open_store(store_target) as store:
        with pytest.raises(ValueError, match="run_id must be at most 1024 bytes of UTF-8, got 3000"):
            agent.run("q", store=store, run_id=long)
        assert agent.run("q", store=store, run_id="é" * 512).final == "ok"  # exactly 1,024 bytes
        for absent in (long, "a\x00b"):
            with pytest.raises(KeyError, match="no run"):
                store.load(absent)
            with pytest.raises(KeyError, match="no run"):
                store.decide(absent, "c1", True)
            assert store.delete(absent) is False
        assert [r.run_id for r in store.list_runs()] == ["é" * 512]


def test_a_password_in_the_url_s_query_string_is_never_shown(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``?password=...`` is redacted like a password after the user: in ``repr``, ``StoreError`` and the CLI."""
    from fsm_agent.persist import PostgresStore, StoreError

    with PostgresStore(f"{pg_url}?password=sekret-1") as store:
        assert "sekret" not in repr(store)
        assert "password=[redacted]" in repr(store)
    unreachable = "postgresql://app@127.0.0.1:1/db?sslmode=disable&password=sekret-2"
    with pytest.raises(StoreError) as info:
        PostgresStore(unreachable)
    assert "sekret" not in str(info.value)
    with pytest.raises(StoreError) as info:
        PostgresStore("postgres://app:sekret-3@[::1:5/db")  # a URL psycopg quotes whole in its error
    assert "sekret" not in str(info.value)
    assert cli(["runs", "list", "--store", unreachable]) == 1
    err = capsys.readouterr().err
    assert "password=[redacted]" in err
    assert "sekret" not in err
