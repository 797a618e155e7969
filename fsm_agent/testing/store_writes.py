"""The store conformance checks of what a store holds: versioned writes, rebuilt snapshots, refusals, async twins.

Half of ``fsm_agent.testing.stores.StoreConformance`` (the other half,
``store_owners``, checks who may write).  Each test asks for the
``make_store`` fixture the subclass gives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from fsm_agent import (
    AgentLoopError,
    RunExistsError,
    RunLeasedError,
    SnapshotError,
    StaleRunError,
)
from fsm_agent.persist.store import JournaledStore
from fsm_agent.testing.store_kit import (
    BAD_SNAPSHOTS,
    LONG,
    LoseEntry,
    MakeStore,
    adding_agent,
    entry,
    fresh_snapshot,
    has_twin,
    plain,
    without_version,
)


class WriteChecks:
    """Which writes a store takes and what it then holds; refusals of what no store may hold."""

    # --- the declared protocol --------------------------------------------------------------------------------

    def test_the_store_is_a_journaled_store(self, make_store: MakeStore) -> None:
        """It has every method of ``JournaledStore``, so the engine journals, leases and versions its runs."""
        store = make_store(LONG)
        assert isinstance(store, JournaledStore), "the engine would save whole snapshots, without leases"

    # --- versioned writes -------------------------------------------------------------------------------------

    def test_create_stores_a_new_run_at_a_version_and_refuses_a_taken_id(self, make_store: MakeStore) -> None:
        """create returns the version load then carries; a taken id is RunExistsError unless overwrite=True."""
        store = make_store(LONG)
        base = fresh_snapshot("r")
        version = store.create("r", base, owner="A")
        assert type(version) is int, f"create returned {version!r}, not a version"
        loaded = store.load("r")
        assert loaded["stored_seq"] == version
        assert without_version(loaded) == base
        with pytest.raises(RunExistsError) as exists:
            store.create("r", fresh_snapshot("r", "another"), owner="A")
        assert exists.value.run_id == "r"
        assert store.load("r") == loaded
        with pytest.raises(RunLeasedError) as leased:
            store.create("r", fresh_snapshot("r", "another"), owner="B", overwrite=True)
        assert leased.value.holder == "A"
        store.create("r", fresh_snapshot("r", "another"), owner="A", overwrite=True)
        assert store.load("r")["messages"][0]["content"] == "another"
        with pytest.raises(KeyError):
            store.load("never stored")

    def test_append_takes_only_the_next_version_from_the_holder(self, make_store: MakeStore) -> None:
        """append at seq + 1 is applied; a replayed or skipped one is StaleRunError, another owner's RunLeasedError."""
        store = make_store(LONG)
        base = fresh_snapshot("r")
        v = store.create("r", base, owner="A")
        store.append(entry("r", v + 1, base, 1), owner="A")
        loaded = store.load("r")
        assert (loaded["stored_seq"], loaded["evidence"]) == (v + 1, {"mark": 1})
        for seq in (v + 1, v + 3, v):
            with pytest.raises(StaleRunError) as stale:
                store.append(entry("r", seq, base, "late"), owner="A")
            assert (stale.value.expected, stale.value.found) == (seq - 1, v + 1)
        with pytest.raises(RunLeasedError) as leased:
            store.append(entry("r", v + 2, base, "thief"), owner="B")
        assert (leased.value.holder, leased.value.stale) == ("A", False)
        assert store.load("r") == loaded
        with pytest.raises((KeyError, RunLeasedError)):
            store.append(entry("nobody", 2, base), owner="A")

    def test_claim_and_save_are_compare_and_set_on_the_version_read(self, make_store: MakeStore) -> None:
        """A claim or save built on a version the run moved past is StaleRunError; at the current one it is taken."""
        store = make_store(LONG)
        base = fresh_snapshot("r")
        v = store.create("r", base, owner="A")
        read = store.load("r")
        store.append(entry("r", v + 1, base, 1), owner="A")
        with pytest.raises(StaleRunError) as stale:
            store.claim("r", read, owner="A")
        assert (stale.value.expected, stale.value.found) == (v, v + 1)
        with pytest.raises(RunLeasedError):
            store.save("r", store.load("r"))  # A's lease is live
        assert store.claim("r", store.load("r"), owner="A") == v + 2
        store.renew("r", owner="A", seq=v + 2, release=True)
        current = store.load("r")
        assert store.save("r", current) == v + 3
        with pytest.raises(StaleRunError):
            store.save("r", current)
        with pytest.raises(StaleRunError):
            store.claim("new", {**base, "run_id": "new", "stored_seq": 4}, owner="A")  # read from no such run

    def test_load_rebuilds_the_run_object_s_snapshot_after_each_write(self, make_store: MakeStore) -> None:
        """Driven by the engine, each write leaves load() equal to the run's own snapshot, and the end too."""
        store = make_store(LONG)
        run = adding_agent(3).start("add", store=store, run_id="r")
        assert store.load("r") == plain(run.snapshot())
        versions = {store.load("r")["stored_seq"]}
        while not run.done:
            run.advance()
            loaded = store.load("r")
            if loaded["stored_seq"] not in versions:
                versions.add(loaded["stored_seq"])
                assert loaded == plain(run.snapshot()), f"after {run.trace[-1].source}->{run.trace[-1].dest}"
        assert store.load("r") == plain(run.snapshot())
        assert store.load("r")["final"] == "added"
        assert len(versions) >= 4, "fewer writes than the run's calls"

    def test_a_resumed_run_goes_on_from_the_store_and_makes_no_call_twice(self, make_store: MakeStore) -> None:
        """A run stopped on its step limit resumes from load() in a new agent, to the answer, each call once."""
        store = make_store(LONG)
        with pytest.raises(AgentLoopError):
            adding_agent(3, max_steps=2).run("add", store=store, run_id="r")
        stopped = store.load("r")
        assert (stopped["state"], stopped["reason"]) == ("Failed", "max_steps")
        result = adding_agent(3).resume(stopped, store=store, max_steps=10).finish()
        assert [step.detail for step in result.steps] == [
            'add({"a": 0, "b": 1}) -> 1',
            'add({"a": 1, "b": 1}) -> 2',
            'add({"a": 2, "b": 1}) -> 3',
            "added",
        ]
        stored = store.load("r")
        assert (stored["state"], stored["final"]) == ("Done", "added")
        answered = [m["tool_call_id"] for m in stored["messages"] if m.get("role") == "tool"]
        assert answered == ["c0", "c1", "c2"], "a call was made twice, or one was lost"

    # --- what a store never holds -----------------------------------------------------------------------------

    @pytest.mark.parametrize(("corrupt", "message"), BAD_SNAPSHOTS.values(), ids=list(BAD_SNAPSHOTS))
    def test_save_refuses_a_malformed_snapshot_naming_the_field_and_writes_nothing(
        self, make_store: MakeStore, corrupt: Callable[[dict[str, Any]], dict[str, Any]], message: str
    ) -> None:
        """save checks a snapshot as a resume would: a bad one is a SnapshotError and the store is unchanged."""
        store = make_store(LONG)
        adding_agent(1).run("add", store=store, run_id="good")
        good = store.load("good")
        bad = corrupt(good)
        with pytest.raises(SnapshotError, match=message):
            store.save("good", bad)
        with pytest.raises(SnapshotError, match=message):
            store.save("new", {k: v for k, v in bad.items() if k != "stored_seq"})
        assert store.load("good") == good
        with pytest.raises(KeyError):
            store.load("new")
        assert store.save("good", good) == good["stored_seq"] + 1  # the snapshot as loaded is saved as ever

    @pytest.mark.parametrize("lost", ["first", "middle", "last"])
    def test_a_journal_missing_an_entry_is_refused_naming_the_version(
        self, make_store: MakeStore, lose_entry: LoseEntry | None, lost: str
    ) -> None:
        """A journal entry lost behind the store's back is a SnapshotError naming its version, never a quiet run."""
        if lose_entry is None:
            pytest.skip("override the lose_entry fixture to check a journal that lost an entry")
        store = make_store(LONG)
        base = fresh_snapshot("r")
        v = store.create("r", base, owner="A")
        for seq in range(v + 1, v + 5):
            store.append(entry("r", seq, base, seq), owner="A")
        gone = {"first": v + 1, "middle": v + 2, "last": v + 4}[lost]
        lose_entry("r", gone)
        with pytest.raises(SnapshotError, match=rf"version {gone}\b"):
            store.load("r")
        if callable(getattr(store, "aload", None)):
            with pytest.raises(SnapshotError, match=rf"version {gone}\b"):
                asyncio.run(store.aload("r"))

    # --- awaited ----------------------------------------------------------------------------------------------

    def test_the_async_driver_stores_the_run_it_returns(self, make_store: MakeStore) -> None:
        """arun with the store (its async twins, or its sync methods in a thread) leaves the result stored."""
        store = make_store(LONG)

        async def main() -> Any:
            result = await adding_agent(2).arun("add", store=store, run_id="r")
            aclose = getattr(store, "aclose", None)
            if aclose is not None:
                await aclose()
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
            aclose = getattr(store, "aclose", None)
            if aclose is not None:
                await aclose()

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
            aclose = getattr(store, "aclose", None)
            if aclose is not None:
                await aclose()

        asyncio.run(main())
