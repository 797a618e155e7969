"""An AG-UI app's turns reach the store through its async twins only, so a turn never blocks the server's loop.

docs/how-to/async.md ("Stores"): every store read and write of an async run
is awaited through the store's async twins, "a session's turns" too.  The
app is served over ``AsyncOnly``, a SQLite store whose sync methods raise
(from the loop or from a worker thread) and whose async twins do the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from support.agui_apps import outline, post, run_input, scenario_app
from support.async_only import AsyncOnly

from fsm_agent import SqliteStore


@pytest.fixture
def inner(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "threads.db") as store:
        yield store


def test_a_turn_of_a_new_thread_is_served_with_awaited_store_calls_only(inner: SqliteStore) -> None:
    """A thread's first turn: RUN_FINISHED, the turn stored, and no sync store call on the way."""
    store = AsyncOnly(inner)
    served, _ = scenario_app(store=store)
    with TestClient(served) as client:
        events = post(client, run_input("t-1", "tool"))
    assert store.refused == [], events[-1]
    assert outline(events)[-1] == "RUN_FINISHED"
    assert inner.load("t-1/1")["state"] == "Done"


def test_the_turn_itself_is_driven_with_awaited_store_calls(inner: SqliteStore) -> None:
    """What the turn does after the session is built: Session.arun's reads and every write are awaited twins."""
    from fsm_agent import Session

    store = AsyncOnly(inner)
    _, scenarios = scenario_app(store=store)
    session = Session(scenarios.agent(_input("t-2")), inner, "t-2")  # the read the app does in a thread, sync
    session.store = store  # type: ignore[assignment]
    result = asyncio.run(session.arun("go"))
    assert result.ok
    assert store.refused == []
    assert {"alist_runs", "acreate", "aappend"} <= set(store.awaited)


def _input(thread: str) -> Any:
    from ag_ui.core import RunAgentInput

    return RunAgentInput.model_validate(run_input(thread, "tool"))
