"""A session's turn as it ends: its result taken into the conversation, a stop raised again after, a cut one kept.

``Session`` (``drivers.session``) takes turns; this half is what the
conversation keeps of each as it ends, however it ends: a turn's messages
(a stopped turn's calls never made answered as not run, so the next turn's
history is one every provider accepts), the pause that holds the next turn
back, and, for a turn cut short in a session without a store, its messages so
far, closed as a store would keep them.  Apart so the turn-taking reads
without what each ending leaves behind.
"""

from __future__ import annotations

from fsm_agent.drivers.agent_run import AgentRun
from fsm_agent.drivers.cut_runs import astop_cut
from fsm_agent.drivers.session_owners import taken_over
from fsm_agent.drivers.session_turns import StoredTurns, closed, kept_of, paused_message, rejected_of
from fsm_agent.errors import AgentLoopError
from fsm_agent.records import RunResult


class TurnEnds(StoredTurns):
    """The half of a ``Session`` that takes each turn's end in: the conversation after it, its stop raised again."""

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
            await astop_cut(run, exc)
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
