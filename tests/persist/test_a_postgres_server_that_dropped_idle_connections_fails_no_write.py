"""A PostgreSQL server that dropped the store's idle connections (a restart, an idle timeout): no write fails.

The server tells each open connection it is ending, but the client hears
it only when it next uses the connection.  The store looks before it writes
on an idle connection: one with something to read is asked an empty query,
and swapped for a new one if the server dropped it; a healthy one is asked
nothing.  So a run goes on across a server restart without a failed write,
each tool call made once, on both drivers, and a healthy pool costs no
round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import psycopg
import pytest
from support.pg_cluster import Cluster
from support.pg_killable import KillableCluster
from support.pg_proxy import Proxy

from fsm_agent import Agent, AgentRun, PostgresStore, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

pytestmark = pytest.mark.postgres

EMPTY_QUERY = b"Q\x00\x00\x00\x05\x00"
"""An empty query in PostgreSQL's simple protocol, as the check sends it: the only one the store ever sends."""


@pytest.fixture(autouse=True)
def _quiet_pool(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, "psycopg.pool")  # the pool's own warning about each dropped connection


def _agent(made: Counter[str], turns: int = 3, runs: int = 1) -> Agent:
    """An agent whose model asks for ``turns`` counted tool calls, then answers, ``runs`` times over."""
    tools = ToolRegistry()

    @tools.register
    def effect(tag: str) -> str:
        """One side effect, counted."""
        made[tag] += 1
        return f"did {tag}"

    calls = [tool_turn(tool_call("effect", id=f"c{i}", tag=f"t{i}")) for i in range(turns)]
    return Agent(FakeModel([*calls, reply("done")] * runs), tools)


def _ended(cluster: KillableCluster, how: str) -> Callable[[], None]:
    """The server's end, ``shut_down`` (each session told) or ``kill`` (every process SIGKILLed), then its start."""

    def end_and_start() -> None:
        cluster.shut_down() if how == "shut_down" else cluster.kill()
        cluster.restart()

    return end_and_start


def _first_tool_ran(run: AgentRun) -> bool:
    return bool(run.trace) and run.trace[-1].source == "ExecuteTool"


@pytest.mark.parametrize("how", ["shut_down", "kill"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_run_goes_on_across_a_server_restart_with_no_failed_write(
    killable: KillableCluster, driver: str, how: str
) -> None:
    made: Counter[str] = Counter()
    agent = _agent(made)
    restart = _ended(killable, how)
    with PostgresStore(killable.dsn) as store:
        if driver == "sync":
            run = agent.start("go", store=store, run_id="r")
            while not _first_tool_ran(run):
                run.advance()  # every="call": the tool's outcome is written before advance returns
            restart()
            result = run.finish()
        else:

            async def main() -> str:
                run = await agent.astart("go", store=store, run_id="r")
                while not _first_tool_ran(run):
                    await run.aadvance()
                await asyncio.to_thread(restart)
                return (await run.afinish()).final

            result = asyncio.run(main())  # one loop: its connections stay open across the restart
        stored = store.load("r")
    assert dict(made) == {"t0": 1, "t1": 1, "t2": 1}
    assert (stored["state"], [m["content"] for m in stored["messages"] if m["role"] == "tool"]) == (
        "Done",
        ['"did t0"', '"did t1"', '"did t2"'],
    )
    assert (result if driver == "async" else result.final) == "done"  # type: ignore[union-attr]


IDLE = 8
"""Idle connections the store holds when the server restarts: enough that finding them one by one, with the
pool's back-off between (1 s, then doubling), would outlast its 30 s wait for a connection."""


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_eight_dropped_idle_connections_are_swapped_before_the_next_write(
    killable: KillableCluster, driver: str
) -> None:
    made: Counter[str] = Counter()
    agent = _agent(made, turns=1, runs=2)
    with PostgresStore(killable.dsn, max_size=IDLE) as store:
        if driver == "sync":
            pool = store._sync_pool()  # the eight taken at once, so the pool holds eight when they are back
            with contextlib.ExitStack() as taken:
                for _ in range(IDLE):
                    taken.enter_context(pool.connection())
            assert pool.get_stats()["pool_available"] == IDLE
            _ended(killable, "shut_down")()
            results = [agent.run("go", store=store, run_id=f"r{i}").final for i in range(2)]
        else:

            async def main() -> list[str]:
                connections = await store._connections()
                async with contextlib.AsyncExitStack() as taken:
                    for _ in range(IDLE):
                        await taken.enter_async_context(connections.connection())
                await asyncio.to_thread(_ended(killable, "shut_down"))
                return [(await agent.arun("go", store=store, run_id=f"r{i}")).final for i in range(2)]

            results = asyncio.run(main())
    assert results == ["done", "done"]
    assert dict(made) == {"t0": 2}


@pytest.fixture
def proxied(postgres_cluster: Cluster) -> Iterator[tuple[str, str, Proxy]]:
    """A fresh database's name, its URL through a proxy of its own, and the proxy (dropped with the test)."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    postgres_cluster.new_database(name)
    proxy = Proxy(postgres_cluster.port)
    yield name, proxy.url(name), proxy
    proxy.close()
    postgres_cluster.drop_database(name)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_healthy_idle_connections_are_asked_nothing_and_timed_out_ones_are_swapped(
    proxied: tuple[str, str, Proxy], driver: str
) -> None:
    name, url, proxy = proxied
    sent: list[bytes] = []
    proxy.drop = lambda chunk: sent.append(chunk) or None  # drops nothing: records what each client sends
    made: Counter[str] = Counter()
    agent = _agent(made, runs=4)

    def run_twice(store: PostgresStore, pause: float) -> list[str]:
        """Two runs, ``pause`` seconds apart."""
        if driver == "sync":
            first = agent.run("go", store=store).final
            time.sleep(pause)
            return [first, agent.run("go", store=store).final]

        async def main() -> list[str]:
            first = (await agent.arun("go", store=store)).final
            await asyncio.sleep(pause)
            return [first, (await agent.arun("go", store=store)).final]

        return asyncio.run(main())

    with PostgresStore(url) as store:
        assert run_twice(store, 0.0) == ["done", "done"]
    asked_when_healthy, opened_when_healthy = sent.count(EMPTY_QUERY), _sessions_opened(sent)
    _set_idle_timeout(url, name)
    sent.clear()
    with PostgresStore(url) as store:
        # 3 s: three times the server's 1 s idle timeout, so it has ended every idle session by then; 1 s, so
        # no gap between one run's own writes outlasts it, even on a busy machine.
        assert run_twice(store, 3.0) == ["done", "done"]
    assert asked_when_healthy == 0
    # The connection the server timed out was swapped for a new one (the check's query went to the closed socket).
    assert _sessions_opened(sent) > opened_when_healthy
    assert dict(made) == {"t0": 4, "t1": 4, "t2": 4}


def _sessions_opened(sent: list[bytes]) -> int:
    """How many of the chunks sent through the proxy open a session (a startup message names the database)."""
    return sum(b"\x00database\x00" in chunk for chunk in sent)


def _set_idle_timeout(url: str, name: str) -> None:
    """Sessions of ``name`` that start from now on are ended by the server after 1 s idle."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET idle_session_timeout = '1s'")  # a fixed test name


OUTAGE = 70.0
"""How long the server is down: a write waits 30 s for a connection, so the third starts at 60 s and waits through
the server's return.  The pool's own back-off (tries at 1, 3, 7, 15, 31, 63, then 127 s, each within 10%) would
try next at 115-140 s, after that wait: a write would fail with the server back for 20 s."""


@pytest.mark.slow  # the server is down for OUTAGE seconds
def test_a_write_waiting_when_the_server_returns_from_a_long_outage_gets_its_connection(
    killable: KillableCluster,
) -> None:
    made: Counter[str] = Counter()
    agent = _agent(made, turns=2)
    with PostgresStore(killable.dsn) as store:
        run = agent.start("go", store=store, run_id="r")
        while not _first_tool_ran(run):
            run.advance()  # t0's outcome written: the next write is the model's reply
        killable.shut_down()
        down = time.monotonic()
        back = threading.Timer(OUTAGE, killable.restart)
        back.start()
        try:
            failed_while_down = 0
            while True:
                try:
                    result = run.finish()
                    break
                except psycopg.OperationalError:  # the pool's PoolTimeout is one: no connection within 30 s
                    failed_at = time.monotonic() - down
                    assert failed_at < OUTAGE, f"a write failed {failed_at - OUTAGE:.1f} s after the server's return"
                    failed_while_down += 1
        finally:
            back.join()
        stored = store.load("r")
    assert failed_while_down >= 1
    assert (result.final, stored["state"]) == ("done", "Done")
    assert dict(made) == {"t0": 1, "t1": 1}
