"""``PlannedStore``: the store protocol written once over ``persist/plans.py``, for SQLite and PostgreSQL.

Every store method is the same thin step: check its arguments, pick a plan,
and hand it to the backend.  Only how a plan runs differs (SQLite in a
transaction under its lock, its async twins batched by a writer thread;
PostgreSQL on a sync pool and an async pool, with no transaction around a
single fenced statement), so a backend supplies just ``_run``, ``_arun`` and
``close``, beside its own connection setup and migration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Self, TypeVar

from fsm_agent.core.approval import check_decision_value
from fsm_agent.definition.states import State
from fsm_agent.errors import RunNotFoundError
from fsm_agent.persist import plans
from fsm_agent.persist.checks import check_run_id, check_snapshot, cutoff, epoch, filter_text, page, storable
from fsm_agent.persist.cursor import Order, RunCursor, check_listing
from fsm_agent.persist.every import wants
from fsm_agent.persist.store import AsyncStore, FullStore
from fsm_agent.persist.summary import Entry, StoredRun, stored_version

T = TypeVar("T")

_NO_FILTERS: dict[str, Any] = {
    "state": None,
    "reason": None,
    "since": None,
    "limit": None,
    "offset": 0,
    "session": None,
    "order": "updated",
    "after": None,
    "parent": None,
}
"""``list_runs``'s defaults, for ``alist_runs``."""


class PlannedStore(ABC):
    """A checkpoint store whose every method runs one plan of ``plans.Plans``; a backend says how plans run.

    The methods and their promises live here once, so the SQLite and
    PostgreSQL stores cannot drift apart; ``every``, ``lease`` and
    ``_plans`` are set by the backend's ``__init__``.
    """

    every: str
    lease: float
    _plans: plans.Plans

    @abstractmethod
    def _run(self, plan: plans.Plan[T], *, write: bool = True, atomic: bool = False) -> T:
        """Run a plan to its value; ``write=False`` for a read, ``atomic`` when its one write is one statement.

        ``atomic`` lets a database that can fence and write in a single
        statement skip the transaction; a backend may ignore it.
        """

    @abstractmethod
    async def _arun(self, plan: plans.Plan[T], *, write: bool = True, atomic: bool = False) -> T:
        """``_run``, awaited: the event loop never waits on the database."""

    @abstractmethod
    def close(self) -> None:
        """Release what the store holds open (the backend says which)."""

    # --- the protocol --------------------------------------------------------------------------------------

    def wants(self, state: State, paused: bool) -> bool:
        """Whether a transition is written as it is taken, by ``every`` (``every.EVERY``): each, or only some.

        ``every="call"`` writes here only at the end and when paused; the
        driver writes the transitions since the last write as each call returns.
        """
        return wants(self.every, state, paused)

    def save(self, run_id: str, snapshot: dict[str, Any]) -> int:
        """Replace the stored run with this whole snapshot; return the run's new version.

        A compare-and-set: a run already stored is replaced only by a
        snapshot loaded from it at its current version (``stored_seq``, which
        ``load`` sets); else ``StaleRunError`` and nothing changes.  To save
        again, set ``snapshot["stored_seq"]`` to the version returned.
        ``RunLeasedError`` while another owner advances the run.  The
        snapshot is checked first as a resume checks it (``SnapshotError``
        naming the field at fault, and nothing written), so every run a store
        holds loads.
        """
        return self._run(self._put(run_id, check_snapshot(snapshot), None, "replace"))

    def _put(self, run_id: str, snapshot: dict[str, Any], owner: str | None, mode: plans.Mode) -> plans.Plan[int]:
        # A version is a version of the run it was loaded from: a snapshot saved under another id is a copy.
        expected = stored_version(snapshot) if snapshot.get("run_id", run_id) == run_id else None
        return self._plans.put(check_run_id(run_id), snapshot, owner, mode, expected)

    def load(self, run_id: str) -> dict[str, Any]:
        """The run's latest snapshot: its base with the journal after it; ``KeyError`` naming the id if absent."""
        return self._run(self._plans.load(self._found(run_id)), write=False)

    def export(self, run_id: str) -> dict[str, Any]:
        """The run as a recording to replay in tests (``fsm_agent.persist.recording``); ``KeyError`` if absent."""
        from fsm_agent.persist.recording import export

        return export(self, run_id)

    def _found(self, run_id: str) -> str:
        """``run_id``, or ``KeyError`` at once for an id no store could hold (NUL, too long): no run, in every store."""
        if not storable(run_id):
            msg = f"no run {run_id!r} in {self._plans.where}"
            raise RunNotFoundError(msg)
        return run_id

    def create(self, run_id: str, snapshot: dict[str, Any], *, owner: str, overwrite: bool = False) -> int:
        """Store a new run, leased to ``owner``; ``RunExistsError`` if the id is taken (unless ``overwrite``)."""
        return self._run(self._plans.put(check_run_id(run_id), snapshot, owner, _mode(overwrite)))

    def claim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        """Take a run over to resume it from ``snapshot``; ``RunLeasedError`` while another owner's lease is live.

        Checked like ``save``: ``StaleRunError`` if the stored run moved on
        past the version ``snapshot`` was loaded at.
        """
        return self._run(self._put(run_id, snapshot, owner, "claim"))

    def decide(self, run_id: str, call_id: str, decision: bool | str) -> dict[str, Any]:
        """Record a decision on a paused run's pending call in one transaction; return the run as stored now.

        ``True`` approves the call, ``False`` or a reason text rejects it
        (anything else is a ``TypeError``, and a text that reads as an approval,
        such as ``"yes"``, a ``ValueError``, whatever the run's state); ``False``
        and ``""`` are one decision, rejected with no reason, stored as ``False``.
        ``DecisionError`` if the run is not paused, the call is not pending,
        already ran, needs no approval or has another decision; the same
        decision given again is taken as given and writes nothing.
        ``RunLeasedError`` while someone advances the run; ``KeyError`` if
        there is no such run.
        Concurrent decisions are taken one after the other, so none is lost.
        """
        check_decision_value(decision)
        return self._run(self._plans.decide(self._found(run_id), call_id, decision))

    def append(self, entry: Entry, *, owner: str) -> None:
        """Add one journal entry for ``owner``; ``RunLeasedError`` if the run is no longer its to write."""
        self._run(self._plans.append(entry, owner), atomic=True)

    def renew(self, run_id: str, *, owner: str, seq: int, release: bool = False) -> None:
        """Extend ``owner``'s lease (or give it up), checked like ``append``."""
        self._run(self._plans.renew(run_id, owner, seq, release=release), atomic=True)

    def keep(self, run_id: str, *, owner: str, seq: int) -> None:
        """Extend ``owner``'s lease during a call, only if the run is still its own at version ``seq`` (a heartbeat).

        Never takes a run back: ``RunLeasedError`` or ``StaleRunError`` once
        anyone else took, replaced or decided on it, or it was given up.
        """
        self._run(self._plans.keep(run_id, owner, seq), atomic=True)

    def list_runs(
        self,
        *,
        state: str | None = None,
        reason: str | None = None,
        since: float | datetime | None = None,
        limit: int | None = None,
        offset: int = 0,
        session: str | None = None,
        order: Order = "updated",
        after: RunCursor | None = None,
        parent: str | None = None,
    ) -> list[StoredRun]:
        """The stored runs, most recently saved first, filtered by state, reason, last save time and session, one page.

        ``session`` lists the turns of one conversation (``fsm_agent.Session``),
        ``parent`` the sub-agent runs of one run (not theirs).
        ``order="created"`` lists them by creation instead, latest first, and
        ``after=RunCursor.of(page[-1])`` gives the page after ``page``: each
        run once, however many runs are added or saved again between pages.
        """
        plan = self._list_plan(state, reason, since, limit, offset, session, order, after, parent)
        return self._run(plan, write=False)

    def _list_plan(
        self,
        state: str | None,
        reason: str | None,
        since: float | datetime | None,
        limit: int | None,
        offset: int,
        session: str | None = None,
        order: Order = "updated",
        after: RunCursor | None = None,
        parent: str | None = None,
    ) -> plans.Plan[list[StoredRun]]:
        """The ``list_runs`` plan, its page and filters checked first, so a bad one is refused before any query."""
        size, skip = page(limit, offset)
        order, after = check_listing(order, after, skip)
        state, reason, session, parent = (
            filter_text("state", state),
            filter_text("reason", reason),
            filter_text("session", session),
            filter_text("parent", parent),
        )
        size_or_all = None if size < 0 else size
        return self._plans.list_runs(state, reason, epoch(since), size_or_all, skip, session, order, after, parent)

    def delete(self, run_id: str) -> bool:
        """Forget one run; return whether it was there."""
        return storable(run_id) and self._run(self._plans.delete(run_id))

    def delete_finished(self, older_than: float | timedelta | None = None) -> int:
        """Forget every run in ``Done`` or ``Failed`` (last saved more than ``older_than`` ago); return how many."""
        return self._run(self._plans.delete_finished(None if older_than is None else cutoff(older_than)))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- awaited: the same plans through ``_arun`` ------------------------------------------------------------

    async def asave(self, run_id: str, snapshot: dict[str, Any]) -> int:
        """``save``, awaited."""
        return await self._arun(self._put(run_id, check_snapshot(snapshot), None, "replace"))

    async def aload(self, run_id: str) -> dict[str, Any]:
        """``load``, awaited."""
        return await self._arun(self._plans.load(self._found(run_id)), write=False)

    async def aexport(self, run_id: str) -> dict[str, Any]:
        """``export``, awaited."""
        from fsm_agent.persist.recording import aexport

        return await aexport(self, run_id)

    async def acreate(self, run_id: str, snapshot: dict[str, Any], *, owner: str, overwrite: bool = False) -> int:
        """``create``, awaited."""
        return await self._arun(self._plans.put(check_run_id(run_id), snapshot, owner, _mode(overwrite)))

    async def aclaim(self, run_id: str, snapshot: dict[str, Any], *, owner: str) -> int:
        """``claim``, awaited."""
        return await self._arun(self._put(run_id, snapshot, owner, "claim"))

    async def adecide(self, run_id: str, call_id: str, decision: bool | str) -> dict[str, Any]:
        """``decide``, awaited."""
        check_decision_value(decision)
        return await self._arun(self._plans.decide(self._found(run_id), call_id, decision))

    async def aappend(self, entry: Entry, *, owner: str) -> None:
        """``append``, awaited."""
        await self._arun(self._plans.append(entry, owner), atomic=True)

    async def arenew(self, run_id: str, *, owner: str, seq: int, release: bool = False) -> None:
        """``renew``, awaited."""
        await self._arun(self._plans.renew(run_id, owner, seq, release=release), atomic=True)

    async def akeep(self, run_id: str, *, owner: str, seq: int) -> None:
        """``keep``, awaited."""
        await self._arun(self._plans.keep(run_id, owner, seq), atomic=True)

    async def alist_runs(self, **filters: Any) -> list[StoredRun]:
        """``list_runs``, awaited."""
        unknown = sorted(filters.keys() - _NO_FILTERS.keys())
        if unknown:
            # A misspelt filter must not list every run; the words are Python's for a bad ``list_runs`` call.
            msg = f"{type(self).__name__}.list_runs() got an unexpected keyword argument {unknown[0]!r}"
            raise TypeError(msg)
        return await self._arun(self._list_plan(**(_NO_FILTERS | filters)), write=False)

    async def adelete(self, run_id: str) -> bool:
        """``delete``, awaited."""
        return storable(run_id) and await self._arun(self._plans.delete(run_id))

    async def adelete_finished(self, older_than: float | timedelta | None = None) -> int:
        """``delete_finished``, awaited."""
        return await self._arun(self._plans.delete_finished(None if older_than is None else cutoff(older_than)))


def _mode(overwrite: bool) -> plans.Mode:
    return "overwrite" if overwrite else "create"


if TYPE_CHECKING:

    def _declared(store: PlannedStore) -> tuple[FullStore, AsyncStore]:
        """Never called: mypy checks here that both bundled stores keep the declared contract, twins included."""
        return store, store
