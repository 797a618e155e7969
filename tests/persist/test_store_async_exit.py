"""Leaving ``async with`` a store ends it without blocking the event loop: its sync closing runs off the loop."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from support.pg_cluster import Cluster

from fsm_agent import Agent, PostgresStore
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn


@pytest.mark.postgres
def test_leaving_async_with_a_postgres_store_closes_its_sync_pool_off_the_loop(
    postgres_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync pool's close waits on the server: it runs in a worker thread, and the store is closed after."""
    closed_on: list[threading.Thread] = []
    close = PostgresStore.close

    def watched_close(self: PostgresStore) -> None:
        closed_on.append(threading.current_thread())
        close(self)

    monkeypatch.setattr(PostgresStore, "close", watched_close)
    url = postgres_cluster.new_database(f"t_{uuid.uuid4().hex[:16]}")
    executed: list[Any] = []
    registry = demo_registry()
    registry.register(lambda text: executed.append(text) or text, name="note", description="Note a text.")
    model = FakeModel([tool_turn(tool_call("note", text="once")), reply("noted")])

    async def main() -> tuple[threading.Thread, str]:
        loop_thread = threading.current_thread()
        async with PostgresStore(url) as store:
            result = await Agent(model, registry).arun("go", store=store, run_id="r1")
        return loop_thread, result.final

    loop_thread, final = asyncio.run(main())
    assert final == "noted"
    assert executed == ["once"]
    assert len(closed_on) == 1
    assert closed_on[0] is not loop_thread
    with PostgresStore(url) as again:
        assert again.load("r1")["state"] == "Done"
