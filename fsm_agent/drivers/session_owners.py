"""Two owners of one conversation's last turn: one resumes it (``Session.resume``) as another takes the next turn.

Each writes first and reads the other's write after: the resume claims turn
n, then looks for turn n+1 (``_still_last``); a new turn n+1 is stored, then
turn n's version is read again (``_still_based``).  Of two owners racing, at
least one sees the other (whichever wrote second reads after both writes)
and backs off with nothing called: a refused resume writes the turn back as
it was and lets it go, a new turn that finds its base moved is deleted and
the session read again.  So no caller is given a reply the conversation
does not hold.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fsm_agent.drivers.agent import Agent
from fsm_agent.drivers.agent_again import unclaimed
from fsm_agent.drivers.agent_run import AgentRun
from fsm_agent.drivers.stored import awaited
from fsm_agent.errors import RunLeasedError, RunStateError, StaleRunError, TurnTakenError

if TYPE_CHECKING:
    from fsm_agent.persist.store import Store


class LastTurnOwners:
    """The half of a ``Session`` that keeps two owners of its last turn from both going on."""

    agent: Agent
    store: Store | None
    session_id: str
    _turns: int
    _base: tuple[int, int | None] | None = None
    """The last turn as this object read or finished it, and its stored version: what the next turn is built on."""

    def turn_id(self, n: int) -> str:
        """The run id of turn ``n`` (from 1) in a store."""
        return f"{self.session_id}/{n}"

    def _resumed_last(
        self, source: Any, approvals: Mapping[str, bool | str] | None, deps: Any, options: Mapping[str, Any]
    ) -> AgentRun:
        """The last turn resumed (``Agent.resume``); a ``RunStateError`` if another owner took a turn after it."""
        n, store = self._turns, self.store
        stored = {} if store is None else copy.deepcopy(source)  # the turn as loaded, to put back if refused
        run, expected, entry = unclaimed(self.agent, source, store, deps, approvals, **options)
        still = None if store is None else lambda: self._still_last(n, run, stored)
        run._claimed(expected, entry, still)  # noqa: SLF001 - the session claims its turn itself
        return run

    async def _aresumed_last(
        self, source: Any, approvals: Mapping[str, bool | str] | None, deps: Any, options: Mapping[str, Any]
    ) -> AgentRun:
        """``_resumed_last``, awaited."""
        n, store = self._turns, self.store
        stored = {} if store is None else copy.deepcopy(source)  # the turn as loaded, to put back if refused
        run, expected, entry = unclaimed(self.agent, source, store, deps, approvals, **options)
        still = None if store is None else lambda: self._astill_last(n, run, stored)
        await run._aclaimed(expected, entry, still)  # noqa: SLF001 - the session claims its turn itself
        return run

    def _still_last(self, n: int, run: AgentRun, stored: dict[str, Any]) -> None:
        """Nothing if turn ``n``, just claimed by ``run``, is still the last turn; else a ``RunStateError``.

        The claim wrote the turn resumed and leased: refused, it is written
        back as it was ``stored`` and let go, nothing called.
        """
        store: Any = self.store
        try:
            store.load(self.turn_id(n + 1))
        except KeyError:
            return
        self._put_back(n, run, stored)
        raise self._went_on(n)

    async def _astill_last(self, n: int, run: AgentRun, stored: dict[str, Any]) -> None:
        """``_still_last``, awaited."""
        store: Any = self.store
        try:
            await awaited(store, "load", self.turn_id(n + 1))
        except KeyError:
            return
        await self._aput_back(n, run, stored)
        raise self._went_on(n)

    def _put_back(self, n: int, run: AgentRun, stored: dict[str, Any]) -> None:
        """Turn ``n``, which ``run`` claimed, written back as it was ``stored`` and let go (a store without leases:
        saved whole)."""
        store: Any = self.store
        back, owner = _as_stored(run, stored)
        if owner is None:
            store.save(self.turn_id(n), back)
        else:
            seq = store.claim(self.turn_id(n), back, owner=owner)
            store.renew(self.turn_id(n), owner=owner, seq=seq, release=True)

    async def _aput_back(self, n: int, run: AgentRun, stored: dict[str, Any]) -> None:
        """``_put_back``, awaited, and whole whatever cancel comes meanwhile: the turn is never left half resumed."""
        import asyncio  # as in drivers.aio: import fsm_agent loads no asyncio

        store: Any = self.store
        back, owner = _as_stored(run, stored)

        async def put_back() -> None:
            if owner is None:
                await awaited(store, "save", self.turn_id(n), back)
            else:
                seq = await awaited(store, "claim", self.turn_id(n), back, owner=owner)
                await awaited(store, "renew", self.turn_id(n), owner=owner, seq=seq, release=True)

        await asyncio.shield(put_back())

    def _went_on(self, n: int) -> RunStateError:
        msg = (
            f"turn {n} of session {self.session_id!r} cannot be resumed: another owner took turn {n + 1} after it "
            "meanwhile, so it is no longer the last turn (nothing was called; read the session again)"
        )
        return RunStateError(msg)

    def _finished_here(self, run: AgentRun) -> None:
        """The last turn, taken over and finished by this object: the next turn is built on its version as written."""
        journal = run._journal  # noqa: SLF001 - the run this object just drove
        self._base = (self._turns, None if journal is None else journal.seq)

    def _still_based(self, run: AgentRun) -> bool:
        """Whether the last turn is at the version the new turn (``run``, just stored) was built on; else forgotten.

        A resume that claimed the last turn since moved its version: the new
        turn is deleted (nothing of it ran) and the session is to be read again.
        """
        base = self._base
        store: Any = self.store  # a session's store lists its turns and forgets them: a FullStore
        if base is None or base[1] is None:  # no turn before it, or a store without versions
            return True
        try:
            moved = version_of(store.load(self.turn_id(base[0]))) != base[1]
        except KeyError:
            moved = True
        if moved:
            store.delete(run.run_id)
        return not moved

    async def _astill_based(self, run: AgentRun) -> bool:
        """``_still_based``, awaited."""
        base = self._base
        store: Any = self.store
        if base is None or base[1] is None:
            return True
        try:
            moved = version_of(await awaited(store, "load", self.turn_id(base[0]))) != base[1]
        except KeyError:
            moved = True
        if moved:
            await awaited(store, "delete", run.run_id)
        return not moved


def _as_stored(run: AgentRun, stored: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The snapshot that writes back a turn ``run`` claimed as it was ``stored``, and the owner to claim it as.

    At ``run``'s own version, claimed by ``run``'s own owner; the owner is
    None for a store without leases, which takes the snapshot whole.
    """
    from fsm_agent.persist.summary import VERSION_KEY

    journal = run._journal  # noqa: SLF001 - the turn the session just claimed
    assert journal is not None  # a session with a store: its turns are stored
    if journal.journaled is None:
        return stored, None
    return {**stored, VERSION_KEY: journal.seq}, journal.owner


def carry_requests(run: AgentRun, turns: Mapping[str, int]) -> None:
    """``run``'s stored snapshots made to hold ``turns``, its ``request_turns``: called before its first write.

    Why here: a new turn is written whole when it is stored, and the agent's
    start knows no session's request ids (``session_requests``); a resume
    keeps those its snapshot carries (``AgentRun._resumed``).
    """
    journal = run._journal  # noqa: SLF001 - a session's own turn, not written yet
    if journal is not None and turns:
        journal.name_requests(turns)


def version_of(data: dict[str, Any]) -> int | None:
    """The stored version a turn's snapshot was read at (None: a store without versions)."""
    from fsm_agent.persist.summary import stored_version  # as stored.store_for: import fsm_agent loads no store

    return stored_version(data)


def taken_over(run: AgentRun, exc: BaseException) -> BaseException:
    """What a turn's caller is told when ``exc`` cut the turn ``run``: a ``TurnTakenError`` if another owner took it.

    A write of the turn refused because it moved on (``StaleRunError``) or
    its lease is another's (``RunLeasedError``) means its lease lapsed and
    another owner took the turn over; anything else is ``exc`` as it came,
    a turn deleted meanwhile (a ``StaleRunError`` that found none) included.
    """
    if not isinstance(exc, RunLeasedError) or exc.run_id != run.run_id:
        return exc
    if isinstance(exc, StaleRunError) and exc.found is None:
        return exc
    return TurnTakenError(exc)
