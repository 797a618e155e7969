"""The sync driver: it carries out each effect by calling, one call at a time, like a plain agent loop.

With a ``timeout``, the work of ``advance()``/``finish()`` runs on a daemon
worker while the caller waits at most until the deadline.  Past it, a call
still in flight is abandoned (Python cannot kill a thread; its outcome is
dropped) and the run stops ``timeout`` with that call recorded as
unfinished.  One hand-off per ``finish()``, not one per call, keeps the cost
of a run with a deadline close to one without.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

from fsm_agent.core.effects import CheckOutput, CompactHistory, ModelCall, ToolBatch
from fsm_agent.core.history import processed
from fsm_agent.definition.triggers import EXPIRED, INTERRUPTED
from fsm_agent.drivers.base import RunBase
from fsm_agent.drivers.child_runs import run_child
from fsm_agent.errors import RunStateError
from fsm_agent.records import RunResult, Transition
from fsm_agent.tools.calling import DeadlineError, Handoff
from fsm_agent.tools.context import driving

T = TypeVar("T")


class _Abandoned(BaseException):
    """Unwinds a worker whose call came back after the run was left: stopped at its deadline, or cut by a Ctrl-C."""


class SyncDriver(RunBase):
    """``advance()`` (one transition) and ``finish()`` (to the end), calling the model and tools directly."""

    # Held by the worker of a run with a deadline except while a call is in flight, so the waiting
    # caller can stop the run at the deadline only between two consistent points.
    _mutex: threading.Lock | None = None
    _in_flight: ModelCall | ToolBatch | None = None
    _abandoned = False

    @driving  # the run is run_context()'s while it is driven, here and on a worker
    def advance(self) -> Transition:
        """Do this state's I/O, if any, fire exactly one transition and return the edge taken."""
        if self._closing is None:  # else the run's last transition waits for its checkpoint: see _advance
            self._check_live()
        try:
            return self._bounded(self._advance, lambda entry: entry)
        except BaseException as exc:
            self._left_unfinished(exc)
            raise

    @driving
    def finish(self) -> RunResult:
        """Advance to the end; return the result, or apply the stop's policy (raise ``AgentLoopError`` by default).

        A run paused for approval returns a result with ``reason == "paused"``.
        """
        if self._result is not None:
            return self._outcome_of_run()
        return self._bounded(self._finish, lambda entry: self._outcome_of_run())

    def _finish(self) -> RunResult:
        stepper = self.stepper
        gated = stepper.gated  # a run without approvals never gains calls to decide on
        try:
            while self._result is None:
                if gated and stepper.paused and self._closing is None:
                    return self._paused_result()
                self._advance()  # the loop itself checked what advance() would
        except BaseException as exc:
            self._left_unfinished(exc)
            raise
        return self._outcome_of_run()

    def _advance(self) -> Transition:
        """Take the next transition (``_move``), or first write the one whose checkpoint failed (``_close_owed``)."""
        if self._closing is not None:
            return self._close_owed()
        return self._move()

    def _move(self) -> Transition:
        """Carry out the effect the next transition needs, if any, then take it (or the stop the effect met)."""
        if self._clock_each_transition:
            self._observe()
        effect = self.stepper.effect()
        if effect is None:  # most transitions need no I/O
            return self._step()
        if isinstance(effect, ModelCall | ToolBatch):
            expired = self._held_in_time()
            if expired is not None:
                return expired
            if self._observed and not self._heard_before(effect):
                return self._interrupt(EXPIRED, None)  # the call's hooks took the time left: it is not made
            if isinstance(effect, ModelCall) and self._settings.history_processors:
                processed = self._processed(effect)
                if not isinstance(processed, ModelCall):
                    return processed  # a processor failed (a model_error) or took the time left: no call made
                effect = processed
                expired = self._held_in_time()  # again: the processors took time, as hooks do
                if expired is not None:
                    return expired
            # The guards read the token on the edge into this state; hooks, processors, a pause for a decision or
            # the time between two advance() calls came since: cancelled then, the call is not made (as past the
            # deadline), and a resume makes it.
            if self._cancel is not None and self._cancel.cancelled:
                return self._interrupt(INTERRUPTED, None)
            self._make_call(effect)
            if self._reply_unheard:
                self._after_reply()
            self._observe()
        elif isinstance(effect, CheckOutput):
            expired = self._check(effect)
            if expired is not None:
                return expired
        else:
            expired = self._compact(effect)
            if expired is not None:
                return expired
            return self._move()  # the call made again, or the stop when the compaction failed
        return self._step()

    def _open_store(self, *, new: bool, overwrite: bool = False, expected: int | None = None) -> None:
        """Write the run to its store whole and take its lease (``RunExistsError``, ``RunLeasedError``)."""
        if self._journal is not None:
            self._observe()
            self._journal.open(self.position, self.paused, new=new, overwrite=overwrite, expected=expected)

    def _compact(self, effect: CompactHistory) -> Transition | None:
        # Within the time left, on a worker (see CompactHistory.run): cut at the deadline, the run stops on timeout
        # (that edge returned), the compaction still due for a resume with more time.
        if self._out_of_time():
            return self._interrupt(EXPIRED, None)
        journal = self._journal
        if journal is not None:
            journal.beat()  # the lease is renewed while compact runs, as during a call: it may be a model's call
        try:
            compacted = effect.run(self._remaining())
        except DeadlineError:
            return self._interrupt(EXPIRED, "the compaction")
        finally:
            if journal is not None:
                journal.rest()
        self.stepper.accept_compaction(compacted)
        if journal is not None:  # kept before the call it shortens: a crash in that call must not compact again
            journal.keep(self.position, self.paused)
        self._observe()
        if self.position.counts.cancelled and not self.position.talk.compact_error:
            return self._interrupt(INTERRUPTED, None)  # cancelled while compacting: stopped before the call it shortens
        return None

    def _check(self, effect: CheckOutput) -> Transition | None:
        # Within the time left, on a worker (see OutputSpec.check): cut at the deadline, the run stops on timeout
        # (that edge returned).  The lease is renewed while validators run, as during a call: one may be a paid
        # model call of its own, not to be taken over by a second owner and made twice.
        remaining = self._remaining()
        journal = self._journal
        if journal is not None:
            journal.beat()
        try:
            checked = effect.output.check(effect.text, remaining)
        finally:
            if journal is not None:
                journal.rest()
        return self._checked(checked, remaining)

    def _end_cut(self) -> None:
        """A run nobody drives on (its stream's reader stopped): ended, no call made; ``AsyncDriver._aend_cut``.

        The transitions needing no call are taken (an answer that had come
        ends it ``Done``), and the run stops ``cancelled`` on the
        ``interrupted`` edge before any call (a finalize call's too: the run keeps
        its stop, the call left for a resume), written and let go: left where
        it was, it would be neither ended nor resumable by anyone holding it.
        """
        stepper = self.stepper
        while self._result is None:
            if stepper.gated and stepper.paused:
                return  # written paused: nothing is called until a decision
            self._observe()
            if isinstance(stepper.effect(), ModelCall | ToolBatch | CompactHistory):
                self._interrupt(INTERRUPTED, None)
                return
            self.advance()

    def _make_call(self, effect: ModelCall | ToolBatch) -> None:
        # A deadline past while the call is in flight stops the run from the caller's thread (see _bounded).
        try:
            if isinstance(effect, ModelCall):
                self._call_model(effect)
            else:
                self._call_tool(effect)
        except (KeyboardInterrupt, SystemExit) as exc:
            self._keep_cut(exc)  # written if it cut the call itself (_cut_in_call): the run is whole there
            raise

    def _bounded(self, work: Callable[[], T], expired: Callable[[Transition], T]) -> T:
        """``work()`` here, or with a deadline on a worker; at the deadline, stop the run and ``expired(edge)``."""
        if self._abandoned:  # a Ctrl-C left it with its worker in a call: that worker may be running still
            msg = "a Ctrl-C left this run with a call in flight on its worker thread: resume it from its store"
            raise RunStateError(msg)
        remaining = self._remaining()
        if remaining is None:
            return work()
        # Taken here and handed to the worker, which lets go of it only while a call is in flight and when
        # done: whenever the caller holds it, the run is between two consistent points.
        mutex = self._mutex = threading.Lock()
        mutex.acquire()

        def held() -> T:
            try:
                return work()
            finally:
                self._mutex = None
                mutex.release()

        handoff = Handoff(held)
        wait: float | None = remaining
        try:
            while not handoff.wait(wait):
                with mutex:
                    if self._mutex is not mutex:
                        break  # the work ended just as the deadline passed
                    if self.position.at.finalizing is None:  # the worker is in a call: it will unwind
                        self._abandoned = True
                        return expired(self._interrupt(EXPIRED, self._unfinished(self._in_flight)))
                wait = None  # the call in flight is a finalize call, which no deadline bounds (see _remaining)
        except (KeyboardInterrupt, SystemExit) as exc:  # a real Ctrl-C lands here, in the caller's (main) thread
            self._cut_while_waiting(mutex, exc)
            raise
        return handoff.result()

    def _still(self) -> AbstractContextManager[object]:
        """Hold the run between two consistent points while its parent's cut reads it from another thread.

        The worker of a run with a deadline holds ``_mutex`` except while a
        call is in flight, so the wait is for the transition it is taking, as
        the run's own deadline waits for it (``_bounded``).
        """
        mutex = self._mutex
        return nullcontext() if mutex is None else mutex

    def _cut_while_waiting(self, mutex: threading.Lock, exc: BaseException) -> None:
        """A Ctrl-C in the caller's thread while the worker drives the run: written if a call is in flight.

        The worker lets go of ``mutex`` only while a call is in flight (and
        when done), so if it is free the run is whole: what it took since the
        store's last write is written, as a Ctrl-C inside the call writes it
        (``_keep_cut``).  Else the worker is taking a transition and nothing
        is written, nor while a fork's run has outcomes left to hand a
        sub-agent down (the worker may be taking one meanwhile, unlocked).
        Either way the worker goes no further: the outcome of the call in
        flight is not taken in when it returns, and no call is made after it
        (``_Abandoned``), so the next owner makes only the cut call again.
        """
        self._abandoned = True
        if not mutex.acquire(blocking=False):
            return
        try:
            if self._mutex is mutex and self._in_flight is not None and not self.position.calls.carried_down:
                self._cut = exc
                self._keep_cut(exc)
        finally:
            mutex.release()

    def _let_go(self, effect: ModelCall | ToolBatch) -> threading.Lock | None:
        """Let go of the run while a call is in flight, so the deadline can stop it there; ``_take_back`` after.

        A stored run's lease is renewed by a heartbeat while the call is in flight (a run without a store: none).
        """
        if self._abandoned:
            raise _Abandoned  # a Ctrl-C cut the run while this worker took a transition: no call after it
        journal = self._journal
        if journal is not None:
            journal.beat()
        mutex = self._mutex
        if mutex is not None:
            self._in_flight = effect
            mutex.release()
        return mutex

    def _take_back(self, mutex: threading.Lock | None) -> None:
        journal = self._journal
        if journal is not None:
            journal.rest()
        if mutex is not None:
            mutex.acquire()
            self._in_flight = None
            if self._abandoned:
                raise _Abandoned

    def _held_in_time(self) -> Transition | None:
        """Before a call: the lease held (renewed if a third gone) and the deadline not passed, or the stop it is.

        A run this object let go of or may have lost makes no call (``hold``
        raises), and a call the deadline has passed is not made: the run
        stops ``timeout`` with nothing in flight.
        """
        journal = self._journal
        if journal is not None and journal.due():
            journal.hold(self.position)
        return self._interrupt(EXPIRED, None) if self._out_of_time() else None

    def _processed(self, effect: ModelCall) -> ModelCall | Transition:
        """The call with what the history processors make of its messages; else the stop, no call made.

        Between the call's hooks and the call, which is then checked again
        (``_held_in_time``): a call they delayed is not made past the
        deadline, as one its hooks delayed.  Within the time left
        (``core.history.processed``): processors that take it all stop the
        run ``timeout`` while they run.  The lease is renewed meanwhile, as
        during a call, so a slow processor is not taken over by a second
        owner.  One that fails stops the run ``model_error``.
        """
        journal = self._journal
        if journal is not None:
            journal.beat()
        try:
            # A copy: the run's recorded history stays as it is.
            messages = processed(list(effect.messages), self._settings.history_processors, self._remaining())
        except DeadlineError:
            return self._interrupt(EXPIRED, None)  # they took the time left: the call is not made
        except Exception as exc:  # noqa: BLE001 - what the model would have been sent is unusable: model_error
            self._model_failed(exc)
            self._observe()
            return self._step()
        finally:
            if journal is not None:
                journal.rest()
        self.stepper.will_send(messages)
        return ModelCall(tuple(messages), effect.tools, effect.turn)

    def _call_model(self, effect: ModelCall) -> None:
        # Without a store or a deadline (so unclocked) there is nothing to let go of or take back: most runs
        # skip both calls.
        held = self._clock_each_transition and (self._journal is not None or self._mutex is not None)
        # Before the run is let go: a deadline that stops it from then on takes this call's text, so the call's
        # later pieces are dropped (watched._text).
        stream = self._streaming("complete_stream") if self._wants_text else None
        mutex = self._let_go(effect) if held else None
        try:
            # None unless the answer is typed: a call with **{} costs 5% of a short run
            keywords = self._settings.model_keywords
            if stream is None:
                if keywords is None:
                    response = self._model.complete(effect.messages, effect.tools)
                else:
                    response = self._model.complete(effect.messages, effect.tools, **keywords["complete"])
            else:
                extra = {} if keywords is None else keywords["complete_stream"]
                complete_stream, on_text = stream
                response = complete_stream(effect.messages, effect.tools, on_text, **extra)
        except Exception as exc:  # noqa: BLE001 - any model failure is a model_error stop
            if held:
                self._take_back(mutex)
            self._model_failed(exc)
            return
        except BaseException as exc:
            self._cut_in_call(exc)
            if held:
                self._take_back(mutex)  # no heartbeat outlives the call, whatever ends it
            raise
        if held:
            self._take_back(mutex)
        if self._observed:
            self._model_replied(response)
        else:
            self.stepper.accept_reply(response)  # _model_replied without the events nobody reads

    def _after_reply(self) -> None:
        """The reply's write and its ``after_model`` event, once the call is back (on the worker, holding the run).

        Written before its hooks run, so a crash or a Ctrl-C in one asks the
        model not again (``Journal.keep_reply``).
        """
        self._reply_unheard = False
        journal = self._journal
        if journal is not None and self._hooks.get("after_model"):
            journal.keep_reply(self.position)
        self._after_model()

    def _call_tool(self, effect: ToolBatch) -> None:
        call = effect.calls[0]
        held = self._clock_each_transition and (self._journal is not None or self._mutex is not None)
        mutex = self._let_go(effect) if held else None
        try:
            child = self._children.get(call.name) if self._children else None
            if child is not None:
                outcome = run_child(self, child, call)
            elif self._settings.tool_timeout is None:
                # Called as execute(call), so registries that wrap it keep working.
                outcome = self._registry.execute(call)
            else:
                outcome = self._registry.execute(call, timeout=self._settings.tool_timeout)
        except BaseException as exc:
            self._cut_in_call(exc)
            raise
        finally:
            if held:
                self._take_back(mutex)
        self._accept_tool(call, outcome)
        journal = self._journal
        if journal is not None and self._hooks.get("after_tool"):
            journal.keep_outcome(self.position)  # before its after_tool hooks run: a crash in one makes it not again

    def _unfinished(self, effect: ModelCall | ToolBatch | None) -> str | None:
        if isinstance(effect, ToolBatch):
            return effect.calls[0].id
        if isinstance(effect, ModelCall):
            return f"model call of turn {effect.turn}"
        return None
