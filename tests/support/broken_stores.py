"""Mutants of ``SqliteStore``, each breaking one promise of the store contract, for judging the conformance suite.

Each class below is a ``SqliteStore`` with one rule broken, the way a store
author could get it wrong: most change one plan of ``persist/plans.py``
(swapped in by ``_plans_of``, so the sync method and its async twin break
alike), a few override one method.  ``MUTANTS`` names them for the generated
test module that runs ``StoreConformance`` on one (``conformance_module``).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from fsm_agent import RunLeasedError, StaleRunError
from fsm_agent.core.approval import check_decision, same_decision, settled
from fsm_agent.jsontext import dumps
from fsm_agent.persist import SqliteStore, plans
from fsm_agent.persist.checks import check_run_id, check_snapshot
from fsm_agent.persist.cursor import Order, RunCursor
from fsm_agent.persist.plans import Plan
from fsm_agent.persist.readback import rebuild
from fsm_agent.persist.store import DEFAULT_LEASE
from fsm_agent.persist.summary import VERSION_KEY, Entry, StoredRun, Summary, stored_version


def _statement(sql: str, params: tuple[Any, ...]) -> Plan[None]:
    """A plan of one statement."""
    yield sql, params


class Mutant(SqliteStore):
    """A ``SqliteStore`` with one promise broken (``broken`` says which); ``plans`` swaps in a broken plan class."""

    broken: ClassVar[str] = ""
    plans: ClassVar[type[plans.Plans] | None] = None

    def __init__(self, path: str | Path, every: Any = "call", *, lease: float = DEFAULT_LEASE) -> None:
        super().__init__(path, every, lease=lease)
        if self.plans is not None:
            self._plans.__class__ = self.plans


# --- versions -----------------------------------------------------------------------------------------------------


class SaveIgnoresTheVersion(Mutant):
    """save() writes over the stored run at any version (it still refuses a live lease)."""

    broken = "save is no compare-and-set"

    def save(self, run_id: str, snapshot: dict[str, Any]) -> int:
        return self._run(self._plans.put(check_run_id(run_id), check_snapshot(snapshot), None, "overwrite"))


class VersionsIgnoreTheStart(Mutant):
    """claim() and save() take a version of the run as another start of it (one deleted and started again) has it."""

    broken = "a version is compared without the run's start"

    def claim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        return super().claim(run_id, _startless(snapshot), owner=owner)

    def save(self, run_id: str, snapshot: dict[str, Any]) -> int:
        return super().save(run_id, _startless(snapshot))


def _startless(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in snapshot.items() if key != "start_id"}


class _Appends(plans.Plans):
    """``append`` with its fence, its journal insert and its release each open to a mutant."""

    def fence(self, entry: Entry) -> tuple[str, tuple[Any, ...]]:
        return "seq = ?", (entry.seq - 1,)

    def keeps(self, entry: Entry) -> bool:
        return True

    def releases(self, entry: Entry) -> bool:
        return entry.release

    def append(self, entry: Entry, owner: str) -> Plan[None]:
        now, release = time.time(), self.releases(entry)
        fence, fenced = self.fence(entry)
        update = (
            "UPDATE {runs} SET state = ?, reason = ?, paused = ?, updated = ?, steps = ?, tokens = ?, seq = ?,"
            " owner = ?, lease_until = ? WHERE run_id = ? AND " + fence + " AND (owner IS NULL OR owner = ? OR"
            " lease_until < ?)"
        )
        summary = entry.summary
        columns = (summary.state, summary.reason, summary.paused, now, summary.steps, summary.tokens, entry.seq)
        lease = (None, None) if release else (owner, now + self.lease)
        count, _ = yield self.sql(update), (*columns, *lease, entry.run_id, *fenced, owner, now)
        if not count:
            yield from self._refuse(entry.run_id, owner, now, entry.seq - 1)
        if self.keeps(entry):
            yield (
                self.sql("INSERT INTO {journal} (run_id, seq, entry) VALUES (?, ?, ?)"),
                (
                    entry.run_id,
                    entry.seq,
                    entry.text,
                ),
            )


class _TakesAnyLaterVersion(_Appends):
    def fence(self, entry: Entry) -> tuple[str, tuple[Any, ...]]:
        return "seq < ?", (entry.seq,)


class AppendTakesAnyLaterVersion(Mutant):
    """append() takes an entry for any version past the run's, skipping versions (out of order)."""

    broken = "append accepts an out-of-order seq"
    plans = _TakesAnyLaterVersion


class _LosesEntries(_Appends):
    def keeps(self, entry: Entry) -> bool:
        return entry.seq % 2 == 0


class AppendLosesEntries(Mutant):
    """append() moves the version on but keeps the entry of even versions only."""

    broken = "append loses an entry"
    plans = _LosesEntries


class _IgnoresTheVersion(_Appends):
    def fence(self, entry: Entry) -> tuple[str, tuple[Any, ...]]:
        return "seq = seq", ()


class AappendIgnoresTheVersion(Mutant):
    """aappend(), the async twin, appends at any version; append() is fenced as it should be."""

    broken = "aappend differs from append"

    async def aappend(self, entry: Entry, *, owner: str) -> None:
        await self._arun(_IgnoresTheVersion.append(self._plans, entry, owner))  # type: ignore[arg-type]


class _LoadsOneBehind(plans.Plans):
    def load(self, run_id: str) -> Plan[dict[str, Any]]:
        _, rows = yield self.sql("SELECT snapshot, base_seq, seq FROM {runs} WHERE run_id = ?"), (run_id,)
        if not rows:
            raise KeyError(run_id)
        base, base_seq, seq = rows[0]
        behind = max(int(seq) - 1, int(base_seq))
        data = yield from self._rebuild(run_id, base, base_seq, behind)
        data[VERSION_KEY] = int(seq)
        return data

    def _rebuild(self, run_id: str, base: str, base_seq: int, seq: int) -> Plan[dict[str, Any]]:
        _, entries = yield (
            self.sql("SELECT seq, entry FROM {journal} WHERE run_id = ? AND seq > ? AND seq <= ? ORDER BY seq"),
            (run_id, base_seq, seq),
        )
        return rebuild(base, entries, run_id, self.where, (base_seq, seq))


class LoadIsOneWriteBehind(Mutant):
    """load() rebuilds the run without its last journal entry, yet names the current version."""

    broken = "load returns a stale snapshot at the current version"
    plans = _LoadsOneBehind


# --- leases -------------------------------------------------------------------------------------------------------


class LeaseNeverLapses(Mutant):
    """A lease is written to last for ages: a dead owner's run is never free."""

    broken = "a lease never expires"

    def __init__(self, path: str | Path, every: Any = "call", *, lease: float = DEFAULT_LEASE) -> None:
        super().__init__(path, every, lease=lease)
        self._plans.lease = 1e9


class LeaseLapsesAtOnce(Mutant):
    """A lease is written already lapsed: nobody is ever refused as another's run."""

    broken = "a lease expires at once"

    def __init__(self, path: str | Path, every: Any = "call", *, lease: float = DEFAULT_LEASE) -> None:
        super().__init__(path, every, lease=lease)
        self._plans.lease = -1.0


class _RenewsForAnyone(plans.Plans):
    def renew(self, run_id: str, owner: str, seq: int, *, release: bool = False) -> Plan[None]:
        now = time.time()
        count, _ = yield (
            self.sql("UPDATE {runs} SET owner = ?, lease_until = ? WHERE run_id = ? AND seq = ?"),
            (None if release else owner, None if release else now + self.lease, run_id, seq),
        )
        if not count:
            yield from self._refuse(run_id, owner, now, seq)


class RenewForAnotherOwner(Mutant):
    """renew() is fenced by the version only: another owner renews (takes) a run whose lease is live."""

    broken = "renew succeeds for another owner"
    plans = _RenewsForAnyone


class _KeepsWithoutExtending(plans.Plans):
    def keep(self, run_id: str, owner: str, seq: int) -> Plan[None]:
        now = time.time()
        count, _ = yield (
            self.sql("UPDATE {runs} SET lease_until = lease_until WHERE run_id = ? AND seq = ? AND owner = ?"),
            (run_id, seq, owner),
        )
        if not count:
            yield from self._refuse(run_id, owner, now, seq)


class HeartbeatDoesNotExtend(Mutant):
    """keep() (and akeep) refuse exactly what they should, and take what they should, but extend nothing."""

    broken = "a heartbeat (keep) does not extend the lease"
    plans = _KeepsWithoutExtending


class _NeverReleases(_Appends):
    def releases(self, entry: Entry) -> bool:
        return False

    def renew(self, run_id: str, owner: str, seq: int, *, release: bool = False) -> Plan[None]:
        return super().renew(run_id, owner, seq, release=False)


class ReleaseKeepsTheLease(Mutant):
    """append(release=True) and renew(release=True) keep the owner's lease."""

    broken = "a release does not release"
    plans = _NeverReleases


class ClaimChecksThenWrites(Mutant):
    """claim() checks the lease and version in one transaction and writes in the next, unconditionally.

    An in-process lock makes the two one step for the threads sharing this
    store object, so one handle is never caught out; two handles on one file
    (two processes) both pass the check and both take the run.  ``between``,
    if set, is called between the check and the write (a test lines two
    claims up there).
    """

    broken = "two handles on one store both win a claim"

    def __init__(self, path: str | Path, every: Any = "call", *, lease: float = DEFAULT_LEASE) -> None:
        super().__init__(path, every, lease=lease)
        self._claiming = threading.Lock()
        self.between: Callable[[], object] | None = None

    def claim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        expected = stored_version(snapshot) if snapshot.get("run_id", run_id) == run_id else None
        with self._claiming:
            seq = self._run(self._checked(run_id, owner, expected), write=False)
            if seq is None:
                return super().claim(run_id, snapshot, owner=owner)
            if self.between is not None:
                self.between()
            written: int = self._run(self._written(run_id, snapshot, owner, seq + 1))
            return written

    async def aclaim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        return await asyncio.to_thread(self.claim, run_id, snapshot, owner=owner)

    def _checked(self, run_id: str, owner: str, expected: int | None) -> Plan[int | None]:
        _, rows = yield self._plans.sql("SELECT owner, lease_until, seq FROM {runs} WHERE run_id = ?"), (run_id,)
        if not rows:
            return None
        seq = plans._lease_seq(run_id, rows[0], owner, time.time())  # the rule, as the store has it
        if expected != seq:
            raise StaleRunError(run_id, self._plans.where, expected, seq)
        return seq

    def _written(self, run_id: str, snapshot: dict[str, Any], owner: str, seq: int) -> Plan[int]:
        snapshot = {k: v for k, v in snapshot.items() if k != VERSION_KEY}
        summary, now = Summary.of(snapshot), time.time()
        columns = (summary.state, summary.reason, summary.paused, now, summary.steps, summary.tokens)
        yield (
            self._plans.sql(
                "UPDATE {runs} SET state = ?, reason = ?, paused = ?, updated = ?, steps = ?, tokens = ?, seq = ?,"
                " base_seq = ?, owner = ?, lease_until = ?, snapshot = ? WHERE run_id = ?"
            ),
            (*columns, seq, seq, owner, now + self.lease, dumps(snapshot), run_id),
        )
        yield self._plans.sql("DELETE FROM {journal} WHERE run_id = ?"), (run_id,)
        return seq


# --- decisions ----------------------------------------------------------------------------------------------------


class _Overrules(plans.Plans):
    def decide(self, run_id: str, call_id: str, decision: bool | str) -> Plan[dict[str, Any]]:
        """Like the bundled plan, except that a decision standing on the call is replaced by another."""
        now = time.time()
        _, rows = yield (
            self.sql("SELECT snapshot, base_seq, seq, owner, lease_until FROM {runs} WHERE run_id = ?"),
            (run_id,),
        )
        if not rows:
            raise KeyError(run_id)
        base, base_seq, seq, holder, until = rows[0]
        if holder is not None and until is not None and until >= now:
            raise RunLeasedError(run_id, holder, until)
        data = yield from self._rebuild(run_id, base, base_seq, seq)
        standing = dict(data.get("approvals") or {})
        if call_id in standing and same_decision(standing[call_id], decision):
            data[VERSION_KEY] = int(seq)
            return data
        standing.pop(call_id, None)
        check_decision(run_id, {**data, "approvals": standing}, call_id, decision)  # the earlier decision forgotten
        changed = {"approvals": {**standing, call_id: settled(decision)}}
        yield self.sql("UPDATE {runs} SET updated = ?, seq = ? WHERE run_id = ?"), (now, seq + 1, run_id)
        yield (
            self.sql("INSERT INTO {journal} (run_id, seq, entry) VALUES (?, ?, ?)"),
            (
                run_id,
                seq + 1,
                dumps({"set": changed}),
            ),
        )
        data.update(changed)
        data[VERSION_KEY] = int(seq) + 1
        return data


class DecideOverwrites(Mutant):
    """decide() (and adecide) replace a decision already taken on a call with a different one."""

    broken = "decide overwrites an earlier decision"
    plans = _Overrules


class AdecideOverwrites(Mutant):
    """adecide(), the async twin, replaces a decision already taken; decide() refuses as it should."""

    broken = "adecide differs from decide"

    async def adecide(self, run_id: str, call_id: str, decision: bool | str) -> dict[str, Any]:
        return await self._arun(_Overrules.decide(self._plans, run_id, call_id, decision))  # type: ignore[arg-type]


# --- listing and forgetting ---------------------------------------------------------------------------------------


class _CursorInclusive(plans.Plans):
    def list_runs(
        self,
        state: str | None,
        reason: str | None,
        since: float | None,
        limit: int | None,
        offset: int,
        session: str | None = None,
        order: Order = "updated",
        after: RunCursor | None = None,
        parent: str | None = None,
    ) -> Plan[list[StoredRun]]:
        runs = yield from super().list_runs(state, reason, since, None, 0, session, order, None, parent)
        if after is not None:
            runs = [run for run in runs if (run.created, run.run_id) <= (after.created, after.run_id)]
        return runs[offset : None if limit is None else offset + limit]


class CursorRepeatsItsRun(Mutant):
    """list_runs(after=cursor) starts at the cursor's run instead of right after it."""

    broken = "paging repeats the last run of each page"
    plans = _CursorInclusive


WINDOW = 0.05
"""Seconds a ``ClaimChecksThenWrites`` waits between its check and its write when the suite races it."""


def widened(store: SqliteStore) -> SqliteStore:
    """``store``, its race window held open if it has one (``ClaimChecksThenWrites.between``), else as it is.

    Why: the suite's racers start together, but on a loaded machine one of
    eight may reach a narrow window after another's write, round after
    round; a window of ``WINDOW`` (a real store's, under load) lets every
    round meet the race, so the suite's verdict on this mutant never hangs
    on the machine's load.
    """
    if isinstance(store, ClaimChecksThenWrites):
        store.between = functools.partial(time.sleep, WINDOW)
    return store


class ClaimMovesTheCreation(Mutant):
    """A claim (a resume, a takeover) stamps the run as created anew; save() and append() keep its creation."""

    broken = "a resumed run leaves its place in the creation order"

    def claim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        seq = super().claim(run_id, snapshot, owner=owner)
        self._run(_statement(self._plans.sql("UPDATE {runs} SET created = ? WHERE run_id = ?"), (time.time(), run_id)))
        return seq

    async def aclaim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        return await asyncio.to_thread(self.claim, run_id, snapshot, owner=owner)


class _ForgetsTheJournalOnly(plans.Plans):
    def delete(self, run_id: str) -> Plan[bool]:
        yield self.sql("DELETE FROM {journal} WHERE run_id = ?"), (run_id,)
        _, rows = yield self.sql("SELECT 1 FROM {runs} WHERE run_id = ?"), (run_id,)
        return bool(rows)


class DeleteLeavesTheRun(Mutant):
    """delete() drops the run's journal and says it was there, but leaves its row: base, version and lease."""

    broken = "delete leaves the run and its lease"
    plans = _ForgetsTheJournalOnly


class _PrunesEverything(plans.Plans):
    def delete_finished(self, before: float | None) -> Plan[int]:
        old, params = ("", ()) if before is None else (" WHERE updated < ?", (before,))
        yield self.sql("DELETE FROM {journal} WHERE run_id IN (SELECT run_id FROM {runs}" + old + ")"), params
        count, _ = yield self.sql("DELETE FROM {runs}" + old), params
        return count


class DeleteFinishedTakesUnfinished(Mutant):
    """delete_finished() forgets every run old enough, paused and running ones too."""

    broken = "delete_finished deletes unfinished runs"
    plans = _PrunesEverything


MUTANTS: dict[str, type[Mutant]] = {
    cls.__name__: cls
    for cls in (
        Mutant,
        SaveIgnoresTheVersion,
        AppendTakesAnyLaterVersion,
        AppendLosesEntries,
        AappendIgnoresTheVersion,
        LoadIsOneWriteBehind,
        LeaseNeverLapses,
        LeaseLapsesAtOnce,
        RenewForAnotherOwner,
        HeartbeatDoesNotExtend,
        ReleaseKeepsTheLease,
        ClaimChecksThenWrites,
        DecideOverwrites,
        AdecideOverwrites,
        CursorRepeatsItsRun,
        ClaimMovesTheCreation,
        DeleteLeavesTheRun,
        DeleteFinishedTakesUnfinished,
    )
}
"""Every mutant by class name, and ``Mutant`` itself: a ``SqliteStore`` with nothing broken."""

CONFORMANCE_MODULE = '''
import contextlib
import sqlite3

import pytest

from fsm_agent.testing.stores import StoreConformance
from support.broken_stores import MUTANTS, widened


class TestStore(StoreConformance):
    """The suite as a store's author runs it, on a fresh SQLite file per test."""

    @pytest.fixture
    def make_store(self, tmp_path):
        made = []

        def make(lease):
            made.append(widened(MUTANTS[{name!r}](tmp_path / "runs.db", lease=lease)))
            return made[-1]

        yield make
        for store in made:
            store.close()

    @pytest.fixture
    def reopen_store(self, make_store):
        return make_store  # each call opens one more object on the test's one file

    @pytest.fixture
    def lose_entry(self, tmp_path):
        def lose(run_id, seq):
            with contextlib.closing(sqlite3.connect(tmp_path / "runs.db")) as db, db:
                db.execute("DELETE FROM journal WHERE run_id = ? AND seq = ?", (run_id, seq))

        return lose
'''


def conformance_module(name: str) -> str:
    """The source of a test module that runs ``StoreConformance`` on the mutant ``name``."""
    return CONFORMANCE_MODULE.replace("{name!r}", repr(name))
