"""The store conformance checks of the async twins: each keeps the rules of its sync method.

Part of ``fsm_agent.testing.stores.StoreConformance``, beside ``store_writes``
and ``store_owners``.  The async driver awaits ``acreate``, ``aclaim``,
``aappend`` and the rest where a store has them, and an async web handler
awaits ``adecide`` and ``alist_runs``: a twin that keeps other rules than its
sync method breaks a run only when it is awaited, so each is checked on its
own.  Each check asks for the ``make_store`` fixture the subclass gives, and
is skipped (naming the method) for a store without the twins it checks.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from fsm_agent import AgentLoopError, DecisionError, RunExistsError, RunLeasedError, StaleRunError
from fsm_agent.persist.cursor import RunCursor
from fsm_agent.testing.store_kit import (
    LONG,
    MakeStore,
    adding_agent,
    closed,
    entry,
    fresh_snapshot,
    has_twin,
    need,
    need_twin,
)


class TwinChecks:
    """The async twins, where a store has them: each takes and refuses what its sync method takes and refuses."""

    def test_the_async_driver_stores_the_run_it_returns(self, make_store: MakeStore) -> None:
        """arun with the store (its async twins, or its sync methods in a thread) leaves the result stored."""
        store = make_store(LONG)

        async def main() -> Any:
            result = await adding_agent(2).arun("add", store=store, run_id="r")
            await closed(store)
            return result

        result = asyncio.run(main())
        loaded = store.load("r")
        assert (loaded["state"], loaded["final"], len(loaded["steps"])) == ("Done", result.final, len(result.steps))

    def test_each_async_twin_does_what_its_sync_method_does(self, make_store: MakeStore) -> None:
        """acreate, aappend, arenew, akeep, aclaim, aload and asave, where the store has them, keep the same rules."""
        store = make_store(LONG)
        twins = [
            name for name in ("create", "append", "renew", "keep", "claim", "load", "save") if has_twin(store, name)
        ]
        if not twins:
            pytest.skip(f"{type(store).__name__} has no async twins (the async driver runs its methods in a thread)")
        base = fresh_snapshot("r")

        async def call(name: str, *args: Any, **kwargs: Any) -> Any:
            if name in twins:
                return await getattr(store, f"a{name}")(*args, **kwargs)
            return getattr(store, name)(*args, **kwargs)

        async def main() -> None:
            v = await call("create", "r", base, owner="A")
            with pytest.raises(RunExistsError):
                await call("create", "r", base, owner="A")
            await call("append", entry("r", v + 1, base, 1), owner="A")
            with pytest.raises(StaleRunError):
                await call("append", entry("r", v + 1, base, 2), owner="A")
            with pytest.raises(RunLeasedError):
                await call("renew", "r", owner="B", seq=v + 1)
            if callable(getattr(store, "keep", None)):
                await call("keep", "r", owner="A", seq=v + 1)
            loaded = await call("load", "r")
            assert loaded == store.load("r")
            assert (loaded["stored_seq"], loaded["evidence"]) == (v + 1, {"mark": 1})
            with pytest.raises(RunLeasedError):
                await call("claim", "r", loaded, owner="B")
            await call("renew", "r", owner="A", seq=v + 1, release=True)
            assert await call("claim", "r", loaded, owner="B") == v + 2
            await call("renew", "r", owner="B", seq=v + 2, release=True)
            assert await call("save", "r", await call("load", "r")) == v + 3
            await closed(store)

        asyncio.run(main())

    def test_each_async_twin_refuses_what_its_sync_method_refuses(self, make_store: MakeStore) -> None:
        """Where the store has them, the twins refuse what the sync methods do: the async driver writes with them.

        ``arenew`` at a version the run is not at, ``akeep`` of a run its
        owner gave up or another owner took (it never takes a run back),
        ``asave`` and ``aclaim`` of a version the run moved past or under
        another owner's live lease: each is refused, and nothing is changed.
        """
        store = make_store(LONG)
        twins = [
            name for name in ("create", "append", "renew", "keep", "claim", "load", "save") if has_twin(store, name)
        ]
        if not twins:
            pytest.skip(f"{type(store).__name__} has no async twins (the async driver runs its methods in a thread)")
        keeps = "keep" in twins or callable(getattr(store, "keep", None))
        base = fresh_snapshot("r")

        async def call(name: str, *args: Any, **kwargs: Any) -> Any:
            if name in twins:
                return await getattr(store, f"a{name}")(*args, **kwargs)
            return getattr(store, name)(*args, **kwargs)

        async def refused(error: type[Exception], name: str, *args: Any, **kwargs: Any) -> Exception:
            before = store.load("r")
            with pytest.raises(error) as refusal:
                await call(name, *args, **kwargs)
            assert store.load("r") == before, f"a refused {name} changed the run"
            return refusal.value

        async def main() -> None:
            v = await call("create", "r", base, owner="A")
            read = await call("load", "r")
            for name, args, kwargs in (
                ("create", ("r", fresh_snapshot("r", "another")), {"owner": "B", "overwrite": True}),
                ("claim", ("r", read), {"owner": "B"}),
                ("save", ("r", read), {}),
                ("renew", ("r",), {"owner": "B", "seq": v}),
            ):
                leased = await refused(RunLeasedError, name, *args, **kwargs)
                assert getattr(leased, "holder", None) == "A", f"{name} refused naming {leased!r}, not the holder A"
            for seq in (v + 1, v - 1):
                await refused(StaleRunError, "renew", "r", owner="A", seq=seq)
                if keeps:
                    await refused(RunLeasedError, "keep", "r", owner="A", seq=seq)
            if keeps:
                await refused(RunLeasedError, "keep", "r", owner="B", seq=v)
            await call("append", entry("r", v + 1, base, 1), owner="A")
            await refused(StaleRunError, "claim", "r", read, owner="A")
            await call("renew", "r", owner="A", seq=v + 1, release=True)
            if keeps:
                await refused(RunLeasedError, "keep", "r", owner="A", seq=v + 1)  # given up: keep never takes it back
            await refused(StaleRunError, "save", "r", read)
            await refused(StaleRunError, "claim", "r", read, owner="B")
            await refused(StaleRunError, "renew", "r", owner="A", seq=v)
            current = await call("load", "r")
            assert await call("save", "r", current) == v + 2
            await refused(StaleRunError, "save", "r", current)
            assert await call("claim", "r", await call("load", "r"), owner="B") == v + 3
            if keeps:
                await refused(RunLeasedError, "keep", "r", owner="A", seq=v + 1)
            await refused(RunLeasedError, "save", "r", await call("load", "r"))  # B's lease is live
            await closed(store)

        asyncio.run(main())

    def test_adecide_records_one_decision_and_refuses_what_decide_refuses(self, make_store: MakeStore) -> None:
        """adecide keeps decide's rules: one decision stored, the same again taken as given, the rest refused.

        A person deciding from an async web handler goes through
        ``adecide``: another decision on a decided call, an unknown call, a
        bad value, a run someone holds or no run at all is refused there as
        ``decide`` refuses it, and nothing is written.
        """
        store = make_store(LONG)
        need(store, "decide")
        need_twin(store, "decide")
        agent = adding_agent(1, approve={"add"})
        agent.run("add", store=store, run_id="paused")
        agent.run("add", store=store, run_id="held")
        store.claim("held", store.load("held"), owner="A")
        before = store.load("paused")

        async def refused(error: type[Exception], run_id: str, call_id: str, decision: Any) -> Exception:
            with pytest.raises(error) as refusal:
                await store.adecide(run_id, call_id, decision)
            return refusal.value

        async def main() -> dict[str, Any]:
            decided: dict[str, Any] = await store.adecide("paused", "c0", "not now")
            assert (decided["approvals"], decided["stored_seq"]) == ({"c0": "not now"}, before["stored_seq"] + 1)
            assert store.load("paused") == decided
            assert await store.adecide("paused", "c0", "not now") == decided, "the same decision again wrote"
            for call_id, decision in (("c0", True), ("c0", False), ("c0", "later"), ("nope", True)):
                overruled = await refused(DecisionError, "paused", call_id, decision)
                assert (getattr(overruled, "run_id", None), getattr(overruled, "call_id", None)) == ("paused", call_id)
            assert store.load("paused") == decided, "a refused adecide changed the run"
            await refused(KeyError, "never stored", "c0", True)
            leased = await refused(RunLeasedError, "held", "c0", True)
            assert getattr(leased, "holder", None) == "A", f"adecide refused naming {leased!r}, not the holder A"
            for run_id in ("held", "never stored"):  # a bad value is named first, whatever the run's state
                with pytest.raises(TypeError, match="True, False or a reason text"):
                    await store.adecide(run_id, "c0", 1)
            await closed(store)
            return decided

        decided = asyncio.run(main())
        assert store.load("paused") == decided
        with pytest.raises(DecisionError):
            store.decide("paused", "c0", True)  # what adecide stored, decide reads

    def test_alist_runs_lists_what_list_runs_lists_with_each_filter_and_page(self, make_store: MakeStore) -> None:
        """alist_runs gives what list_runs gives, by state, reason, session, time, limit and offset, by cursor."""
        store = make_store(LONG)
        need(store, "list_runs")
        need_twin(store, "list_runs")
        before = time.time() - 1
        adding_agent(1).run("add", store=store, run_id="done")
        for run_id in ("chat-1", "chat-2"):
            time.sleep(0.01)
            seq = store.create(run_id, {**fresh_snapshot(run_id), "session_id": "chat"}, owner="A")
            store.renew(run_id, owner="A", seq=seq, release=True)
        time.sleep(0.01)
        with pytest.raises(AgentLoopError):
            adding_agent(3, max_steps=1).run("add", store=store, run_id="stopped")
        first = store.list_runs(order="created", limit=2)
        filters: list[tuple[dict[str, Any], list[str]]] = [
            ({}, ["stopped", "chat-2", "chat-1", "done"]),
            ({"session": "chat"}, ["chat-2", "chat-1"]),
            ({"session": "chat", "limit": 1, "offset": 1}, ["chat-1"]),
            ({"state": "Failed"}, ["stopped"]),
            ({"state": "Done", "reason": "done"}, ["done"]),
            ({"limit": 2, "offset": 1}, ["chat-2", "chat-1"]),
            ({"since": before}, ["stopped", "chat-2", "chat-1", "done"]),
            ({"since": time.time() + 60}, []),
            ({"order": "created", "limit": 2}, ["stopped", "chat-2"]),
            ({"order": "created", "limit": 2, "after": RunCursor.of(first[-1])}, ["chat-1", "done"]),
            ({"order": "created", "session": "chat", "after": RunCursor.of(first[0])}, ["chat-2", "chat-1"]),
        ]

        async def main() -> list[list[Any]]:
            listed = [await store.alist_runs(**given) for given, _ in filters]
            await closed(store)
            return listed

        for (given, expected), awaited in zip(filters, asyncio.run(main()), strict=True):
            assert [run.run_id for run in awaited] == expected, f"alist_runs({given})"
            assert awaited == store.list_runs(**given), f"alist_runs({given}) differs from list_runs({given})"
