"""A PostgreSQL connection dropped in the middle of a run's write: the run driven again repeats no call.

A TCP proxy in front of the suite's server cuts the run's connection at
one journal append, before the statement reaches the server or after the
server committed it, so the app gets psycopg's own error, as from a
failover.  The app drives the same run object again; the run writes first
(reading back whether the cut write committed), then goes on: each tool
call once, on both drivers.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from support.pg_cluster import Cluster
from support.pg_proxy import Proxy, journal_appends

from fsm_agent import Agent, PostgresStore, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


@pytest.fixture
def proxied(postgres_cluster: Cluster) -> Iterator[tuple[str, Proxy]]:
    """A fresh database's URL through a proxy of its own (dropped with the test), and the proxy."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    postgres_cluster.new_database(name)
    proxy = Proxy(postgres_cluster.port)
    yield proxy.url(name), proxy
    proxy.close()
    postgres_cluster.drop_database(name)


def _tools(made: Counter[str]) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.register
    def effect(tag: str) -> str:
        """One side effect, counted."""
        made[tag] += 1
        return f"did {tag}"

    return tools


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_run_goes_on_once_the_write_is_made_or_found_committed(
    proxied: tuple[str, Proxy], driver: str, when: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, "psycopg.pool")  # the pool's own warning about the broken connection
    url, proxy = proxied
    made: Counter[str] = Counter()
    model = FakeModel(*[tool_turn(tool_call("effect", id=f"c{i}", tag=f"t{i}")) for i in range(3)], reply("done"))
    agent = Agent(model, _tools(made))
    with PostgresStore(url) as store:
        run = (
            agent.start("go", store=store, run_id="r1")
            if driver == "sync"
            else asyncio.run(agent.astart("go", store=store, run_id="r1"))
        )
        proxy.drop = journal_appends(1, when, b"did t1")
        with pytest.raises(psycopg.OperationalError):
            run.finish() if driver == "sync" else asyncio.run(run.afinish())
        assert (proxy.dropped, dict(made)) == (1, {"t0": 1, "t1": 1})
        result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
        stored = store.load("r1")
    assert (result.final, stored["state"]) == ("done", "Done")
    assert (dict(made), len(model.seen)) == ({"t0": 1, "t1": 1, "t2": 1}, 4)
    assert [m["content"] for m in stored["messages"] if m["role"] == "tool"] == ['"did t0"', '"did t1"', '"did t2"']
