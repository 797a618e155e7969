"""A conversation kept between requests: each turn a run that continues the turns before it.

A ``Session`` holds what a chat app keeps per user: the conversation so far.
Each ``run``/``arun`` is one run of the agent with ``history=`` the
conversation, so every turn has its own limits, trace and stop reason.  With
a store, each turn is a stored run named ``<session_id>/<n>`` and listed
under the session (``list_runs(session=...)``, ``runs list --session``), and
the conversation is read back from the store before each turn, so a new
``Session`` with the same store and id, in another process, continues it.
Turns are taken one at a time: a second turn asked of the same object, from
any thread or event loop, waits for it (one lock serves ``run`` and ``arun``;
an awaited turn waits for it without blocking its loop); one asked of another
object or process while a turn is going is a ``RunLeasedError``, never a turn
built on an unfinished one.  A turn whose owner died (its process killed, or
its lease lapsed mid-turn) is finished by the next turn asked for, once its
lease lapses, as ``Agent.resume`` would: no completed call is made again.  A
stopped turn keeps its messages, and the calls it never made are answered as
not run, so the next turn's history is one every provider accepts (how each
turn's end is taken in: ``session_ends``).

``deps`` (the application's objects for the tools, see ``tools.context``)
are given to the session, ``Session(agent, deps=...)``, for every turn it
takes, or to one turn, ``run(text, deps=...)``, which then uses them instead.
Like the conversation's owner, they belong to this object, never to the
store: a new ``Session`` over the same conversation is given them again.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from fsm_agent.core.cancellation import CancelToken
from fsm_agent.drivers.agent import Agent
from fsm_agent.drivers.agent_run import AgentRun
from fsm_agent.drivers.cut_runs import adrop_cut, astop_cut
from fsm_agent.drivers.read_back import stored_result
from fsm_agent.drivers.session_ends import TurnEnds
from fsm_agent.drivers.session_requests import request_of
from fsm_agent.drivers.session_turns import refuse_cut_decisions, session_id_of
from fsm_agent.drivers.stored import astore_for, awaited, store_for
from fsm_agent.drivers.turn_lock import acquire
from fsm_agent.drivers.watched import Observer
from fsm_agent.errors import RunExistsError, RunLeasedError, RunStateError
from fsm_agent.records import Message, RunResult

if TYPE_CHECKING:
    from fsm_agent.persist import StoreTarget
    from fsm_agent.persist.store import Store

_TERMINAL = ("Done", "Failed")
_TRIES = 3
"""How often a turn reads the conversation again when another object stored the turn it was about to take."""


class Session(TurnEnds):
    """One conversation with ``agent``: ``run(text)`` / ``await arun(text)`` take a turn; ``messages`` is all of it.

    ``session_id`` names it (a fresh id by default); with a ``store`` (a
    store, a SQLite path or a ``postgresql://`` URL) the conversation so far
    is read from there, and each turn is stored as it goes.  A turn that
    stops raises like ``Agent.run`` (or returns, by its ``on_stop`` policy)
    after the session has taken in what it produced.  A turn paused for
    approval is decided and continued with ``resume`` before the next one.
    Turns are taken one at a time, from any thread or event loop; with a
    store, a turn whose owner died is finished by the next one once its
    lease lapses, and refused (``RunLeasedError``) until then.  ``deps``
    reach every turn's tools (a turn's own ``deps=`` instead, if given).
    A turn taken with a ``request_id`` keeps it: the same request asked
    again is answered from that turn, whichever it was, and nothing is
    called again (``run``).
    The constructor reads the store with its sync methods; on an event loop,
    build the session with ``await Session.aopen(...)``, which awaits them.
    """

    def __init__(
        self, agent: Agent, store: StoreTarget | None = None, session_id: str | None = None, *, deps: Any = None
    ) -> None:
        if not isinstance(agent, Agent):
            msg = f"agent must be an Agent, got {type(agent).__name__}"
            raise TypeError(msg)
        self.session_id = session_id_of(session_id)  # checked first: nothing is opened for a wrong one
        self.agent = agent
        self.deps = deps
        self.store: Store | None = store_for(store)
        self._messages: list[Message] = []
        self._turns = 0
        self._last: RunResult | None = None  # the last turn this object took, for a store-less resume
        self._last_request: tuple[str, str] | None = None  # the request_id and text of the turn being taken
        self._answers: dict[str, tuple[str, RunResult]] = {}  # a store-less session's answers, by request_id
        self._carry: tuple[Mapping[str, int], str | None] = ({}, None)  # the request ids the next turn carries
        self._paused: str | None = None  # why no new turn may start: the last one waits for a decision
        # One lock for every turn of this object, sync or awaited, from any thread or event loop: an
        # asyncio.Lock would serve one loop only, and two locks would let a sync and an async turn interleave.
        self._lock = threading.Lock()
        if self.store is not None:
            self._catch_up(strict=False)  # a paused or running last turn is only refused when a turn is asked for

    @classmethod
    async def aopen(
        cls, agent: Agent, store: StoreTarget | None = None, session_id: str | None = None, *, deps: Any = None
    ) -> Self:
        """``Session(...)``, awaited: the conversation so far read with the store's async twins.

        The constructor reads the store with its sync methods; from an event
        loop, build the session with ``await Session.aopen(...)`` instead, so
        the loop never waits on the store: the conversation is read with
        ``alist_runs`` and ``aload`` (a store without a twin has its sync
        method run in a worker thread), and a store path or URL is opened in
        a worker thread.
        """
        opened = await astore_for(store)
        session = cls(agent, None, session_id, deps=deps)  # built store-less: nothing is read yet
        session.store = opened
        if opened is not None:
            await session._acatch_up(strict=False)  # as __init__: a paused or running last turn refused later
        return session

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation so far, without the system prompt (each turn's run leads with the agent's own)."""
        return tuple(self._messages)

    @property
    def turns(self) -> int:
        """How many turns the conversation has taken."""
        return self._turns

    # --- taking a turn ----------------------------------------------------------------------------------------

    def run(
        self,
        text: str,
        *,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        deps: Any = None,
        request_id: str | None = None,
    ) -> RunResult:
        """Take a turn: one run of the agent on ``text`` after the conversation so far.

        With a store, a last turn whose owner died is finished first, once
        its lease lapsed (with this turn's ``cancel`` and ``observers``), so
        this turn is built on it whole; while that lease is live, this is a
        ``RunLeasedError`` saying to wait and retry.  A turn of this object
        whose store write failed is driven on first, writing first, so none of
        its calls is made again (``session_ends.TurnEnds._owed_first``).
        ``deps``: this turn's, instead of the session's.

        ``request_id`` names the request asking for the turn (an AG-UI
        ``runId``, a web request's idempotency key) and is stored with it.
        Asked again by a request that took a turn, any turn of the session
        (of the last ``session_requests.REQUESTS_KEPT`` that took one), no
        turn is taken and nothing is called: that turn's result is returned as
        it was (its stop raised again, if its policy raised it), a paused one
        included.  Its turn still the last: one still being taken is a
        ``RunLeasedError``, and one whose owner died is finished first, as
        above, and is the answer.  A turn that stopped ``cancelled`` answered
        nobody, so the same request takes a new turn after it.  A
        ``request_id`` whose turn asked another question than ``text`` is a
        ``ValueError`` naming both: another request; one whose turn the store
        no longer holds (deleted) is a ``RunStateError``.
        """
        deps = self.deps if deps is None else deps
        request = request_of(request_id)
        with self._lock:
            if self.store is None and (answered := self._answered_here(request, text)) is not None:
                return self._again(answered)
            self._owed_first()
            for _ in range(_TRIES):
                if self.store is not None:
                    unfinished = self._catch_up(request=request)
                    self._same_question(request, text)
                    if unfinished is not None:
                        taken = self._take_over(*unfinished, cancel, observers, deps)
                        if taken is None:
                            continue
                        if self._repeated is not None:  # this request's own turn, its owner gone: its answer
                            return self._finished(taken)
                        self._went_on_from(self._finished(taken, quiet=True))
                        self._finished_here(taken)
                    elif self._repeated is not None:
                        return self._again(stored_result(self.agent, self._repeated))
                run = self._next(text, cancel, observers, deps, request)
                try:
                    run._open_store(new=True)  # noqa: SLF001 - as Agent.start does
                except RunExistsError:
                    self._check_ours(self._turns + 1)  # another object took this turn meanwhile: read it, go on after
                    continue
                if not self._still_based(run):  # another object resumed the last turn meanwhile: read it again
                    continue
                self._last_request = None if request is None else (request, text)
                return self._finished(run)
            raise self._busy(self._turns + 1)

    async def arun(
        self,
        text: str,
        *,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        deps: Any = None,
        request_id: str | None = None,
    ) -> RunResult:
        """``run``, awaited: the async driver, its checkpoints and the store's reads awaited too.

        The session's lock is waited for without blocking the event loop, so
        one ``Session`` serves turns from threads and from any number of loops.
        """
        deps = self.deps if deps is None else deps
        request = request_of(request_id)
        await acquire(self._lock)
        try:
            if self.store is None and (answered := self._answered_here(request, text)) is not None:
                return self._again(answered)
            await self._aowed_first()
            for _ in range(_TRIES):
                if self.store is not None:
                    unfinished = await self._acatch_up(request=request)
                    self._same_question(request, text)
                    if unfinished is not None:
                        taken = await self._atake_over(*unfinished, cancel, observers, deps)
                        if taken is None:
                            continue
                        if self._repeated is not None:
                            return await self._afinished(taken)
                        self._went_on_from(await self._afinished(taken, quiet=True))
                        self._finished_here(taken)
                    elif self._repeated is not None:
                        return self._again(stored_result(self.agent, self._repeated))
                run = self._next(text, cancel, observers, deps, request)
                try:
                    await run._aopen_store(new=True)  # noqa: SLF001 - as Agent.arun does
                except RunExistsError:
                    await self._acheck_ours(self._turns + 1)
                    continue
                except BaseException as exc:
                    await astop_cut(run, exc)  # cut while the turn was stored: ended, if the store has it
                    raise
                try:
                    based = await self._astill_based(run)
                except BaseException:
                    await adrop_cut(self.store, run.run_id)  # cut before anything of it ran: forgotten
                    raise
                if not based:
                    continue
                self._last_request = None if request is None else (request, text)
                return await self._afinished(run)
            raise self._busy(self._turns + 1)
        finally:
            self._lock.release()

    def resume(
        self, approvals: Mapping[str, bool | str] | None = None, *, deps: Any = None, **options: Any
    ) -> RunResult:
        """Continue the last turn (paused for approval, or stopped on a limit new ones lift), like ``Agent.resume``.

        ``deps``: the turn's, instead of the session's.  A decision that comes
        too late (the turn ended, or its stop cut the call while it ran, a
        cancel or a deadline) is a ``DecisionError`` naming the decision that
        stood, nothing called.
        """
        deps = self.deps if deps is None else deps
        with self._lock:
            self._owed_first()
            if self.store is not None:
                self._catch_up(strict=False)
            if self.store is not None and self._turns:
                source: Any = self.store.load(self.turn_id(self._turns))
            elif self.store is None and self._last is not None:
                source = self._last
            else:
                raise self._no_turn()
            refuse_cut_decisions(self.turn_id(self._turns), source, approvals)
            try:
                run = self._resumed_last(source, approvals, deps, options)
            except RunLeasedError as exc:
                raise self._held(exc) from None
            self._turns -= 1  # the resumed turn is taken in again when it ends
            return self._finished(run)

    async def aresume(
        self, approvals: Mapping[str, bool | str] | None = None, *, deps: Any = None, **options: Any
    ) -> RunResult:
        """``resume``, awaited: ``Agent.aresume`` and ``afinish``, the store's reads and writes awaited."""
        deps = self.deps if deps is None else deps
        await acquire(self._lock)
        try:
            await self._aowed_first()
            if self.store is not None:
                await self._acatch_up(strict=False)
            if self.store is not None and self._turns:
                source: Any = await awaited(self.store, "load", self.turn_id(self._turns))
            elif self.store is None and self._last is not None:
                source = self._last
            else:
                raise self._no_turn()
            refuse_cut_decisions(self.turn_id(self._turns), source, approvals)
            try:
                run = await self._aresumed_last(source, approvals, deps, options)
            except RunLeasedError as exc:
                raise self._held(exc) from None
            self._turns -= 1  # the resumed turn is taken in again when it ends
            return await self._afinished(run)
        finally:
            self._lock.release()

    # --- between turns ----------------------------------------------------------------------------------------

    def _no_turn(self) -> RunStateError:
        return RunStateError(f"session {self.session_id!r} has no turn to resume: nothing is paused or stopped")

    def _next(
        self, text: str, cancel: CancelToken | None, observers: Sequence[Observer], deps: Any, request: str | None
    ) -> AgentRun:
        """The next turn's run, built on the conversation so far; not stored or driven yet."""
        if self._paused is not None:
            raise RunStateError(self._paused)
        stored = self.store is not None
        run_id = self.turn_id(self._turns + 1) if stored else None
        session = self.session_id if stored else None
        # A session starts its turns as the agent starts its runs, with the conversation as history.
        messages = self._messages
        agent = self.agent
        run = agent._begin(text, cancel, observers, self.store, run_id, messages, session, deps=deps, request=request)  # noqa: SLF001
        self._carry_on(run)  # with a store: the request ids of the turns before it, stored with it
        return run
