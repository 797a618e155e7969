"""A run's page reads its sub-agent runs with one listing per poll, and shows them as it did with a load each.

The live page polls a run about once a second; where each sub-agent run
stands (state, reason, paused) used to cost one whole ``load`` per child and
one per pending call (to find a child in flight), journal replay included, at
every poll of every tab.  Now ``run_page.with_children`` lists the run's
children in one ``list_runs(parent=...)`` read.  The page must stay what it
was: each test compares it with the page built from an oracle store whose
``list_runs(parent=...)`` loads every run and reads its link from its
snapshot (``LinksFromSnapshots``), as the page's loads did.  Every tool and model call is counted; each run is made by
both drivers, on both stores.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from typing import Any

import pytest
from support.app_owners import JOIN
from support.children_listing import BOSS, Counted, Family, LinksFromSnapshots

from fsm_agent import TABLE
from fsm_agent.persist import is_url, open_store
from fsm_agent.ui.live import follow
from fsm_agent.ui.replay import digest
from fsm_agent.ui.run_page import run_view, with_children

pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

DONE = 4
"""Sub-agent calls the boss's first turn makes; one more is held in flight."""


def _both(store: Any, run_id: str = BOSS) -> tuple[dict[str, Any], Counted, dict[str, Any], LinksFromSnapshots]:
    """The run's page read through one listing, and through the oracle (every run loaded), with what each read."""
    listed, loaded = Counted(store), LinksFromSnapshots(store)
    data = store.load(run_id)
    return run_view(listed, run_id, data), listed, run_view(loaded, run_id, data), loaded


def _shown(page: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {child["run_id"]: (child["stored"], child["state"], child["paused"]) for child in page["children"]}


def _in_flight(target: str, driver: str) -> tuple[Family, threading.Thread, Any]:
    """The boss run started by ``driver`` in a thread, waiting on its held sub-agent call; the store it writes."""
    family = Family(DONE)
    store = open_store(target)
    boss = threading.Thread(target=family.run, args=(store, driver), daemon=True)
    boss.start()
    assert family.noting.wait(JOIN), "the held sub-agent run never reached its note"
    return family, boss, store


def _ended(family: Family, boss: threading.Thread) -> None:
    """Let the held call finish; the boss answers; every note ran once, every model was called as scripted."""
    family.release.set()
    boss.join(JOIN)
    assert not boss.is_alive()
    notes, helper_calls, boss_calls = family.counts()
    assert notes == {**{f"help {i}": 1 for i in range(DONE)}, "hold on": 1}
    assert (helper_calls, boss_calls) == (2 * (DONE + 1), 3)


def _follow(store: Counted, polls: int) -> list[str]:
    """Follow the boss's page as ``/api/events`` does for ``polls`` polls: what it sent."""
    stopping = threading.Event()
    store.stop_after(BOSS, polls, stopping)

    async def gone() -> bool:
        return False

    async def sent() -> list[str]:
        stream = follow(
            store.load,
            BOSS,
            TABLE,
            0.01,
            gone,
            stopping,
            lambda data: digest(BOSS, data, TABLE),
            lambda data, page: with_children(store, BOSS, data, page, TABLE),
        )
        return [event async for event in stream]

    return asyncio.run(sent())


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_each_poll_of_a_followed_parent_reads_one_listing_and_loads_no_sub_agent_run(
    store_target: str, driver: str
) -> None:
    """Four children done, a fifth in flight: five polls read the boss five times and list its children five times."""
    family, boss, store = _in_flight(store_target, driver)
    try:
        counted = Counted(store)
        events = _follow(counted, polls=5)
        assert counted.loads == {BOSS: 5}, "a poll loaded a sub-agent run"
        assert counted.listings == [{"parent": BOSS}] * 5
        assert len(events) == 1, "a quiet poll sent the page again"
        page, _, old, loaded = _both(store)
        assert _shown(page) == _shown(old)
        assert [child["run_id"] for child in page["children"]] == family.children()
        assert all(child["state"] == "Done" for child in page["children"][:DONE])
        held = page["children"][-1]
        assert (held["stored"], held["state"] in {"Done", None}) == (True, False), "the child in flight is not done"
        assert held["call_id"] == family.held
        assert sum(loaded.loads[child] for child in family.children()) == DONE + 1, "the oracle read each child"
    finally:
        _ended(family, boss)
        store.close()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_finished_parent_s_page_shows_its_sub_agent_runs_as_before_and_a_deleted_one_as_not_stored(
    store_target: str, driver: str
) -> None:
    """The boss done: every child Done, from one listing; a child deleted: stored false, the one child loaded."""
    family, boss, store = _in_flight(store_target, driver)
    try:
        _ended(family, boss)
        page, listed, old, _ = _both(store)
        assert page == old
        assert (dict(listed.loads), listed.listings) == ({}, [{"parent": BOSS}])
        assert set(_shown(page).values()) == {(True, "Done", False)}
        assert store.delete(f"{BOSS}/h1")
        page, listed, old, _ = _both(store)
        assert page == old
        assert _shown(page)[f"{BOSS}/h1"] == (False, None, False)
        assert dict(listed.loads) == {f"{BOSS}/h1": 1}, "only the child the listing lacks is looked for"
    finally:
        family.release.set()
        store.close()


def test_a_fork_s_page_shows_the_sub_agent_runs_its_steps_name_though_they_are_its_source_s(store_target: str) -> None:
    """A fork of the boss names its source's children in its steps: listed under the source, loaded, shown as before."""
    family, boss, store = _in_flight(store_target, "sync")
    try:
        _ended(family, boss)
        source = store.load(BOSS)
        fork = family.agent().fork(source, at=len(source["trace"]) - 2, store=store, run_id="again")
        assert fork.finish().final == "all helped"
        assert family.counts()[0] == {**{f"help {i}": 1 for i in range(DONE)}, "hold on": 1}, "a fork noted again"
        page, listed, old, _ = _both(store, "again")
        assert page == old
        assert list(_shown(page)) == family.children()
        assert set(_shown(page).values()) == {(True, "Done", False)}
        assert listed.listings == [{"parent": "again"}]
    finally:
        family.release.set()
        store.close()


def _corrupt(target: str, run_id: str) -> None:
    """Overwrite the run's stored base with text that is no snapshot, behind the store's back."""
    if is_url(target):
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("UPDATE fsm_agent_runs SET snapshot = 'not a run' WHERE run_id = %s", (run_id,))
        return
    with sqlite3.connect(target) as db:
        db.execute("UPDATE runs SET snapshot = 'not a run' WHERE run_id = ?", (run_id,))
    db.close()


def test_a_corrupted_sub_agent_run_is_shown_as_its_listing_has_it_and_its_own_page_says_it_is_corrupted(
    store_target: str,
) -> None:
    """Decided: the parent's page shows the child's last listed state (it reads no snapshot); its own page is a 422."""
    from starlette.testclient import TestClient

    from fsm_agent.ui import create_app

    family, boss, store = _in_flight(store_target, "sync")
    try:
        _ended(family, boss)
        _corrupt(store_target, f"{BOSS}/h2")
        page, listed, old, _ = _both(store)
        assert _shown(page)[f"{BOSS}/h2"] == (True, "Done", False)
        assert _shown(old)[f"{BOSS}/h2"] == (True, None, False), "the oracle, a load, found it corrupted"
        assert dict(listed.loads) == {}
        viewer = TestClient(create_app(store), base_url="http://127.0.0.1")
        assert viewer.get("/api/run", params={"id": BOSS}).status_code == 200
        answer = viewer.get("/api/run", params={"id": f"{BOSS}/h2"})
        assert answer.status_code == 422
        assert "corrupted" in answer.json()["error"]
    finally:
        family.release.set()
        store.close()
