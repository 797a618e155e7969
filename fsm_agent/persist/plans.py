"""Every store operation written once, as a plan of SQL statements, for SQLite and PostgreSQL, sync and async.

A plan is a generator: it yields ``(sql, params)`` and is sent back
``(rowcount, rows)``; the store runs it inside one transaction, calling or
awaiting its connection (the sans-I/O shape of ``core/stepper.py``).  So the
rules of ownership (who may write a run, when a run exists, when a lease
has lapsed) exist in one place, whatever the database and however it waits.

A run is a row of ``runs``: its base snapshot, the summary columns, ``seq``
(the number of its latest write), ``base_seq`` (the write that laid the
base) and the lease (``owner``, ``lease_until``).  ``journal`` holds the
entries written after the base.  Every write checks ``seq`` as well as the
owner, so a run object that fell behind (another owner advanced or replaced
the run since) can never append on top of somebody else's entries.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Iterable
from typing import Any, Literal, TypeVar

from fsm_agent.errors import RunExistsError, RunLeasedError
from fsm_agent.jsontext import dumps
from fsm_agent.persist.store import FINISHED, Entry, StoredRun, Summary

T = TypeVar("T")
Query = tuple[str, tuple[Any, ...]]
Reply = tuple[int, list[tuple[Any, ...]]]
Plan = Generator[Query, Reply, T]
Mode = Literal["create", "overwrite", "claim", "replace"]
"""How a base write treats a run already there: refuse it, replace it, take it over, or replace it unowned."""


def apply(snapshot: dict[str, Any], entry: dict[str, Any]) -> None:
    """Bring a snapshot up to date with one journal entry, in place: extend the growing lists, set the rest."""
    for name, items in entry.get("add", {}).items():
        snapshot[name].extend(items)
    snapshot.update(entry.get("set", {}))


def rebuild(base: str, entries: Iterable[str]) -> dict[str, Any]:
    """The snapshot a base and the journal entries after it add up to."""
    snapshot: dict[str, Any] = json.loads(base)
    for text in entries:
        apply(snapshot, json.loads(text))
    return snapshot


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

    def put(self, run_id: str, snapshot: dict[str, Any], owner: str | None, mode: Mode) -> Plan[int]:
        """Write a whole snapshot as the run's new base, by ``mode``'s rule; return the write's ``seq``."""
        text, summary, now = dumps(snapshot), Summary.of(snapshot), time.time()
        held = owner if mode != "replace" else None
        until = None if held is None else now + self.lease
        count, _ = yield (
            self.sql(
                "INSERT INTO {runs} (run_id, state, reason, paused, updated, steps, tokens, seq, base_seq, owner,"
                " lease_until, snapshot) VALUES (?, ?, ?, ?, ?, ?, ?, 1, 1, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING"
            ),
            (run_id, *_columns(summary, now), held, until, text),
        )
        if count:
            return 1
        if mode == "create":
            raise RunExistsError(run_id, self.where)
        seq = yield from self._check_lease(run_id, owner, now)
        seq += 1
        yield (
            self.sql(
                "UPDATE {runs} SET state = ?, reason = ?, paused = ?, updated = ?, steps = ?, tokens = ?, seq = ?,"
                " base_seq = ?, owner = ?, lease_until = ?, snapshot = ? WHERE run_id = ?"
            ),
            (*_columns(summary, now), seq, seq, held, until, text, run_id),
        )
        yield self.sql("DELETE FROM {journal} WHERE run_id = ?"), (run_id,)
        return seq

    def _check_lease(self, run_id: str, owner: str | None, now: float) -> Plan[int]:
        """The run's ``seq``, after checking that nobody but ``owner`` holds a live lease on it."""
        _, rows = yield self.sql("SELECT owner, lease_until, seq FROM {runs} WHERE run_id = ?{for_update}"), (run_id,)
        holder, until, seq = rows[0]
        if holder is not None and holder != owner and until is not None and until >= now:
            raise RunLeasedError(run_id, holder, until)
        return int(seq)

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
                yield from self._refuse(entry.run_id, owner, now)
            return
        count, _ = yield self.sql(update), params
        if not count:
            yield from self._refuse(entry.run_id, owner, now)
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
            yield from self._refuse(run_id, owner, now)

    def _refuse(self, run_id: str, owner: str, now: float) -> Plan[None]:
        """Raise why a write was refused: the run is gone, leased by another, or changed since this owner wrote."""
        _, rows = yield self.sql("SELECT owner, lease_until FROM {runs} WHERE run_id = ?"), (run_id,)
        if not rows:
            msg = f"run {run_id!r} was deleted from {self.where} while it was being advanced"
            raise KeyError(msg)
        holder, until = rows[0]
        live = holder is not None and holder != owner and until is not None and until >= now
        raise RunLeasedError(run_id, holder or "another owner", until or now, stale=not live)

    # --- reads and housekeeping ---------------------------------------------------------------------------

    def load(self, run_id: str) -> Plan[dict[str, Any]]:
        """The run's base with its journal entries applied; ``KeyError`` naming the id if it is not there."""
        _, rows = yield self.sql("SELECT snapshot, base_seq FROM {runs} WHERE run_id = ?"), (run_id,)
        if not rows:
            msg = f"no run {run_id!r} in {self.where}"
            raise KeyError(msg)
        base, base_seq = rows[0]
        _, entries = yield (
            self.sql("SELECT entry FROM {journal} WHERE run_id = ? AND seq > ? ORDER BY seq"),
            (run_id, base_seq),
        )
        return rebuild(base, (text for (text,) in entries))

    def list_runs(
        self, state: str | None, reason: str | None, since: float | None, limit: int | None, offset: int
    ) -> Plan[list[StoredRun]]:
        """The runs matching every filter given, most recently saved first, one page of them."""
        where, params = _filters(state=state, reason=reason, since=since)
        text = (
            "SELECT run_id, state, reason, paused, updated, steps, tokens FROM {runs}"
            + where
            + f" ORDER BY updated DESC, run_id LIMIT {'?' if limit is not None else self._no_limit} OFFSET ?"
        )
        params += (*(() if limit is None else (limit,)), offset)
        _, rows = yield self.sql(text), params
        return [StoredRun(r, s, why, bool(p), float(u), int(n), int(t)) for r, s, why, p, u, n, t in rows]

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


def _columns(summary: Summary, now: float) -> tuple[Any, ...]:
    return (summary.state, summary.reason, summary.paused, now, summary.steps, summary.tokens)


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
