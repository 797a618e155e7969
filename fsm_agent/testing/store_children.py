"""The store conformance checks of ``list_runs(parent=...)``: a run's sub-agent runs, listed in one read.

Part of ``fsm_agent.testing.stores.StoreConformance``.  A sub-agent call's run
is stored beside its parent's, its snapshot naming the parent run and call
(``parent_run_id``, ``parent_call_id``); the run viewer shows where each
child of a run stands by listing them with ``list_runs(parent=run_id)`` at
every poll, instead of loading each.  A store must list exactly those runs
(a grandchild is its own parent's, not its grandparent's), say for each the
call it ran for (``StoredRun.parent``), combine the filter with the others
and with paging as it does ``session``, and refuse a NUL as it refuses one in
any filter.  Each test is skipped for a store without ``list_runs``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fsm_agent import Agent, ToolRegistry
from fsm_agent.persist.cursor import RunCursor
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.testing.store_kit import LONG, MakeStore, Script, adding_agent, closed, need

PARENT = "boss"
"""The run whose sub-agent runs the checks list."""


def family(store: Any, calls: int = 2, *, run_id: str = PARENT) -> Agent:
    """``run_id`` run to its end: ``calls`` sub-agent calls ``h0``, ``h1``, ... of ``helper``, each calling ``deeper``.

    So the store holds ``run_id``, its children ``run_id/h0``, ... and each
    child's own child ``run_id/h0/d0`` (a grandchild of ``run_id``).
    """
    grandchild = adding_agent(1)
    below = ToolRegistry()
    below.register(grandchild.as_tool("deeper", "Adds one."))
    asks = Script(tool_turn(tool_call("deeper", id="d0", input="add")), reply("helped"))
    child = Agent(asks, below, clock=ManualClock())
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "Helps."))
    turn = tool_turn(*(tool_call("helper", id=f"h{i}", input=f"help {i}") for i in range(calls)))
    agent = Agent(Script(turn, reply("all helped")), tools, clock=ManualClock())
    result = agent.run("get help", store=store, run_id=run_id)
    assert (result.reason, result.final) == ("done", "all helped"), result
    return agent


def _by_parent(store: Any, parent: str, **filters: Any) -> list[Any]:
    """``store.list_runs(parent=parent, **filters)``; a ``list_runs`` that takes no ``parent`` fails, saying so."""
    try:
        return list(store.list_runs(parent=parent, **filters))
    except TypeError as exc:
        if "parent" not in str(exc):
            raise
        pytest.fail(f"list_runs takes no parent= (FullStore lists a run's sub-agent runs by it): {exc}")


def _links(runs: Any) -> dict[str, Any]:
    return {run.run_id: run.parent for run in runs}


class ChildrenChecks:
    """``list_runs(parent=...)``: a run's sub-agent runs and the call each ran for, filtered and paged."""

    def test_listing_by_parent_gives_the_run_s_sub_agent_runs_each_with_its_call_and_no_grandchild(
        self, make_store: MakeStore
    ) -> None:
        """boss called helper twice (h0, h1), each helper called deeper: boss lists h0 and h1, each h its d0."""
        store = make_store(LONG)
        need(store, "list_runs")
        family(store)
        adding_agent(1).run("add", store=store, run_id="stranger")
        assert _links(_by_parent(store, PARENT)) == {f"{PARENT}/h0": (PARENT, "h0"), f"{PARENT}/h1": (PARENT, "h1")}
        for call in ("h0", "h1"):
            child = f"{PARENT}/{call}"
            assert _links(_by_parent(store, child)) == {f"{child}/d0": (child, "d0")}, "a child's own child"
            assert _by_parent(store, f"{child}/d0") == [], "a run without sub-agent calls has no children"
        everything = {run.run_id: run for run in store.list_runs()}
        assert {everything[run_id].parent for run_id in (PARENT, "stranger")} == {None}, "a run no call's has a parent"
        assert everything[f"{PARENT}/h0/d0"].parent == (f"{PARENT}/h0", "d0"), "list_runs() says each run's parent"
        assert _by_parent(store, "nobody") == []
        assert _by_parent(store, PARENT[:-1]) == [], "the parent filter matches a run id whole, not its start"

    def test_the_parent_filter_combines_with_the_other_filters_and_pages_by_cursor_and_offset(
        self, make_store: MakeStore
    ) -> None:
        """Five children: pages of two by cursor give each once, in creation order; state, offset and limit apply."""
        store = make_store(LONG)
        need(store, "list_runs")
        family(store, calls=5)
        whole = _by_parent(store, PARENT, order="created")
        assert sorted(run.run_id for run in whole) == [f"{PARENT}/h{i}" for i in range(5)]
        pages = [_by_parent(store, PARENT, order="created", limit=2)]
        for _ in range(4):  # three pages and the empty one: a cursor that repeats its run never ends, so a bound
            if not pages[-1]:
                break
            pages.append(_by_parent(store, PARENT, order="created", limit=2, after=RunCursor.of(pages[-1][-1])))
        assert [run.run_id for page in pages for run in page] == [run.run_id for run in whole]
        assert [len(page) for page in pages] == [2, 2, 1, 0], "a page of the filtered runs holds others"
        by_offset = _by_parent(store, PARENT, order="created", limit=2, offset=2)
        assert [run.run_id for run in by_offset] == [run.run_id for run in whole[2:4]]
        assert len(_by_parent(store, PARENT, state="Done", reason="done")) == 5
        assert _by_parent(store, PARENT, state="Failed") == []
        assert _by_parent(store, PARENT, session="a conversation") == []
        latest = max(run.updated for run in whole)
        assert _links(_by_parent(store, PARENT, since=latest)) == _links(r for r in whole if r.updated >= latest)
        assert _by_parent(store, PARENT, limit=1) == _by_parent(store, PARENT)[:1]

    def test_a_parent_with_a_nul_is_refused_as_any_filter_is(self, make_store: MakeStore) -> None:
        """``parent="bo\\x00ss"``: the ``ValueError`` naming the filter that a NUL in ``session`` is, awaited too."""
        store = make_store(LONG)
        need(store, "list_runs")
        family(store, calls=1)
        with pytest.raises(ValueError, match="parent"):
            _by_parent(store, "bo\x00ss")
        if callable(getattr(store, "alist_runs", None)):
            with pytest.raises(ValueError, match="parent"):
                asyncio.run(store.alist_runs(parent="bo\x00ss"))

    def test_alist_runs_lists_by_parent_as_list_runs_does(self, make_store: MakeStore) -> None:
        """Awaited, by parent, filtered and paged by cursor: the very runs ``list_runs`` gives."""
        store = make_store(LONG)
        need(store, "list_runs")
        if not callable(getattr(store, "alist_runs", None)):
            pytest.skip(f"{type(store).__name__} has no alist_runs() (an async twin, each optional on its own)")
        family(store, calls=3)
        first = _by_parent(store, PARENT, order="created", limit=2)

        async def awaited() -> list[list[Any]]:
            try:
                return [
                    await store.alist_runs(parent=PARENT),
                    await store.alist_runs(parent=f"{PARENT}/h1"),
                    await store.alist_runs(parent=PARENT, order="created", after=RunCursor.of(first[-1])),
                ]
            finally:
                await closed(store)

        every, below, rest = asyncio.run(awaited())
        assert every == _by_parent(store, PARENT)
        assert _links(below) == {f"{PARENT}/h1/d0": (f"{PARENT}/h1", "d0")}
        created = _by_parent(store, PARENT, order="created")
        assert [run.run_id for run in first + rest] == [run.run_id for run in created]
