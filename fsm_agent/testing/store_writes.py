"""The store conformance checks of what a store holds: versioned writes, rebuilt snapshots, refusals, deletions.

Part of ``fsm_agent.testing.stores.StoreConformance`` (``store_owners``
checks who may write, ``store_twins`` the async twins, ``store_listing`` the
paging).  Each test asks for the ``make_store`` fixture the subclass gives.
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
    need,
    plain,
    without_version,
)


class WriteChecks:
    """Which writes a store takes and what it then holds; refusals of what no store may hold; forgetting a run."""

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

    def test_a_version_read_before_a_delete_names_no_version_of_the_run_started_again(
        self, make_store: MakeStore
    ) -> None:
        """Deleted and started again under its id, a run counts its versions from 1 again: a snapshot of the deleted
        run names a version of the new one, and its claim or save is StaleRunError, nothing written (``start_id``)."""
        store = make_store(LONG)
        need(store, "delete")
        v = store.create("r", fresh_snapshot("r", "the first run"), owner="A")
        store.renew("r", owner="A", seq=v, release=True)
        read = store.load("r")
        assert store.delete("r")
        assert store.create("r", fresh_snapshot("r", "the second run"), owner="B") == v
        store.renew("r", owner="B", seq=v, release=True)
        kept = store.load("r")
        with pytest.raises(StaleRunError) as stale:
            store.claim("r", read, owner="A")
        assert "deleted and started again" in str(stale.value)
        with pytest.raises(StaleRunError):
            store.save("r", read)
        assert store.load("r") == kept, "a snapshot of the deleted run replaced the new one"

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

    # --- forgetting -------------------------------------------------------------------------------------------

    def test_delete_forgets_the_run_its_journal_and_its_lease_and_frees_its_id(self, make_store: MakeStore) -> None:
        """After delete(r), r is gone: load is KeyError, it is not listed, and another owner creates r anew.

        A's run is deleted while A's lease on it is live: the lease goes with
        it (B's create is neither RunExistsError nor RunLeasedError), and what
        B then loads is B's run alone, no journal entry of A's.
        """
        store = make_store(LONG)
        need(store, "delete")
        base = fresh_snapshot("r")
        v = store.create("r", base, owner="A")
        store.append(entry("r", v + 1, base, "A's"), owner="A")
        adding_agent(1).run("add", store=store, run_id="other")
        other = store.load("other")
        assert store.delete("r") is True
        with pytest.raises(KeyError):
            store.load("r")
        if callable(getattr(store, "list_runs", None)):
            assert [run.run_id for run in store.list_runs()] == ["other"], "a deleted run is still listed"
        assert store.delete("r") is False
        assert store.delete("never stored") is False
        again = fresh_snapshot("r", "again")
        store.create("r", again, owner="B")
        assert without_version(store.load("r")) == again, "the deleted run came back"
        with pytest.raises(RunLeasedError) as leased:
            store.append(entry("r", v + 2, base, "A's"), owner="A")
        assert leased.value.holder == "B"
        assert store.load("other") == other, "delete(r) changed another run"

    def test_delete_finished_forgets_the_done_and_failed_runs_only(self, make_store: MakeStore) -> None:
        """delete_finished forgets Done and Failed runs, once old enough; a paused run and a running one stay."""
        store = make_store(LONG)
        need(store, "delete_finished")
        adding_agent(1).run("add", store=store, run_id="done")
        with pytest.raises(AgentLoopError):
            adding_agent(3, max_steps=1).run("add", store=store, run_id="failed")
        adding_agent(1, approve={"add"}).run("add", store=store, run_id="paused")
        base = fresh_snapshot("running")
        v = store.create("running", base, owner="A")
        kept = {run_id: store.load(run_id) for run_id in ("paused", "running")}
        assert store.delete_finished(older_than=LONG) == 0, "it forgot runs saved just now, not a minute ago"
        assert store.load("done")["state"] == "Done"
        assert store.delete_finished() == 2
        for run_id in ("done", "failed"):
            with pytest.raises(KeyError):
                store.load(run_id)
        assert {run_id: store.load(run_id) for run_id in kept} == kept, "it forgot or changed an unfinished run"
        if callable(getattr(store, "list_runs", None)):
            assert sorted(run.run_id for run in store.list_runs()) == ["paused", "running"]
        store.append(entry("running", v + 1, base), owner="A")  # the running run's owner holds it still
        assert store.delete_finished() == 0
