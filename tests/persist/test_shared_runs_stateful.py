"""Two owners interleaved on one stored run: load, decide, resume, advance, crash and lapse, in any order.

Hypothesis drives two owners (two processes, or a person and a retried
handler) over one paused run in a real SQLite store.  Each may load the run,
decide a call in the store, resume its (possibly stale) snapshot with or
without ``approve=`` and with decisions of its own, decide on its live run
object, advance it, or crash (its lease then lapses).  After every step:

- no call ran twice;
- no call ran that nobody approved, nor one whose rejection the store took;
- no decision the store took is lost: it is still stored, or the call's tool
  message (or its side effect) shows it was carried out.
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support.hypothesis_profiles import PROFILE
from support.shared_runs import CALLS, Effects, office

import fsm_agent.persist.journal as journal_module
from fsm_agent import AgentRun, DecisionError, RunLeasedError, RunStateError, SqliteStore

RUN = "job"
OWNERS = st.integers(0, 1)
DECISIONS = st.sampled_from([True, False, "not now"])
GIVEN = st.dictionaries(st.sampled_from(CALLS), DECISIONS, max_size=2)


class Skewed:
    """``time`` as the journal reads it, ``skew`` seconds later than it is."""

    def __init__(self) -> None:
        self.skew = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skew


class TwoOwners(RuleBasedStateMachine):
    """One paused stored run, two owners, any interleaving of what they may do."""

    def __init__(self) -> None:
        super().__init__()
        # Every owner's own sense of time, for lease renewals: moved on when leases lapse, as real time would be.
        self.clock = Skewed()
        journal_module.time = self.clock  # type: ignore[assignment]
        self.folder = tempfile.TemporaryDirectory()
        self.store = SqliteStore(Path(self.folder.name) / "runs.db")
        self.effects = Effects()
        office(self.effects)[0].run("tidy up", store=self.store, run_id=RUN)
        self.loaded: dict[int, dict[str, Any] | None] = {0: None, 1: None}
        self.live: dict[int, AgentRun | None] = {0: None, 1: None}
        self.approved: set[str] = set()  # approved by someone, somewhere (a call may run only then)
        self.stored: dict[str, bool | str] = {}  # decisions the store took

    def teardown(self) -> None:
        journal_module.time = time
        self.store.close()
        self.folder.cleanup()

    def _took(self, decisions: dict[str, bool | str]) -> None:
        for call_id, decision in decisions.items():
            self.stored.setdefault(call_id, decision)
            if decision is True:
                self.approved.add(call_id)

    @rule(owner=OWNERS)
    def load(self, owner: int) -> None:
        self.loaded[owner] = self.store.load(RUN)

    @rule(call_id=st.sampled_from(CALLS), decision=DECISIONS)
    def decide_in_store(self, call_id: str, decision: bool | str) -> None:
        try:
            self.store.decide(RUN, call_id, decision)
        except (DecisionError, RunLeasedError):
            return
        self._took({call_id: decision})

    @rule(owner=OWNERS, approve=st.booleans(), given=GIVEN)
    def resume(self, owner: int, approve: bool, given: dict[str, bool | str]) -> None:
        data = self.loaded[owner]
        if data is None:
            return
        agent, _ = office(self.effects, approve=approve)
        try:
            run = agent.resume(copy.deepcopy(data), approvals=given or None, store=self.store)
        except (RunLeasedError, ValueError):  # stale or leased; done, or a decision that cannot be taken
            return
        self._took(given)  # the claim stored them with the run
        self.live[owner] = run

    @rule(owner=OWNERS, given=GIVEN)
    def decide_live(self, owner: int, given: dict[str, bool | str]) -> None:
        run = self.live[owner]
        if run is None or run.done:
            return
        with contextlib.suppress(ValueError):
            run.decide(given)
            self.approved.update(call_id for call_id, decision in given.items() if decision is True)

    @rule(owner=OWNERS, steps=st.integers(1, 4))
    def advance(self, owner: int, steps: int) -> None:
        run = self.live[owner]
        for _ in range(steps):
            if run is None or run.done or run.paused:
                return
            try:
                run.advance()
            except RunLeasedError:  # stale or leased: this run object is done for; load the run again
                self.live[owner] = None
                return
            except RunStateError:
                return

    @rule(owner=OWNERS)
    def crash(self, owner: int) -> None:
        self.live[owner] = None  # its lease stays until it lapses

    @rule()
    def lapse(self) -> None:
        self.clock.skew += self.store.lease
        with contextlib.closing(self.store._db.cursor()) as cursor:  # time passing, in the file
            cursor.execute("UPDATE runs SET lease_until = 0 WHERE owner IS NOT NULL")

    @invariant()
    def no_call_ran_twice(self) -> None:
        assert all(count <= 1 for count in self.effects.values()), self.effects

    @invariant()
    def only_approved_calls_ran(self) -> None:
        for call_id in self.effects:
            assert call_id in self.approved, f"{call_id} ran undecided"
            assert self.stored.get(call_id, True) is True, f"{call_id} ran after the store took its rejection"

    @invariant()
    def no_stored_decision_is_lost(self) -> None:
        data = self.store.load(RUN)
        answered = {m["tool_call_id"]: m["content"] for m in data["messages"] if m["role"] == "tool"}
        for call_id, decision in self.stored.items():
            if call_id in answered:
                assert ("a person rejected" in answered[call_id]) == (decision is not True), (call_id, decision)
            elif call_id in {c["id"] for c in data["pending"]}:
                assert data["approvals"].get(call_id) == decision, (call_id, data["approvals"])


TwoOwners.TestCase.settings = settings(PROFILE, max_examples=PROFILE.max_examples * 4)
test_two_owners_never_lose_a_decision_nor_run_a_call_twice = TwoOwners.TestCase
