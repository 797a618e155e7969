"""The store conformance checks of who may write a run: leases, releases, decisions, listings and the race.

Half of ``fsm_agent.testing.stores.StoreConformance`` (the other half,
``store_writes``, checks what a store holds).  Each test asks for the
``make_store`` fixture the subclass gives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from fsm_agent import (
    Agent,
    AgentLoopError,
    DecisionError,
    RunExistsError,
    RunLeasedError,
    StaleRunError,
)
from fsm_agent.testing import ManualClock, demo_registry, reply, tool_call, tool_turn
from fsm_agent.testing.store_kit import (
    LAPSE,
    LONG,
    RACERS,
    ROUNDS,
    SHORT,
    TRIES,
    MakeStore,
    ReopenStore,
    Script,
    adding_agent,
    closed,
    entry,
    fresh_snapshot,
    has_twin,
    need,
    race,
)


class OwnerChecks:
    """Which owner a store lets write a run, and when; decisions and listings; owners racing for one run."""

    # --- leases -----------------------------------------------------------------------------------------------

    def test_a_live_lease_refuses_every_other_owner_naming_the_holder(self, make_store: MakeStore) -> None:
        """While A holds the run, B's claim, append and renew are RunLeasedError with holder A; A's own go on."""
        store = make_store(LONG)
        base = fresh_snapshot("r")
        v = store.create("r", base, owner="A")
        writes: list[Callable[[], object]] = [
            partial(store.claim, "r", store.load("r"), owner="B"),
            partial(store.append, entry("r", v + 1, base), owner="B"),
            partial(store.renew, "r", owner="B", seq=v),
        ]
        for write in writes:
            with pytest.raises(RunLeasedError) as leased:
                write()
            assert (leased.value.holder, leased.value.stale) == ("A", False)
            assert "A" in str(leased.value)
        store.renew("r", owner="A", seq=v)
        store.append(entry("r", v + 1, base), owner="A")
        assert store.load("r")["stored_seq"] == v + 1

    def test_a_lapsed_lease_is_taken_over_and_the_old_owner_is_then_refused(self, make_store: MakeStore) -> None:
        """A's lease lapses unrenewed; B claims the run; A's next append, renew (and keep) are refused."""
        store = make_store(SHORT)
        base = fresh_snapshot("r")
        v = store.create("r", base, owner="A")
        time.sleep(LAPSE)
        taken = store.claim("r", store.load("r"), owner="B")
        assert taken == v + 1
        with pytest.raises(RunLeasedError):
            store.append(entry("r", v + 1, base, "A"), owner="A")
        with pytest.raises(RunLeasedError):
            store.renew("r", owner="A", seq=v)
        if callable(getattr(store, "keep", None)):
            with pytest.raises(RunLeasedError):
                store.keep("r", owner="A", seq=v)
        assert store.load("r")["stored_seq"] == taken

    def test_renew_is_checked_like_append_at_the_version_the_owner_names(self, make_store: MakeStore) -> None:
        """renew() at a version the run is not at is StaleRunError, from its holder too; it never takes a run back."""
        store = make_store(LONG)
        base = fresh_snapshot("r")
        v = store.create("r", base, owner="A")
        for seq in (v + 1, v - 1):
            with pytest.raises(StaleRunError) as stale:
                store.renew("r", owner="A", seq=seq)
            assert (stale.value.expected, stale.value.found) == (seq, v)
        store.renew("r", owner="A", seq=v, release=True)
        v = store.claim("r", store.load("r"), owner="B")
        store.renew("r", owner="B", seq=v, release=True)
        with pytest.raises(StaleRunError):
            store.renew("r", owner="A", seq=v - 1)  # A's last version: the run moved on without A since
        assert store.claim("r", store.load("r"), owner="C") == v + 1, "a refused renew took the run"
        with pytest.raises((KeyError, RunLeasedError)):
            store.renew("nobody", owner="A", seq=1)

    def test_keep_extends_only_the_holder_s_lease_and_never_takes_a_run_back(self, make_store: MakeStore) -> None:
        """keep() renews A's run at A's version; it is refused at another version, to B, and once A gave it up."""
        store = make_store(LONG)
        need(store, "keep")
        base = fresh_snapshot("r")
        v = store.create("r", base, owner="A")
        store.keep("r", owner="A", seq=v)
        with pytest.raises(RunLeasedError):
            store.keep("r", owner="A", seq=v + 1)
        with pytest.raises(RunLeasedError) as leased:
            store.keep("r", owner="B", seq=v)
        assert leased.value.holder == "A"
        store.renew("r", owner="A", seq=v, release=True)
        with pytest.raises(RunLeasedError):
            store.keep("r", owner="A", seq=v)  # renew() would take a free run back; keep() never does
        assert store.claim("r", store.load("r"), owner="B") == v + 1
        with pytest.raises(RunLeasedError):
            store.keep("r", owner="A", seq=v)
        store.keep("r", owner="B", seq=v + 1)

    def test_keep_moves_the_lease_on_so_a_kept_run_outlives_the_lease_it_was_taken_with(
        self, make_store: MakeStore
    ) -> None:
        """A keeps its run (keep, and akeep) every third of a SHORT lease for LAPSE: B's claim and renew are refused.

        So the engine's heartbeat keeps a run through a call longer than a
        lease.  A stalled machine can put a whole lease between A's last
        keep and B's try; such a try decides nothing and is made again
        (``TRIES``).
        """
        store = make_store(SHORT)
        need(store, "keep")
        beats = ["keep", *(["akeep"] if has_twin(store, "keep") else [])]

        async def beat(name: str, run_id: str, seq: int) -> None:
            if name == "akeep":
                await store.akeep(run_id, owner="A", seq=seq)
            else:
                store.keep(run_id, owner="A", seq=seq)

        async def kept(name: str, run_id: str) -> str | None:
            """Which of B's writes took the run A kept with ``name`` ("" if none did); None: a stall, undecided."""
            seq = store.create(run_id, fresh_snapshot(run_id), owner="A")
            began = time.monotonic()
            while True:
                last = time.monotonic()
                await beat(name, run_id, seq)
                if time.monotonic() - began >= LAPSE:  # the lease A's run was created with has lapsed for sure
                    break
                await asyncio.sleep(SHORT / 3)
                if time.monotonic() - last >= SHORT:
                    return None
            took = _another_owner_takes(store, run_id, seq) or ""
            return took if not took or time.monotonic() - last < SHORT else None

        async def main() -> list[str]:
            undecided = list(beats)
            for attempt in range(TRIES):
                for name in list(undecided):
                    took = await kept(name, f"{name}-{attempt}")
                    assert not took, f"{name}() left the lease where it was: B's {took} took the run A kept"
                    if took is not None:
                        undecided.remove(name)
            await closed(store)
            return undecided

        undecided = asyncio.run(main())
        if undecided:
            pytest.skip(f"the machine stalled a whole lease in each of {TRIES} tries of {', '.join(undecided)}()")

    def test_a_release_frees_the_run_at_once(self, make_store: MakeStore) -> None:
        """append(release=True) and renew(release=True) give the lease up: another owner claims with no wait."""
        store = make_store(LONG)
        base = fresh_snapshot("r")
        v = store.create("r", base, owner="A")
        store.append(entry("r", v + 1, base, release=True), owner="A")
        v = store.claim("r", store.load("r"), owner="B")
        store.renew("r", owner="B", seq=v, release=True)
        assert store.claim("r", store.load("r"), owner="C") == v + 1

    def test_a_finished_or_paused_run_is_free_for_anyone(self, make_store: MakeStore) -> None:
        """The engine's write that finishes or pauses a run gives its lease up: another owner claims it at once."""
        store = make_store(LONG)
        assert adding_agent(1).run("add", store=store, run_id="done").final == "added"
        paused = adding_agent(1, approve={"add"}).run("add", store=store, run_id="paused")
        assert paused.reason == "paused"
        for run_id in ("done", "paused"):
            loaded = store.load(run_id)
            assert store.claim(run_id, loaded, owner="B") == loaded["stored_seq"] + 1

    # --- decisions --------------------------------------------------------------------------------------------

    def test_decide_records_one_decision_and_refuses_what_it_must(self, make_store: MakeStore) -> None:
        """decide() on a pending call is stored once; the same decision again is taken as given, writing nothing;
        another decision, an unknown call, a bad value, a running or missing run is refused."""
        store = make_store(LONG)
        need(store, "decide")
        agent = adding_agent(1, approve={"add"})
        agent.run("add", store=store, run_id="paused")
        before = store.load("paused")
        decided = store.decide("paused", "c0", True)
        assert (decided["approvals"], decided["stored_seq"]) == ({"c0": True}, before["stored_seq"] + 1)
        assert store.load("paused") == decided
        assert store.decide("paused", "c0", True) == decided, "the same decision again wrote something"
        for call_id, decision in (("c0", "no"), ("c0", False), ("nope", True)):
            with pytest.raises(DecisionError) as refused:
                store.decide("paused", call_id, decision)
            assert (refused.value.run_id, refused.value.call_id) == ("paused", call_id)
        assert store.load("paused") == decided, "a refused decision changed the run"
        assert agent.resume(store.load("paused"), store=store).finish().final == "added"
        with pytest.raises(DecisionError, match="not paused"):
            store.decide("paused", "c0", True)
        with pytest.raises(KeyError):
            store.decide("never stored", "c0", True)
        agent.run("add", store=store, run_id="held")
        store.claim("held", store.load("held"), owner="A")
        with pytest.raises(RunLeasedError) as leased:
            store.decide("held", "c0", True)
        assert leased.value.holder == "A"
        for run_id in ("held", "never stored"):  # a bad value is named first, whatever the run's state
            with pytest.raises(TypeError, match="True, False or a reason text"):
                store.decide(run_id, "c0", 1)

    def test_decide_refuses_a_call_that_needs_no_approval_and_writes_nothing(self, make_store: MakeStore) -> None:
        """A pending call the run does not hold back (not in ``to_approve``): no person is asked about it, so a
        decision on it is a DecisionError naming it, and the run is stored as it was; the call then runs as usual."""
        store = make_store(LONG)
        need(store, "decide")
        calls = [tool_turn(tool_call("add", id="c0", a=1, b=1), tool_call("echo", id="c1", text="free")), reply("ok")]
        agent = Agent(Script(*calls), demo_registry(), clock=ManualClock(), approve={"add"})
        agent.run("add", store=store, run_id="paused")
        before = store.load("paused")
        for decision in (False, "", "not this one", True):
            with pytest.raises(DecisionError) as refused:
                store.decide("paused", "c1", decision)
            assert (refused.value.run_id, refused.value.call_id) == ("paused", "c1")
        assert store.load("paused") == before, "a refused decision changed the run"
        store.decide("paused", "c0", True)
        result = agent.resume(store.load("paused"), store=store).finish()
        assert [m.content for m in result.messages if m.role == "tool"] == ["2", '"free"']

    def test_false_and_an_empty_reason_are_one_decision(self, make_store: MakeStore) -> None:
        """A rejection with no reason, given as ``False`` or as ``""``: given again in the other spelling it is the
        same decision, taken as given and writing nothing; a reason text after it is another decision, refused."""
        store = make_store(LONG)
        need(store, "decide")
        both = [tool_turn(tool_call("add", id="c0", a=1, b=1), tool_call("add", id="c1", a=2, b=1)), reply("ok")]
        Agent(Script(*both), demo_registry(), clock=ManualClock(), approve={"add"}).run("add", store=store, run_id="p")
        for call_id, first, again in (("c0", False, ""), ("c1", "", False)):
            decided = store.decide("p", call_id, first)
            assert store.decide("p", call_id, again) == decided, f"{again!r} after {first!r} was refused or wrote"
            with pytest.raises(DecisionError):
                store.decide("p", call_id, "a reason after all")
            assert store.load("p") == decided

    # --- listing ----------------------------------------------------------------------------------------------

    def test_list_runs_filters_by_state_reason_time_and_session_and_pages(self, make_store: MakeStore) -> None:
        """list_runs: most recently saved first, each filter, limit and offset, steps of each run."""
        store = make_store(LONG)
        need(store, "list_runs")
        before = time.time() - 1
        adding_agent(1).run("add", store=store, run_id="done-1")
        time.sleep(0.01)
        with pytest.raises(AgentLoopError):
            adding_agent(3, max_steps=1).run("add", store=store, run_id="stopped")
        time.sleep(0.01)
        adding_agent(2).run("add", store=store, run_id="done-2")
        everything = store.list_runs()
        assert [r.run_id for r in everything] == ["done-2", "stopped", "done-1"]
        stored = [store.load(run.run_id) for run in everything]
        assert [(r.state, r.reason, r.paused, r.steps) for r in everything] == [
            (s["state"], s["reason"], False, len(s["steps"])) for s in stored
        ]
        assert [r.state for r in everything] == ["Done", "Failed", "Done"]
        assert [r.run_id for r in store.list_runs(state="Failed")] == ["stopped"]
        assert [r.run_id for r in store.list_runs(reason="done")] == ["done-2", "done-1"]
        assert [r.run_id for r in store.list_runs(limit=1, offset=1)] == ["stopped"]
        assert [r.run_id for r in store.list_runs(offset=2)] == ["done-1"]
        assert len(store.list_runs(since=before)) == 3
        assert store.list_runs(since=time.time() + 60) == []
        assert store.list_runs(session="no such conversation") == []

    def test_list_runs_names_the_run_and_transition_a_fork_was_made_from(self, make_store: MakeStore) -> None:
        """A run whose snapshot says ``forked_from: [source, at]`` lists it, after appends and a save too."""
        store = make_store(LONG)
        need(store, "list_runs")
        store.create("source", fresh_snapshot("source"), owner="A")
        fork = {**fresh_snapshot("fork"), "forked_from": ["source", 3]}
        seq = store.create("fork", fork, owner="A")
        store.append(entry("fork", seq + 1, fork, release=True), owner="A")
        listed = {run.run_id: run.forked_from for run in store.list_runs()}
        assert listed == {"source": None, "fork": ("source", 3)}
        store.save("fork", {**store.load("fork"), "forked_from": ["source", 4]})
        assert [run.forked_from for run in store.list_runs() if run.run_id == "fork"] == [("source", 4)]

    @pytest.mark.parametrize("name", ["state", "reason", "session"])
    def test_a_nul_or_lone_surrogate_in_a_list_runs_filter_is_a_value_error(
        self, make_store: MakeStore, name: str
    ) -> None:
        """list_runs(reason="\\x00") and the like are refused by name, the same in every store."""
        store = make_store(LONG)
        need(store, "list_runs")
        for value in ("\x00", "done\x00", "\ud800"):
            with pytest.raises(ValueError, match=f"list_runs {name} .* must be text without NUL or lone surrogates"):
                store.list_runs(**{name: value})
            if callable(getattr(store, "alist_runs", None)):
                with pytest.raises(ValueError, match=f"list_runs {name} .* must be text"):
                    asyncio.run(store.alist_runs(**{name: value}))

    # --- the race ---------------------------------------------------------------------------------------------

    def test_owners_racing_for_one_run_exactly_one_wins_each_write_and_nothing_is_lost(
        self, make_store: MakeStore
    ) -> None:
        """RACERS threads create, then claim, then append the same run at once: one wins each, the rest are refused."""
        store = make_store(LONG)
        _raced_for("r", [store] * RACERS)
        base = fresh_snapshot("r")
        separate = race([partial(store.create, f"r{i}", base, owner=f"o{i}") for i in range(RACERS)])
        assert not [o for o in separate if isinstance(o, Exception)], separate
        assert all(store.load(f"r{i}")["stored_seq"] == separate[i] for i in range(RACERS))

    def test_owners_racing_from_store_objects_of_their_own_exactly_one_wins_each_write(
        self, make_store: MakeStore, reopen_store: ReopenStore | None
    ) -> None:
        """RACERS threads, each with a store object of its own on one location (as processes have), race as above.

        A lock of the store object does not keep them apart: only the
        store's own transactions do, so a claim that checks in one and
        writes in the next lets two owners take one run, but only when the
        threads happen to interleave there: raced ``ROUNDS`` times, on a run
        each.
        """
        if reopen_store is None:
            pytest.skip("override the reopen_store fixture to check owners racing from store objects of their own")
        store = make_store(LONG)
        objects = [store, *(reopen_store(LONG) for _ in range(RACERS - 1))]
        for round_ in range(ROUNDS):
            _raced_for(f"r{round_}", objects)

    def test_people_deciding_at_once_on_two_calls_both_decisions_are_kept(self, make_store: MakeStore) -> None:
        """Two decide() calls on two pending calls of one paused run, at once: both stored, one version each."""
        store = make_store(LONG)
        need(store, "decide")
        both = [tool_turn(tool_call("add", id="c0", a=1, b=1), tool_call("add", id="c1", a=2, b=1)), reply("added")]
        agent = Agent(Script(*both), demo_registry(), clock=ManualClock(), approve={"add"})
        agent.run("add", store=store, run_id="paused")
        before = store.load("paused")["stored_seq"]
        outcomes = race([partial(store.decide, "paused", call_id, True) for call_id in ("c0", "c1")])
        assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
        stored = store.load("paused")
        assert (stored["approvals"], stored["stored_seq"]) == ({"c0": True, "c1": True}, before + 2)


def _raced_for(run_id: str, objects: list[Any]) -> None:
    """Racer ``i`` creates, claims, then appends ``run_id`` through ``objects[i]``: exactly one wins each write."""
    store, base = objects[0], fresh_snapshot(run_id)
    created = race([partial(objects[i].create, run_id, base, owner=f"o{i}") for i in range(RACERS)])
    winners = [i for i, outcome in enumerate(created) if not isinstance(outcome, Exception)]
    assert len(winners) == 1, created
    assert all(isinstance(o, RunExistsError) for i, o in enumerate(created) if i != winners[0]), created
    v = created[winners[0]]
    store.renew(run_id, owner=f"o{winners[0]}", seq=v, release=True)

    read = store.load(run_id)
    claimed = race([partial(objects[i].claim, run_id, read, owner=f"o{i}") for i in range(RACERS)])
    winners = [i for i, outcome in enumerate(claimed) if not isinstance(outcome, Exception)]
    assert len(winners) == 1, claimed
    assert all(isinstance(o, RunLeasedError) for i, o in enumerate(claimed) if i != winners[0]), claimed
    assert claimed[winners[0]] == v + 1
    store.renew(run_id, owner=f"o{winners[0]}", seq=v + 1, release=True)

    appended = race([partial(objects[i].append, entry(run_id, v + 2, base, i), owner=f"o{i}") for i in range(RACERS)])
    winners = [i for i, outcome in enumerate(appended) if not isinstance(outcome, Exception)]
    assert len(winners) == 1, appended
    assert all(isinstance(o, RunLeasedError) for i, o in enumerate(appended) if i != winners[0]), appended
    loaded = store.load(run_id)
    assert (loaded["stored_seq"], loaded["evidence"]) == (v + 2, {"mark": winners[0]})


def _another_owner_takes(store: Any, run_id: str, seq: int) -> str | None:
    """Which of B's claim and renew took A's run (``None``: both refused, naming A)."""
    for name, attempt in (
        ("claim", partial(store.claim, run_id, store.load(run_id), owner="B")),
        ("renew", partial(store.renew, run_id, owner="B", seq=seq)),
    ):
        try:
            attempt()
        except RunLeasedError as leased:
            holder = leased.holder
        else:
            return name
        assert holder == "A", f"B's {name} was refused naming {holder!r}, not the holder A"
    return None
