"""Every store operation written once, as a plan of SQL statements, for SQLite and PostgreSQL, sync and async.

A plan is a generator: it yields ``(sql, params)`` and is sent back
``(rowcount, rows)``; the store runs it inside one transaction, calling or
awaiting its connection (the sans-I/O shape of ``core/stepper.py``).  So the
rules of ownership (who may write a run, when a run exists, when a lease
has lapsed) exist in one place, whatever the database and however it waits.

A run is a row of ``runs``: its base snapshot, the summary columns, ``seq``
(the number of its latest write), ``base_seq`` (the write that laid the
base), the lease (``owner``, ``lease_until``) and ``created``, written once
when the row is inserted, so the creation order a listing pages by never moves (and a sub-agent run's
``parent`` and ``parent_call``, from its base, which never changes either).  ``journal`` holds the
entries written after the base.  Every write checks ``seq`` as well as the
owner, so a run object that fell behind (another owner advanced or replaced
the run since) can never append on top of somebody else's entries: a
compare-and-set on the run's version, which ``load`` hands out as
``stored_seq`` and ``claim``, ``save`` (``put``) and ``decide`` check too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from typing import Any, Literal, TypeVar

from fsm_agent.core.approval import check_decision, settled
from fsm_agent.errors import RunExistsError, RunLeasedError, RunNotFoundError, StaleRunError
from fsm_agent.jsontext import dumps
from fsm_agent.persist.cursor import Order, RunCursor
from fsm_agent.persist.readback import rebuild
from fsm_agent.persist.summary import FINISHED, VERSION_KEY, Entry, StoredRun, Summary

T = TypeVar("T")
Query = tuple[str, tuple[Any, ...]]
Reply = tuple[int, list[tuple[Any, ...]]]
Plan = Generator[Query, Reply, T]
Mode = Literal["create", "overwrite", "claim", "replace"]
"""How a base write treats a run already there: refuse it, replace it, take it over, or replace it unowned."""


class Plans:
    """The plans of one store: its table names, placeholder style and where it is (for messages)."""

    def __init__(self, runs: str, journal: str, *, placeholder: str, no_limit: str, where: str, lease: float) -> None:
        self.runs, self.journal, self.where, self.lease = runs, journal, where, lease
        self._placeholder = placeholder
        self._no_limit = no_limit
        self._for_update = " FOR UPDATE" if placeholder == "%s" else ""  # SQLite's write lock covers the file
        # PostgreSQL can fence and append in one statement (a data-modifying WITH): one round trip a checkpoint.
        self.one_statement_append = placeholder == "%s"
        self._cache: dict[str, str] = {}

    def sql(self, text: str) -> str:
        """``text`` with the table names filled in and ``?`` in this database's placeholder style."""
        done = self._cache.get(text)
        if done is None:
            done = text.format(runs=self.runs, journal=self.journal, for_update=self._for_update)
            done = done.replace("?", self._placeholder)
            self._cache[text] = done
        return done

    # --- writes ---------------------------------------------------------------------------------------------

    def put(
        self, run_id: str, snapshot: dict[str, Any], owner: str | None, mode: Mode, expected: int | None = None
    ) -> Plan[int]:
        """Write a whole snapshot as the run's new base, by ``mode``'s rule; return the write's ``seq``.

        A new run (``create``, ``overwrite``) needs no version.  A claim or a
        replacement is built on a version of the run read earlier,
        ``expected`` (None: none was read): it is written only if the run is
        still at that version, or, with none, if the store does not hold the
        run at all; else ``StaleRunError`` and nothing changes.
        """
        if VERSION_KEY in snapshot:  # the version a snapshot was read at is the store's to say, not stored text
            snapshot = {k: v for k, v in snapshot.items() if k != VERSION_KEY}
        text, summary, now = dumps(snapshot), Summary.of(snapshot), time.time()
        held = owner if mode != "replace" else None
        until = None if held is None else now + self.lease
        insert = (
            self.sql(
                "INSERT INTO {runs} (run_id, state, reason, paused, updated, steps, tokens, seq, base_seq, owner,"
                " lease_until, snapshot, session, forked_from, forked_at, start_id, created, parent, parent_call)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 1, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING"
            ),
            (run_id, *_columns(summary, now), held, until, text, *_kept(summary), now, *_link(summary)),
        )
        if mode in ("create", "overwrite"):
            count, _ = yield insert
            if count:
                return 1
            if mode == "create":
                raise RunExistsError(run_id, self.where)
            seq = yield from self._check_lease(run_id, owner, now)
        else:
            _, rows = yield self._read_lease(run_id)
            if not rows:
                if expected is not None:
                    raise StaleRunError(run_id, self.where, expected, None)
                count, _ = yield insert
                if count:
                    return 1
                raise StaleRunError(run_id, self.where, None, 1)  # created by someone else meanwhile
            seq = _lease_seq(run_id, rows[0], owner, now)
            if expected != seq:
                raise StaleRunError(run_id, self.where, expected, seq)
            if not _same_start(rows[0][3], summary.start, expected):
                # The column may be stale (an older worker's overwrite writes no start): the base says for certain.
                _, based = yield self.sql("SELECT snapshot FROM {runs} WHERE run_id = ?"), (run_id,)
                if not _same_start(_start_of(based[0][0]), summary.start, expected):
                    # At the version read, but of another start: the run was deleted, and its id started again since.
                    raise StaleRunError(run_id, self.where, expected, seq)
        seq += 1
        # ``created`` is left as it is: a run keeps its place in the creation order (``RunCursor``) for good.
        yield (
            self.sql(
                "UPDATE {runs} SET state = ?, reason = ?, paused = ?, updated = ?, steps = ?, tokens = ?, seq = ?,"
                " base_seq = ?, owner = ?, lease_until = ?, snapshot = ?, session = ?, forked_from = ?, forked_at = ?,"
                " start_id = ?, parent = ?, parent_call = ? WHERE run_id = ?"
            ),
            (*_columns(summary, now), seq, seq, held, until, text, *_kept(summary), *_link(summary), run_id),
        )
        yield self.sql("DELETE FROM {journal} WHERE run_id = ?"), (run_id,)
        return seq

    def _read_lease(self, run_id: str) -> Query:
        return self.sql("SELECT owner, lease_until, seq, start_id FROM {runs} WHERE run_id = ?{for_update}"), (run_id,)

    def _check_lease(self, run_id: str, owner: str | None, now: float) -> Plan[int]:
        """The run's ``seq``, after checking that nobody but ``owner`` holds a live lease on it."""
        _, rows = yield self._read_lease(run_id)
        return _lease_seq(run_id, rows[0], owner, now)

    def append(self, entry: Entry, owner: str) -> Plan[None]:
        """Add one journal entry, if ``owner`` may: its lease (or a free or lapsed one) and no write since its last."""
        now = time.time()
        release = entry.release
        update = (
            "UPDATE {runs} SET state = ?, reason = ?, paused = ?, updated = ?, steps = ?, tokens = ?, seq = ?,"
            " owner = ?, lease_until = ? WHERE run_id = ? AND seq = ?"
            " AND (owner IS NULL OR owner = ? OR lease_until < ?)"
        )
        params = (
            *_columns(entry.summary, now),
            entry.seq,
            None if release else owner,
            None if release else now + self.lease,
            entry.run_id,
            entry.seq - 1,
            owner,
            now,
        )
        if self.one_statement_append:
            # The insert happens only if the fencing update matched: one atomic statement, no transaction needed.
            text = "WITH fence AS (" + update + " RETURNING run_id) INSERT INTO {journal} (run_id, seq, entry)"
            count, _ = yield self.sql(text + " SELECT run_id, ?, ? FROM fence"), (*params, entry.seq, entry.text)
            if not count:
                yield from self._refuse(entry.run_id, owner, now, entry.seq - 1)
            return
        count, _ = yield self.sql(update), params
        if not count:
            yield from self._refuse(entry.run_id, owner, now, entry.seq - 1)
        insert = self.sql("INSERT INTO {journal} (run_id, seq, entry) VALUES (?, ?, ?)")
        yield insert, (entry.run_id, entry.seq, entry.text)

    def renew(self, run_id: str, owner: str, seq: int, *, release: bool = False) -> Plan[None]:
        """Extend (or give up) ``owner``'s lease; refused like ``append`` if the run moved on without it."""
        now = time.time()
        count, _ = yield (
            self.sql(
                "UPDATE {runs} SET owner = ?, lease_until = ? WHERE run_id = ? AND seq = ?"
                " AND (owner IS NULL OR owner = ? OR lease_until < ?)"
            ),
            (None if release else owner, None if release else now + self.lease, run_id, seq, owner, now),
        )
        if not count:
            yield from self._refuse(run_id, owner, now, seq)

    def keep(self, run_id: str, owner: str, seq: int) -> Plan[None]:
        """Extend ``owner``'s lease while a call is in flight, only if the run is still its own at version ``seq``.

        Stricter than ``renew``: a run given up (no owner) or held by anyone
        else is never taken (back) by a heartbeat, only a lease still ``owner``'s
        at the version it last wrote is extended.  Every takeover (a claim, a
        ``save``, a decision) writes a new version, so a lease another owner
        took, even once it lapsed, is refused (``RunLeasedError``,
        ``StaleRunError``; ``KeyError`` if the run was deleted).
        """
        now = time.time()
        count, _ = yield (
            self.sql("UPDATE {runs} SET lease_until = ? WHERE run_id = ? AND seq = ? AND owner = ?"),
            (now + self.lease, run_id, seq, owner),
        )
        if not count:
            yield from self._refuse(run_id, owner, now, seq)

    def _refuse(self, run_id: str, owner: str, now: float, expected: int) -> Plan[None]:
        """Raise why a write was refused: the run is gone, leased by another, or changed since this owner wrote."""
        _, rows = yield self.sql("SELECT owner, lease_until, seq FROM {runs} WHERE run_id = ?"), (run_id,)
        if not rows:
            msg = f"run {run_id!r} was deleted from {self.where} while it was being advanced"
            raise RunNotFoundError(msg)
        holder, until, seq = rows[0]
        if holder is not None and holder != owner and until is not None and until >= now:
            raise RunLeasedError(run_id, holder, until)
        raise StaleRunError(run_id, self.where, expected, int(seq))

    def decide(self, run_id: str, call_id: str, decision: bool | str) -> Plan[dict[str, Any]]:
        """Record one person's decision on a paused run's pending call, as a journal entry; the run as it is now.

        The run's row is locked while the decision is checked against the run
        as stored (``check_decision``) and written, so two people deciding at
        once are taken one after the other: both decisions are kept, or the
        second is refused with the first named (the same decision twice is
        taken once, and the run comes back unchanged).  A run someone is advancing
        (a live lease) is a ``RunLeasedError``.
        """
        now = time.time()
        _, rows = yield (
            self.sql("SELECT snapshot, base_seq, seq, owner, lease_until FROM {runs} WHERE run_id = ?{for_update}"),
            (run_id,),
        )
        if not rows:
            msg = f"no run {run_id!r} in {self.where}"
            raise RunNotFoundError(msg)
        base, base_seq, seq, holder, until = rows[0]
        if holder is not None and until is not None and until >= now:
            raise RunLeasedError(run_id, holder, until)
        data = yield from self._rebuild(run_id, base, base_seq, seq)
        if not check_decision(run_id, data, call_id, decision):
            data[VERSION_KEY] = int(seq)
            return data  # the same decision, given again: stored already
        # The run stays listed as paused: it waits where it stopped until someone resumes it.
        changed = {"approvals": {**data["approvals"], call_id: settled(decision)}}  # "" is kept as False
        count, _ = yield (
            self.sql("UPDATE {runs} SET updated = ?, seq = ? WHERE run_id = ? AND seq = ?"),
            (now, seq + 1, run_id, seq),
        )
        if not count:  # the row was locked, so only a database without that lock could get here
            raise StaleRunError(run_id, self.where, int(seq), None)
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

    # --- reads and housekeeping ---------------------------------------------------------------------------

    def load(self, run_id: str) -> Plan[dict[str, Any]]:
        """The run's base with its journal entries applied; ``KeyError`` naming the id if it is not there."""
        _, rows = yield self.sql("SELECT snapshot, base_seq, seq FROM {runs} WHERE run_id = ?"), (run_id,)
        if not rows:
            msg = f"no run {run_id!r} in {self.where}"
            raise RunNotFoundError(msg)
        base, base_seq, seq = rows[0]
        data = yield from self._rebuild(run_id, base, base_seq, seq)
        data[VERSION_KEY] = int(seq)
        return data

    def _rebuild(self, run_id: str, base: str, base_seq: int, seq: int) -> Plan[dict[str, Any]]:
        """The run's snapshot from its base and every journal entry up to ``seq``; a missing one is refused."""
        _, entries = yield (
            self.sql("SELECT seq, entry FROM {journal} WHERE run_id = ? AND seq > ? ORDER BY seq"),
            (run_id, base_seq),
        )
        return rebuild(base, entries, run_id, self.where, (base_seq, seq))

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
        """The runs matching every filter given, one page: latest saved first, or latest created first.

        ``order="created"`` sorts by ``(created, run_id)`` descending, both
        set once per run, and ``after`` keeps the runs strictly past that pair
        (one row comparison, which the ``(created, run_id)`` index serves).
        ``parent`` keeps the runs whose ``parent`` column names that run (the
        ``(parent, updated)`` index serves it), as ``session`` does its turns.
        """
        where, params = _filters(state=state, reason=reason, since=since, session=session, parent=parent)
        if after is not None:
            where += (" AND " if where else " WHERE ") + "(created, run_id) < (?, ?)"
            params += (after.created, after.run_id)
        by = "updated DESC, run_id" if order == "updated" else "created DESC, run_id DESC"
        size = "?" if limit is not None else self._no_limit
        text = (
            "SELECT run_id, state, reason, paused, updated, steps, tokens, session, forked_from, forked_at, created,"
            " parent, parent_call, start_id FROM {runs}" + where + f" ORDER BY {by} LIMIT {size} OFFSET ?"
        )
        params += (*(() if limit is None else (limit,)), offset)
        _, rows = yield self.sql(text), params
        return [
            StoredRun(r, s, why, bool(p), float(u), int(n), int(t), c, _fork(f, a), float(made), _parent(up, call), go)
            for r, s, why, p, u, n, t, c, f, a, made, up, call, go in rows
        ]

    def delete(self, run_id: str) -> Plan[bool]:
        """Forget one run and its journal; whether it was there."""
        yield self.sql("DELETE FROM {journal} WHERE run_id = ?"), (run_id,)
        count, _ = yield self.sql("DELETE FROM {runs} WHERE run_id = ?"), (run_id,)
        return count > 0

    def delete_finished(self, before: float | None) -> Plan[int]:
        """Forget every run in ``Done`` or ``Failed`` last saved before ``before`` (any time if ``None``)."""
        old = "" if before is None else " AND updated < ?"
        params: tuple[Any, ...] = (*FINISHED, *(() if before is None else (before,)))
        finished = "SELECT run_id FROM {runs} WHERE state IN (?, ?)" + old
        yield self.sql("DELETE FROM {journal} WHERE run_id IN (" + finished + ")"), params
        count, _ = yield self.sql("DELETE FROM {runs} WHERE state IN (?, ?)" + old), params
        return count


def _lease_seq(run_id: str, row: tuple[Any, ...], owner: str | None, now: float) -> int:
    """The run's ``seq`` from its ``(owner, lease_until, seq, ...)`` row; ``RunLeasedError`` if another's is live."""
    holder, until, seq = row[:3]
    if holder is not None and holder != owner and until is not None and until >= now:
        raise RunLeasedError(run_id, holder, until)
    return int(seq)


def _columns(summary: Summary, now: float) -> tuple[Any, ...]:
    return (summary.state, summary.reason, summary.paused, now, summary.steps, summary.tokens)


def _origin(summary: Summary) -> tuple[str | None, int | None]:
    """The ``forked_from`` and ``forked_at`` columns: the run a fork was made from and the transition, or NULLs."""
    return summary.forked_from or (None, None)


def _kept(summary: Summary) -> tuple[Any, ...]:
    """The ``session``, ``forked_from``, ``forked_at`` and ``start_id`` columns of a base write."""
    return summary.session, *_origin(summary), summary.start


def _start_of(base: str) -> str | None:
    """The ``start_id`` a stored base snapshot names (None: none, or a base that is not JSON)."""
    try:
        start = json.loads(base).get("start_id")
    except (ValueError, AttributeError):
        return None
    return start if isinstance(start, str) and start else None


def _same_start(stored: str | None, written: str | None, expected: int | None) -> bool:
    """Whether a write built on version ``expected`` is of the start the run is stored at (unknown either side: yes).

    A version names a version of one start of a run: deleted and started
    again under the same id, a run counts its versions from 1 again, so a
    snapshot read before the delete names a version of the new run too.
    """
    return expected is None or stored is None or written is None or stored == written


def _link(summary: Summary) -> tuple[str | None, str | None]:
    """The ``parent`` and ``parent_call`` columns: the run and call a sub-agent run was made for, or NULLs."""
    return summary.parent or (None, None)


def _fork(source: str | None, at: int | None) -> tuple[str, int] | None:
    """``StoredRun.forked_from`` from its columns."""
    return None if source is None or at is None else (source, int(at))


def _parent(run: str | None, call: str | None) -> tuple[str, str] | None:
    """``StoredRun.parent`` from its columns: both, or None (a run an older version's worker inserted has none)."""
    return None if run is None or call is None else (run, call)


def _filters(**given: Any) -> tuple[str, tuple[Any, ...]]:
    """``WHERE`` clauses for the filters that were given (``since`` is a lower bound on ``updated``)."""
    clauses, params = [], []
    for name, value in given.items():
        if value is not None:
            clauses.append("updated >= ?" if name == "since" else f"{name} = ?")
            params.append(value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


def drive(plan: Plan[T], execute: Any) -> T:
    """Run a plan with a sync ``execute(sql, params) -> (rowcount, rows)``."""
    try:
        query = next(plan)
        while True:
            query = plan.send(execute(*query))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
