"""A session's turn as it ends: its result taken into the conversation, a stop raised again after, a cut one kept.

``Session`` (``drivers.session``) takes turns; this half is what the
conversation keeps of each as it ends, however it ends: a turn's messages
(a stopped turn's calls never made answered as not run, so the next turn's
history is one every provider accepts), the pause that holds the next turn
back, and, for a turn cut short in a session without a store, its messages so
far, closed as a store would keep them.  Apart so the turn-taking reads
without what each ending leaves behind.

A turn whose store write failed (the database restarting, a dropped
connection) is kept (``_owing``): the session's next request drives it on
before anything else (``_owed_first``), so it writes what the store lacks
and its calls are not made again, as they would be by a request that took
the turn over from the store once its lease lapsed.
"""

from __future__ import annotations

import contextlib

from fsm_agent.drivers.agent_run import AgentRun
from fsm_agent.drivers.cut_runs import astop_cut
from fsm_agent.drivers.session_owners import taken_over
from fsm_agent.drivers.session_turns import StoredTurns, closed, kept_of, paused_message, rejected_of
from fsm_agent.errors import AgentLoopError, RunLeasedError
from fsm_agent.records import RunResult


class TurnEnds(StoredTurns):
    """The half of a ``Session`` that takes each turn's end in: the conversation after it, its stop raised again."""

    _owing: AgentRun | None = None
    """The last turn, left owing a store write by the error its request raised: driven on by the next request."""

    def _keep_owing(self, run: AgentRun, exc: BaseException) -> None:
        """Keep ``run`` if it still owes a write after ``exc`` (a store's error, or a cancel while one failed)."""
        if run.kept_after(exc):
            self._owing = run

    def _owed_first(self) -> None:
        """The turn a failed write left owing, driven on to its end before this request's turn is taken.

        It writes what it owes first and makes no call before that write
        succeeds; a store still failing raises its error again, the turn still
        kept.  It goes on with the cancel token and observers of the request
        that began it; this request's task cancelled cuts it, as it would
        this request's own turn (one that still owes a write stays kept).
        Its stop, if it stops, was that request's: taken in, not raised.  A
        turn another owner took over meanwhile (its lease lapsed), or one
        deleted, is no longer this object's to drive: it is let go, and read
        from the store.
        """
        owing, self._owing = self._owing, None
        if owing is None:
            return
        with contextlib.suppress(RunLeasedError, KeyError):  # another owner's now, or gone: read from the store
            self._finished(owing, quiet=True)

    async def _aowed_first(self) -> None:
        """``_owed_first``, awaited."""
        owing, self._owing = self._owing, None
        if owing is None:
            return
        with contextlib.suppress(RunLeasedError, KeyError):
            await self._afinished(owing, quiet=True)

    def _finished(self, run: AgentRun, *, quiet: bool = False) -> RunResult:
        """The result of ``run.finish()`` taken in; a stop raised again after, unless ``quiet`` (a turn taken over).

        A turn cut by anything else (a Ctrl-C, its task cancelled) is raised
        again too, once the session has kept what it did (``_take_in_cut``);
        a write refused because another owner took the turn over, as a
        ``StaleRunError`` that says so (``session_owners.taken_over``).
        """
        try:
            result = run.finish()
        except AgentLoopError as exc:
            self._take_in(exc.result)
            if quiet:
                return exc.result
            raise
        except BaseException as exc:
            self._keep_owing(run, exc)
            self._take_in_cut(run)
            told = taken_over(run, exc)
            if told is exc:
                raise
            raise told from exc
        self._take_in(result)
        return result

    async def _afinished(self, run: AgentRun, *, quiet: bool = False) -> RunResult:
        """``_finished``, awaited."""
        try:
            result = await run.afinish()
        except AgentLoopError as exc:
            self._take_in(exc.result)
            if quiet:
                return exc.result
            raise
        except BaseException as exc:
            await astop_cut(run, exc)  # a cancel: the turn ended and stored, if the store answers
            self._keep_owing(run, exc)
            self._take_in_cut(run)
            told = taken_over(run, exc)
            if told is exc:
                raise
            raise told from exc
        self._take_in(result)
        return result

    def _take_in_cut(self, run: AgentRun) -> None:
        """A turn cut short (a Ctrl-C, its task cancelled) kept in a store-less session as a store keeps it.

        With a store, the store holds the turn and the next one reads it back
        (and finishes it first if it was left unfinished); a turn stored as it
        ended (a cancelled task's: ``cut_runs.astop_cut``) is taken in here too,
        so ``messages`` and ``turns`` say what the store says.  Without one, its
        messages are taken in here, each call it asked for and never made
        answered as not run: a cancelled turn's result (``Failed``,
        ``cancelled``), or an unfinished turn's messages so far, which no
        ``resume`` can continue (it is in no store).  A call a Ctrl-C cut
        while it ran (the sync driver: the turn's first call not back) was
        made: it is answered as cut off, never as not run.
        """
        if self.store is not None:
            journal = run._journal  # noqa: SLF001 - the turn's own journal: whether its end is what the store holds
            if run.done and journal is not None and not journal.unwritten(run.position):
                self._take_in(run.result)
            return
        if run.done:
            self._take_in(run.result)
            return
        self._last = None
        self._keep_answer(None)  # an unfinished turn, in no store: no answer to give its request again
        self._turns += 1
        self._paused = None
        calls = run.position.calls
        came_back = {call_id: outcome.content for call_id, outcome in calls.ran.items()}
        cut, reason = run.position.at.unfinished, run.reason or "stopped"
        if cut is None and run._cut is not None:  # noqa: SLF001 - a Ctrl-C from inside a call (RunBase._cut_in_call)
            cut, reason = next((c.id for c in calls.pending if c.id not in calls.ran), None), "interrupted"
        self._messages = closed(run.messages, reason, cut, came_back)

    def _take_in(self, result: RunResult) -> None:
        """The conversation after a turn: its messages; a stopped turn's calls never made answered as not run."""
        self._last = result
        if self.store is None:
            self._keep_answer(result)
        self._turns += 1
        self._paused = None
        if result.reason == "paused":
            self._paused = paused_message(self.session_id, self._turns, [(c.name, c.id) for c in result.pending])
            self._messages = [m for m in result.messages if m.role != "system"]
            return
        evidence = result.evidence
        rejected = rejected_of(result.reason, evidence)
        self._messages = closed(
            result.messages, result.reason, evidence.get("unfinished"), kept_of(result.snapshot), rejected
        )
