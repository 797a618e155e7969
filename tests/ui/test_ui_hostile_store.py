"""The viewer over what an attacker or an older version may leave in a store: filters no store compares, bad rows.

A store's ``save`` refuses a snapshot a resume would refuse, but a store
written by an older version, or by hand, may still hold one: such rows are
put in here with plain SQL, as ``sqlite3`` would.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs the extra: there a missing one fails the import below
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

from starlette.testclient import TestClient
from support.ui_runs import Viewer, finished, put_row, stopped

from fsm_agent import SqliteStore
from fsm_agent.persist import open_store
from fsm_agent.ui import create_app

BASE = "http://127.0.0.1:8765"
CORRUPTIONS: dict[str, tuple[str, Any, str]] = {
    "steps-not-objects": ("steps", [1, 2], "snapshot field steps must be a list of objects"),
    "step-of-nothing": ("steps", [{"bogus": 1}], "snapshot field steps[0] is malformed"),
    "messages-not-objects": ("messages", [1, 2], "snapshot field messages must be a list of objects"),
    "message-of-nothing": ("messages", [{"bogus": 1}], "snapshot field messages[0] is malformed"),
    "trace-not-objects": ("trace", [1, 2], "snapshot field trace must be a list of objects"),
    "trace-entry-of-nothing": ("trace", [{"bogus": 1}], "snapshot field trace[0] is malformed"),
    "unknown-state": ("state", "Bogus", "snapshot state 'Bogus' is not a state"),
}
"""Run id -> (the snapshot field replaced, its value, what the viewer's message says)."""


def client(store: Any) -> TestClient:
    """A test client for a viewer over ``store``, addressed as a browser on this machine would."""
    return TestClient(create_app(store), base_url=BASE)


@pytest.fixture
def tampered(tmp_path: Path) -> Iterator[SqliteStore]:
    """A store with a finished run, and one hand-written copy of it per entry of CORRUPTIONS."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        finished(store)
        good = {k: v for k, v in store.load("finished").items() if k != "stored_seq"}
        for run_id, (field, value, _) in CORRUPTIONS.items():
            put_row(path, run_id, {**good, field: value})
        yield store


# --- the list's filters ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["state", "reason", "session"])
def test_a_nul_in_a_list_filter_is_a_400_naming_the_filter(store_target: str, name: str) -> None:
    """``?state=%00`` (PostgreSQL takes no NUL in a query), on both stores: 400 naming the filter, never the offset."""
    with open_store(store_target) as store:
        stopped(store)
        viewer = client(store)
        response = viewer.get(f"/api/runs?{name}=%00")
        assert response.status_code == 400
        error = response.json()["error"]
        assert error.startswith(f"filter {name} '\\x00' must be text without NUL")
        assert "offset" not in error
        assert viewer.get(f"/?{name}=%00").status_code == 200  # the page itself; its script shows the error
        assert viewer.get("/api/runs", params={name: "x"}).json()["runs"] == []


# --- a corrupted run -------------------------------------------------------------------------


@pytest.mark.parametrize("run_id", sorted(CORRUPTIONS))
def test_a_run_with_a_malformed_snapshot_is_shown_as_corrupted(tampered: SqliteStore, run_id: str) -> None:
    """Steps, messages or trace entries that are no records, or an unknown state: 422 naming the run and field."""
    response = client(tampered).get("/api/run", params={"id": run_id})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error.startswith(f"stored run {run_id!r} is corrupted: ")
    assert CORRUPTIONS[run_id][2] in error


@pytest.mark.parametrize("run_id", sorted(CORRUPTIONS))
def test_following_a_corrupted_run_ends_with_a_corrupted_event(tampered: SqliteStore, run_id: str) -> None:
    """/api/events sends one ``corrupted`` event with the message and ends its stream; a state Bogus is never live.

    Served for real, so a stream cut by an error shows as a failed read, and one
    that follows a run forever as a timeout (10 s, the viewer polls every 0.1 s).
    """
    viewer = Viewer(tampered)
    try:
        url = viewer.url + "api/events?" + urllib.parse.urlencode({"id": run_id})
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        viewer.close()
    event, data, end = text.split("\n", 2)
    assert event == "event: corrupted"
    assert json.loads(data.removeprefix("data: "))["error"].startswith(f"stored run {run_id!r} is corrupted: ")
    assert end == "\n"


def test_a_sound_run_next_to_corrupted_ones_is_shown_and_followed_as_before(tampered: SqliteStore) -> None:
    """The checks refuse only what is corrupted: the run they were copied from still has its page and its end."""
    viewer = client(tampered)
    run = viewer.get("/api/run", params={"id": "finished"}).json()
    assert (run["state"], run["live"], run["counters"]["tool_calls"]) == ("Done", False, [1, None])
    with viewer.stream("GET", "/api/events", params={"id": "finished"}) as response:
        assert "".join(response.iter_text()).endswith("event: end\ndata: {}\n\n")
