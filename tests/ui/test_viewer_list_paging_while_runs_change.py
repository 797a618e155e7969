"""The viewer's list, paged while the store changes: every run once, none skipped, none repeated.

The tutorial (viewer.md, "The list of runs") says the first page lists every
run in the store, latest first, 25 to a page; a person reading page 1, then
following "older →", must see each run that was there exactly once, even when
a run is added, or an older one saved again, in between.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs the extra: there a missing one fails the import below
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

from starlette.testclient import TestClient
from support.ui_runs import paused

import fsm_agent.ui.app
from fsm_agent import Agent, SqliteStore
from fsm_agent.testing import FakeModel, demo_registry, reply
from fsm_agent.ui import create_app

BASE = "http://127.0.0.1:8765"
SIZE = 3


def answered(store: SqliteStore, run_id: str) -> None:
    """A run that answers at once."""
    Agent(FakeModel([reply("ok")]), demo_registry()).run("q", store=store, run_id=run_id)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SqliteStore]:
    """Six runs, r0 (oldest) to r5, and pages of three."""
    monkeypatch.setattr(fsm_agent.ui.app, "PAGE_SIZE", SIZE)
    with SqliteStore(tmp_path / "runs.db") as opened:
        for i in range(6):
            answered(opened, f"r{i}")
        yield opened


def page(viewer: TestClient, after: str | None = None, **params: str) -> tuple[list[str], bool, str | None]:
    """The ids of one page of the list, whether another follows, and the cursor its "older →" link follows."""
    answer = viewer.get("/api/runs", params={**params, **({} if after is None else {"after": after})})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return [run["run_id"] for run in body["runs"]], body["more"], body["next"]


def test_paging_a_store_nobody_changes_shows_every_run_once(store: SqliteStore) -> None:
    """Two pages of three, latest first, then none: each run once, and the last page has no "older →"."""
    viewer = create_app(store)
    client = TestClient(viewer, base_url=BASE)
    first, more, older = page(client)
    assert (first, more) == (["r5", "r4", "r3"], True)
    assert older is not None
    assert page(client, older) == (["r2", "r1", "r0"], False, None)


def test_a_run_added_between_pages_repeats_none_of_page_one(store: SqliteStore) -> None:
    """Page 1, then a new run, then "older →": page 2 holds the runs after page 1's last, none of page 1's."""
    client = TestClient(create_app(store), base_url=BASE)
    first, more, older = page(client)
    assert (first, more) == (["r5", "r4", "r3"], True)
    answered(store, "r6")
    second, _, _ = page(client, older)
    assert not set(first) & set(second), (first, second)
    assert second == ["r2", "r1", "r0"]
    assert page(client)[0] == ["r6", "r5", "r4"], "the first page, read again, starts with the new run"


def test_a_run_saved_again_between_pages_is_not_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Page 1, then a decision on a run of page 2 (which saves it again), then "older →": that run was shown."""
    monkeypatch.setattr(fsm_agent.ui.app, "PAGE_SIZE", SIZE)
    with SqliteStore(tmp_path / "runs.db") as store:
        answered(store, "r0")
        paused(store, [], run_id="p1")
        for i in range(2, 6):
            answered(store, f"r{i}")
        client = TestClient(create_app(store, allow_decisions=True), base_url=BASE)
        first, _, older = page(client)
        assert first == ["r5", "r4", "r3"]
        decided = client.post("/api/decide", params={"id": "p1"}, json={"call_id": "call_mail", "approve": True})
        assert decided.status_code == 200
        second, more, _ = page(client, older)
        assert not more
        assert sorted([*first, *second]) == ["p1", "r0", "r2", "r3", "r4", "r5"], (first, second)
        assert second == ["r2", "p1", "r0"], "a run saved again keeps its place in the list"


def test_a_filtered_list_pages_by_cursor_with_its_filter(store: SqliteStore) -> None:
    """?state=Done with "older →": the cursor goes on within the filter, each run once."""
    client = TestClient(create_app(store), base_url=BASE)
    first, _, older = page(client, state="Done")
    assert first == ["r5", "r4", "r3"]
    answered(store, "r6")
    assert page(client, older, state="Done") == (["r2", "r1", "r0"], False, None)
    assert page(client, older, state="Failed") == ([], False, None)


def test_an_old_offset_link_counts_in_the_same_order_and_its_older_link_is_a_cursor(store: SqliteStore) -> None:
    """?offset=3 (a link from before cursors) skips the three latest runs now; its "older →" is a cursor."""
    client = TestClient(create_app(store), base_url=BASE)
    second, more, older = page(client, offset="2")
    assert (second, more) == (["r3", "r2", "r1"], True)
    answered(store, "r6")
    assert page(client, older) == (["r0"], False, None)
    assert page(client, offset="3")[0] == ["r3", "r2", "r1"], "an offset counts from the latest run, as it is now"
