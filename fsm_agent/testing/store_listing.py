"""The store conformance checks of paging by cursor: each run once while runs are added and saved, and the order.

Part of ``fsm_agent.testing.stores.StoreConformance``, beside ``store_writes``
and ``store_owners``.  A person paging through a store's runs (the run
viewer's "older" link) reads one page, then asks for the runs after its last
one (``list_runs(order="created", after=RunCursor.of(page[-1]))``); each
run there must be shown once, however many runs were added, saved again or
resumed between the pages.  Each test asks for the ``make_store`` fixture the
subclass gives, and is skipped for a store without ``list_runs``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from fsm_agent.persist.cursor import RunCursor
from fsm_agent.testing.store_kit import LONG, MakeStore, adding_agent, need


def _ids(runs: Any) -> list[str]:
    return [run.run_id for run in runs]


def _started(store: Any, *run_ids: str) -> None:
    """One finished run per id, in that order, each created a little after the one before."""
    for run_id in run_ids:
        adding_agent(1).run("add", store=store, run_id=run_id)
        time.sleep(0.01)


def _created(run: Any) -> float:
    """A listed run's creation time, which a store that pages by cursor must give (``StoredRun.created``)."""
    created = run.created
    given = isinstance(created, int | float) and not isinstance(created, bool)
    assert given, f"list_runs gave run {run.run_id!r} no creation time (created={created!r})"
    return float(created)


def _saved_again(store: Any, run_id: str) -> None:
    """Save the run again as it is: its last save moves, its creation must not."""
    store.save(run_id, store.load(run_id))


def _claimed(store: Any, run_id: str) -> None:
    """Claim the run, as a resume does, and give it up: it is written anew, and its creation must not move."""
    seq = store.claim(run_id, store.load(run_id), owner="B")
    store.renew(run_id, owner="B", seq=seq, release=True)


class ListingChecks:
    """``list_runs(order="created", after=...)``: the creation order, and pages that show each run once."""

    def test_paging_by_cursor_shows_each_run_once_while_runs_are_added_and_saved_again(
        self, make_store: MakeStore
    ) -> None:
        """Pages of two, a run added, older ones saved again or claimed (resumed) between pages: r4 to r0, each once.

        A claim writes a run anew, as a resume or a takeover does: like a
        save, it must leave the run's creation, and so its place, as it was.
        """
        store = make_store(LONG)
        need(store, "list_runs")
        _started(store, "r0", "r1", "r2", "r3", "r4")
        before = {run.run_id: run for run in store.list_runs(order="created")}
        pages = [store.list_runs(order="created", limit=2)]
        between = [("r5", ["r1", "r3"], ["r2", "r4"]), ("r6", ["r0"], []), ("r7", [], [])]
        for added, saved, claimed in between:
            _started(store, added)
            for run_id in saved:
                _saved_again(store, run_id)
            for run_id in claimed:
                _claimed(store, run_id)
            pages.append(store.list_runs(order="created", limit=2, after=RunCursor.of(pages[-1][-1])))
            if not pages[-1]:
                break
        assert [_ids(page) for page in pages] == [["r4", "r3"], ["r2", "r1"], ["r0"], []]
        after = {run.run_id: run for run in store.list_runs(order="created")}
        for run_id, written in (("r0", "saving"), ("r1", "saving"), ("r3", "saving"), ("r2", "claiming")):
            assert after[run_id].created == before[run_id].created, f"{written} {run_id} again moved its creation"
        for run_id in ("r0", "r1", "r3"):
            assert after[run_id].updated > before[run_id].updated, f"saving {run_id} again kept its last save"
        assert _ids(store.list_runs(limit=2)) == ["r7", "r0"], "list_runs() is no longer latest saved first"
        if callable(getattr(store, "alist_runs", None)):
            cursor = RunCursor.of(pages[0][-1])
            awaited = asyncio.run(store.alist_runs(order="created", limit=2, after=cursor))
            assert _ids(awaited) == ["r2", "r1"], "alist_runs pages otherwise than list_runs"

    def test_the_creation_order_is_latest_first_ties_by_run_id_descending_and_a_cursor_excludes_its_run(
        self, make_store: MakeStore
    ) -> None:
        """a, b, c created in turn: c, b, a; after (b's time, "b") is a; after (b's time, "bb") is b, a."""
        store = make_store(LONG)
        need(store, "list_runs")
        _started(store, "a", "b", "c")
        listed = store.list_runs(order="created")
        assert _ids(listed) == ["c", "b", "a"]
        c, b, a = listed
        assert _created(a) < _created(b) < _created(c)
        assert all(_created(run) <= run.updated for run in listed), "a run listed as created after its last save"
        at_b, start = _created(b), RunCursor(_created(c) + 1.0, "a")
        cases = [
            (RunCursor(at_b, "b"), ["a"]),
            (RunCursor(at_b, "bb"), ["b", "a"]),
            (RunCursor(at_b, "a"), ["a"]),
            (RunCursor(at_b, "c"), ["b", "a"]),
            (RunCursor.of(a), []),
            (RunCursor.of(c), ["b", "a"]),
            (start, ["c", "b", "a"]),
        ]
        for cursor, expected in cases:
            assert _ids(store.list_runs(order="created", after=cursor)) == expected, f"after {cursor}"
        assert _ids(store.list_runs(order="created", after=start, limit=1)) == ["c"]
        assert _ids(store.list_runs(order="created", after=start, state="Done", reason="done")) == ["c", "b", "a"]
        assert store.list_runs(order="created", after=start, state="Failed") == []
        assert _ids(store.list_runs(order="created", limit=1, offset=1)) == ["b"]

    def test_a_bad_order_or_cursor_is_refused_naming_it_before_anything_is_listed(self, make_store: MakeStore) -> None:
        """order="bogus", a cursor's text for after, after with the last-save order or with an offset: refused."""
        store = make_store(LONG)
        need(store, "list_runs")
        _started(store, "a")
        cursor = RunCursor.of(store.list_runs(order="created")[0])
        refusals: list[tuple[dict[str, Any], type[Exception], str]] = [
            ({"order": "bogus"}, ValueError, "order"),
            ({"order": "created", "after": str(cursor)}, TypeError, "after must be a RunCursor"),
            ({"after": cursor}, ValueError, "order='created'"),
            ({"order": "created", "after": cursor, "offset": 1}, ValueError, "after or offset"),
        ]
        for given, error, named in refusals:
            with pytest.raises(error, match=named):
                store.list_runs(**given)
            if callable(getattr(store, "alist_runs", None)):
                with pytest.raises(error, match=named):
                    asyncio.run(store.alist_runs(**given))
