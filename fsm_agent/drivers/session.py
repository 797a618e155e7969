"""A conversation kept between requests: each turn a run that continues the turns before it.

A ``Session`` holds what a chat app keeps per user: the conversation so far.
Each ``run``/``arun`` is one run of the agent with ``history=`` the
conversation, so every turn has its own limits, trace and stop reason.  With
a store, each turn is a stored run named ``<session_id>/<n>`` and listed
under the session (``list_runs(session=...)``, ``runs list --session``), and
the conversation is read back from the store before each turn, so a new
``Session`` with the same store and id, in another process, continues it.
Turns are taken one at a time: a second turn asked for while one is going
waits for it (the same object) or is a ``RunLeasedError`` (another object,
another process), never a turn built on an unfinished one.  A stopped turn
keeps its messages, and the calls it never made are answered as not run, so
the next turn's history is one every provider accepts.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.ledger import error_text
from fsm_agent.core.snapshot import message_of
from fsm_agent.drivers.agent import Agent, AgentRun
from fsm_agent.drivers.base import Observer
from fsm_agent.errors import AgentLoopError, RunExistsError, RunLeasedError, RunStateError
from fsm_agent.persist import StoreTarget, store_for
from fsm_agent.persist.store import Store, check_run_id
from fsm_agent.records import Message, RunResult, ToolCall

_TERMINAL = ("Done", "Failed")


class Session:
    """One conversation with ``agent``: ``run(text)`` / ``await arun(text)`` take a turn; ``messages`` is all of it.

    ``session_id`` names it (a fresh id by default); with a ``store`` (a
    store, a SQLite path or a ``postgresql://`` URL) the conversation so far
    is read from there, and each turn is stored as it goes.  A turn that
    stops raises like ``Agent.run`` (or returns, by its ``on_stop`` policy)
    after the session has taken in what it produced.  A turn paused for
    approval is decided and continued with ``resume`` before the next one.
    """

    def __init__(self, agent: Agent, store: StoreTarget | None = None, session_id: str | None = None) -> None:
        if not isinstance(agent, Agent):
            msg = f"agent must be an Agent, got {type(agent).__name__}"
            raise TypeError(msg)
        self.agent = agent
        self.store: Store | None = store_for(store)
        self.session_id = uuid.uuid4().hex if session_id is None else check_run_id(session_id)
        self._messages: list[Message] = []
        self._turns = 0
        self._last: RunResult | None = None  # the last turn this object took, for a store-less resume
        self._paused: str | None = None  # why no new turn may start: the last one waits for a decision
        self._lock = threading.Lock()  # this object's sync turns, one at a time
        self._alock: asyncio.Lock | None = None  # its async turns, one at a time
        if self.store is not None:
            self._catch_up(strict=False)  # a paused or running last turn is only refused when a turn is asked for

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation so far, without the system prompt (each turn's run leads with the agent's own)."""
        return tuple(self._messages)

    @property
    def turns(self) -> int:
        """How many turns the conversation has taken."""
        return self._turns

    def turn_id(self, n: int) -> str:
        """The run id of turn ``n`` (from 1) in a store."""
        return f"{self.session_id}/{n}"

    # --- taking a turn ----------------------------------------------------------------------------------------

    def run(self, text: str, *, cancel: CancelToken | None = None, observers: Sequence[Observer] = ()) -> RunResult:
        """Take a turn: one run of the agent on ``text`` after the conversation so far."""
        with self._lock:
            if self.store is not None:
                self._catch_up()
            run = self._next(text, cancel, observers)
            self._open(run)
            return self._finished(run.finish)

    async def arun(
        self, text: str, *, cancel: CancelToken | None = None, observers: Sequence[Observer] = ()
    ) -> RunResult:
        """``run``, awaited: the async driver, its checkpoints and the store's reads awaited too."""
        if self._alock is None:
            self._alock = asyncio.Lock()
        async with self._alock:
            if self.store is not None:
                await asyncio.to_thread(self._catch_up)
            run = self._next(text, cancel, observers)
            try:
                await run._aopen_store(new=True)  # noqa: SLF001 - as Agent.arun does
            except RunExistsError:
                raise self._busy(self._turns + 1) from None
            try:
                result = await run.afinish()
            except AgentLoopError as exc:
                self._take_in(exc.result)
                raise
            self._take_in(result)
            return result

    def resume(self, approvals: Mapping[str, bool | str] | None = None, **options: Any) -> RunResult:
        """Continue the last turn (paused for approval, or stopped on a limit new ones lift), like ``Agent.resume``."""
        with self._lock:
            if self.store is not None:
                self._catch_up(strict=False)
                source: Any = self.store.load(self.turn_id(self._turns))
            elif self._last is not None:
                source = self._last
            else:
                msg = f"session {self.session_id!r} has no turn to resume"
                raise RunStateError(msg)
            run = self.agent.resume(source, approvals=approvals, store=self.store, **options)
            self._turns -= 1  # the resumed turn is taken in again when it ends
            return self._finished(run.finish)

    # --- between turns ----------------------------------------------------------------------------------------

    def _next(self, text: str, cancel: CancelToken | None, observers: Sequence[Observer]) -> AgentRun:
        """The next turn's run, built on the conversation so far; not stored or driven yet."""
        if self._paused is not None:
            raise RunStateError(self._paused)
        stored = self.store is not None
        run_id = self.turn_id(self._turns + 1) if stored else None
        session = self.session_id if stored else None
        # A session starts its turns as the agent starts its runs, with the conversation as history.
        return self.agent._begin(text, cancel, observers, self.store, run_id, self._messages, session)  # noqa: SLF001

    def _open(self, run: AgentRun) -> None:
        try:
            run._open_store(new=True)  # noqa: SLF001 - as Agent.start does
        except RunExistsError:
            raise self._busy(self._turns + 1) from None

    def _busy(self, n: int) -> RunLeasedError:
        """Turn ``n`` is being taken elsewhere: its conversation is not one to build on yet."""
        until = time.time() + float(getattr(self.store, "lease", 0.0))
        return RunLeasedError(self.turn_id(n), f"another turn of session {self.session_id!r}", until)

    def _finished(self, finish: Any) -> RunResult:
        try:
            result: RunResult = finish()
        except AgentLoopError as exc:
            self._take_in(exc.result)
            raise
        self._take_in(result)
        return result

    def _take_in(self, result: RunResult) -> None:
        """The conversation after a turn: its messages; a stopped turn's calls never made answered as not run."""
        self._last = result
        self._turns += 1
        self._paused = None
        if result.reason == "paused":
            self._paused = _paused_message(self.session_id, self._turns, [(c.name, c.id) for c in result.pending])
            self._messages = [m for m in result.messages if m.role != "system"]
            return
        self._messages = _closed(result.messages, result.pending, result.reason)

    def _catch_up(self, *, strict: bool = True) -> None:
        """Read the conversation from the store: the turns any process took, the last one whole.

        ``strict``: a last turn that is paused or still going is refused, as
        the base of a new turn.
        """
        store: Any = self.store
        prefix = self.turn_id(0)[:-1]
        numbers = [
            int(tail)
            for run in store.list_runs(session=self.session_id)
            if run.run_id.startswith(prefix) and (tail := run.run_id[len(prefix) :]).isdigit()
        ]
        self._paused = None
        if not numbers:
            self._turns, self._messages = 0, []
            return
        last = max(numbers)
        data = store.load(self.turn_id(last))
        self._turns = last
        messages = [message_of(m) for m in data["messages"]]
        pending = [ToolCall(**call) for call in data.get("pending") or ()]
        if data.get("paused"):
            self._paused = _paused_message(self.session_id, last, [(c.name, c.id) for c in pending])
            self._messages = [m for m in messages if m.role != "system"]
            if strict:
                raise RunStateError(self._paused)
            return
        if data["state"] not in _TERMINAL and strict:
            raise self._busy(last)
        self._messages = _closed(messages, pending, data.get("reason") or "stopped")


def _paused_message(session: str, n: int, waiting: list[tuple[str, str]]) -> str:
    calls = ", ".join(f"{name} ({call_id})" for name, call_id in waiting)
    return f"turn {n} of session {session!r} is paused for a decision on {calls}: resume it (Session.resume) first"


def _closed(messages: Sequence[Message], pending: Sequence[ToolCall], reason: str) -> list[Message]:
    """A turn's messages without the system prompt, each call it asked for and never made answered as not run."""
    kept = [m for m in messages if m.role != "system"]
    answered = {m.tool_call_id for m in kept if m.role == "tool"}
    for call in pending:
        if call.id not in answered:
            why = f"not executed: the turn stopped ({reason}) before this call"
            kept.append(Message("tool", error_text(why), tool_call_id=call.id))
    return kept
