"""The async driver: it awaits each effect, running the calls of one batch concurrently.

If the task is cancelled while a call is in flight, the run is recorded as
``Failed``/``cancelled`` with everything so far (calls of the batch that
finished are kept) and the ``CancelledError`` propagates; if the run's
timeout passes, the calls in flight are cancelled and the run stops on
``timeout``.  A call's ``KeyboardInterrupt`` or ``SystemExit`` propagates
and leaves the run unfinished, written as it stands (``CutInCall._keep_cut``),
as on the sync driver; so does a sub-agent's run in flight beside that call,
which the batch cuts (``leaving.left_above``), nobody stopping it.

``asyncio`` is imported by the methods that await, never by ``import
fsm_agent``: it brings ``ssl``, sockets and subprocesses, most of the cost of
importing the package, which a program that never awaits a run need not pay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsm_agent.core.effects import CheckOutput, CompactHistory, ModelCall, ToolBatch
from fsm_agent.core.history import aprocessed
from fsm_agent.definition.triggers import EXPIRED, INTERRUPTED
from fsm_agent.drivers.concurrent_calls import ConcurrentCalls
from fsm_agent.drivers.leaving import left_above
from fsm_agent.drivers.model import awaitable_reply
from fsm_agent.observe.events import logger
from fsm_agent.records import RunResult, Transition
from fsm_agent.tools.calling import DeadlineError, in_daemon_worker
from fsm_agent.tools.context import adriving

_PLAIN: dict[str, dict[str, Any]] = {"acomplete_stream": {}, "acomplete": {}, "complete": {}}
"""An untyped agent's model calls: nothing besides messages and tools."""


class AsyncDriver(ConcurrentCalls):
    """``aadvance()`` and ``afinish()``: the same steps as the sync driver, awaited."""

    _batches = True
    """Whether a turn's calls that may run now are planned as one batch; a rebuilt run makes them one at a time."""

    @adriving  # the run is run_context()'s in this task and the tasks of its parallel calls
    async def aadvance(self) -> Transition:
        """Like ``advance()``, awaiting the model and tools; the calls of one batch run concurrently."""
        if self._closing is None:  # else the run's last transition waits for its checkpoint: see _aadvance
            self._check_live()
        try:
            return await self._aadvance()
        except BaseException as exc:
            self._left_unfinished(exc)
            raise

    async def _aadvance(self) -> Transition:
        if self._journal is None:
            return await self._amove()
        import asyncio

        closing = self._closing
        if closing is not None:
            # A cancel cut the checkpoint of the transition last taken: it is written now (or read back, if the store
            # committed it all the same), then announced (a transition observers hear of is a kept one), and the run
            # goes on from there.
            await self._asave()
            return closing
        # The checkpoint is awaited after the transition, not written while the transition closes.
        self._deferred = True
        try:
            entry = await self._amove()
        except asyncio.CancelledError:
            self._deferred = False
            await self._asave()  # the run was just recorded as Failed(cancelled): the store keeps that too
            raise
        finally:
            self._deferred = False
        await self._asave()
        return entry

    async def _amove(self) -> Transition:
        """The sync driver's ``_move``, awaited: carry out the effect the next transition needs, then take it."""
        if self._clock_each_transition:
            self._observe()
        effect = self.stepper.effect(parallel=self._batches)
        if effect is None:  # most transitions need no I/O
            return self._step()
        if isinstance(effect, ModelCall | ToolBatch):
            expired = await self._aheld_in_time()
            if expired is not None:
                return expired
            if self._observed and not self._heard_before(effect):
                return self._interrupt(EXPIRED, None)  # the call's hooks took the time left: it is not made
            if isinstance(effect, ModelCall) and self._settings.history_processors:
                processed = await self._aprocessed(effect)
                if not isinstance(processed, ModelCall):
                    return processed  # a processor failed (a model_error) or took the time left: no call made
                effect = processed
                expired = await self._aheld_in_time()  # again: the processors took time, as hooks do
                if expired is not None:
                    return expired
            # The guards read the token on the edge into this state; hooks, processors, a pause for a decision or
            # the time between two advance() calls came since: cancelled then, the call is not made (as past the
            # deadline), and a resume makes it.
            if self._cancel is not None and self._cancel.cancelled:
                return self._interrupt(INTERRUPTED, None)
            expired = await self._acarry(effect)
            if expired is not None:
                return expired
            if self._reply_unheard:
                await self._aafter_reply()
            self._observe()
        elif isinstance(effect, CheckOutput):
            expired = await self._acheck(effect)
            if expired is not None:
                return expired
        else:
            expired = await self._acompact(effect)
            if expired is not None:
                return expired
            return await self._amove()  # the call made again, or the stop when the compaction failed
        return self._step()

    async def _acompact(self, effect: CompactHistory) -> Transition | None:
        # Off the loop and within the time left (see CompactHistory.arun), as on the sync driver; a cancel while
        # compacting leaves the compaction due, for a resume to do.
        if self._out_of_time():
            return self._interrupt(EXPIRED, None)
        journal = self._journal
        if journal is not None:
            journal.abeat()  # the lease is renewed while compact runs, as during a call: it may be a model's call
        try:
            compacted = await effect.arun(self._remaining())
        except DeadlineError:
            return self._interrupt(EXPIRED, "the compaction")
        finally:
            if journal is not None:
                journal.rest()
        self.stepper.accept_compaction(compacted)
        if journal is not None:  # kept before the call it shortens: a crash in that call must not compact again
            await journal.akeep(self.position, self.paused)
        self._observe()
        if self.position.counts.cancelled and not self.position.talk.compact_error:
            return self._interrupt(INTERRUPTED, None)  # cancelled while compacting: stopped before the call it shortens
        return None

    async def _acheck(self, effect: CheckOutput) -> Transition | None:
        # Off the loop and within the time left (see OutputSpec.acheck): cut at the deadline, the run stops on
        # timeout (that edge returned). A cancel of the task while the check runs stops the run cancelled, the
        # answer unchecked in Dispatch (a resume checks it again), and propagates, as during a call (_acarry).
        # The lease is renewed while validators run, as during a call (see SyncDriver._check).
        import asyncio

        remaining = self._remaining()
        journal = self._journal
        if journal is not None:
            journal.abeat()
        try:
            checked = await effect.output.acheck(effect.text, remaining)
        except asyncio.CancelledError as exc:
            if not isinstance(exc.__cause__, KeyboardInterrupt | SystemExit) and left_above() is None:
                self._interrupt(INTERRUPTED, "the output check")
            raise
        finally:
            if journal is not None:
                journal.rest()
        return self._checked(checked, remaining)

    async def _acarry(self, effect: ModelCall | ToolBatch) -> Transition | None:
        """Await the call (a turn's tool calls at once), the lease renewed meanwhile; past the deadline, the stop.

        A cancel while the calls are in flight records the run as stopped
        ``cancelled`` with what finished, and propagates; unless an
        interrupt (a call's ``KeyboardInterrupt`` or ``SystemExit``, here or
        in a batch this run is a sub-agent call of) is leaving the loop: then
        the run is left unfinished, written as it stands, as on the sync driver.
        A parallel batch's call whose hooks took the time left, or before
        which a cancel came, is not made (``ConcurrentCalls._may_start``): the
        run stops ``timeout`` or ``cancelled``, that call and those after it unmade.
        """
        import asyncio

        remaining = self._remaining()
        deadline = None
        unmade: list[str] = []  # the ids of a parallel batch's calls the deadline or a cancel left unmade
        journal = self._journal
        if journal is not None:
            journal.abeat()  # the lease is renewed while the calls are in flight (no store: no task)
        try:
            if remaining is None:  # no deadline: no timeout context, which costs as much as a transition
                await self._amake_call(effect, unmade)
            else:
                async with asyncio.timeout(remaining) as deadline:
                    await self._amake_call(effect, unmade)
        except TimeoutError:
            if deadline is None or not deadline.expired():
                raise
            return self._interrupt(EXPIRED, self._aunfinished(effect, unmade))
        except asyncio.CancelledError as exc:
            # Unless a call's KeyboardInterrupt or SystemExit cut a batch this run is under (see leaving.left_above):
            # then the run stays unfinished for its next owner, as on the sync driver.
            cause = exc.__cause__
            left = cause if isinstance(cause, KeyboardInterrupt | SystemExit) else left_above()
            if left is None:
                self._interrupt(INTERRUPTED, self._aunfinished(effect, unmade))
                raise
            if cause is not left:
                # A call beside this run's (it is a sub-agent's) raised it: this run's calls were cut as whole as
                # by the interrupt itself, at an await; its parent reads the cancel as the interrupt's (_cut_in_call).
                exc.__cause__ = left
                self._cut_in_call(exc)
            await self._akeep_cut(exc)  # written if the interrupt cut a call itself (_cut_in_call)
            if self._observed and isinstance(effect, ToolBatch):
                self._batch_cut_events()  # the calls that came back are kept for the next owner: heard ending now
            raise
        except (KeyboardInterrupt, SystemExit) as exc:
            await self._akeep_cut(exc)  # as the sync driver's _make_call
            if self._observed and isinstance(effect, ToolBatch):
                self._batch_cut_events()  # a parallel batch's calls that came back, as above
            raise
        finally:
            if journal is not None:
                journal.rest()
        if unmade:  # the calls beside them came back, or ran to their end
            cancelled = self._cancel is not None and self._cancel.cancelled
            return self._interrupt(INTERRUPTED if cancelled else EXPIRED, self._aunfinished(effect, unmade))
        return None

    async def _amake_call(self, effect: ModelCall | ToolBatch, unmade: list[str]) -> None:
        if isinstance(effect, ModelCall):
            await self._acall_model(effect)
        else:
            await self._run_batch(effect.calls, unmade)

    @adriving
    async def afinish(self) -> RunResult:
        """Await the run to the end; return the result or apply the stop's policy, like ``finish()``."""
        stepper = self.stepper
        gated = stepper.gated  # a run without approvals never gains calls to decide on
        try:
            while self._result is None:
                if gated and stepper.paused and self._closing is None:
                    return self._paused_result()
                await self._aadvance()  # the loop itself checked what aadvance() would
        except BaseException as exc:
            self._left_unfinished(exc)
            raise
        return self._outcome_of_run()

    async def _aheld_in_time(self) -> Transition | None:
        """``SyncDriver._held_in_time``, the lease held with the store's async methods."""
        journal = self._journal
        if journal is not None and journal.due():
            await journal.ahold(self.position)
        return self._interrupt(EXPIRED, None) if self._out_of_time() else None

    async def _aprocessed(self, effect: ModelCall) -> ModelCall | Transition:
        """``SyncDriver._processed``, awaited (``core.history.aprocessed``: a sync processor on a thread).

        A cancel of the task meanwhile stops the run ``cancelled`` before the
        call, as one during the call does (``_acarry``).
        """
        import asyncio

        journal = self._journal
        if journal is not None:
            journal.abeat()
        try:
            # A copy: the run's recorded history stays as it is.
            messages = await aprocessed(list(effect.messages), self._settings.history_processors, self._remaining())
        except DeadlineError:
            return self._interrupt(EXPIRED, None)  # they took the time left: the call is not made
        except Exception as exc:  # noqa: BLE001 - what the model would have been sent is unusable: model_error
            self._model_failed(exc)
            self._observe()
            return self._step()
        except asyncio.CancelledError as exc:
            if not isinstance(exc.__cause__, KeyboardInterrupt | SystemExit) and left_above() is None:
                self._interrupt(INTERRUPTED, None)  # the task cancelled before the call: stopped, no call made
            raise
        finally:
            if journal is not None:
                journal.rest()
        self.stepper.will_send(messages)
        return ModelCall(tuple(messages), effect.tools, effect.turn)

    async def _acall_model(self, effect: ModelCall) -> None:
        try:
            acomplete = getattr(self._model, "acomplete", None)
            astream = self._streaming("acomplete_stream") if self._wants_text else None
            keywords = self._settings.model_keywords or _PLAIN
            if astream is not None:
                stream, on_text = astream
                response = await stream(effect.messages, effect.tools, on_text, **keywords["acomplete_stream"])
            elif acomplete is not None:
                response = await awaitable_reply(acomplete(effect.messages, effect.tools, **keywords["acomplete"]))
            else:
                response = await self._athreaded(self._model.complete, effect, keywords["complete"])
        except Exception as exc:  # noqa: BLE001 - any model failure is a model_error stop
            self._model_failed(exc)
            return
        except BaseException as exc:
            self._cut_in_call(exc)
            raise
        if not self._observed:
            self.stepper.accept_reply(response)  # _model_replied without the events nobody reads
            return
        self._model_replied(response)  # written and told once the call's deadline and cancel no longer cut it

    async def _aafter_reply(self) -> None:
        """The reply's write and its ``after_model`` event, past the call's deadline: a cut there cuts no model call.

        Written before its hooks run, so a crash or a Ctrl-C in one asks the
        model not again (``Journal.akeep_reply``).  Why not inside the call:
        an await there is where the call's deadline or a cancel would land,
        and it would stop the run as if the call were cut, its reply dropped.
        """
        self._reply_unheard = False
        journal = self._journal
        if journal is not None and self._hooks.get("after_model"):
            await journal.akeep_reply(self.position)
        self._after_model()

    async def _athreaded(self, complete: Any, effect: ModelCall, keywords: Mapping[str, Any]) -> Any:
        """A sync model's call on a worker thread: a daemon one in a run with a deadline, which may abandon it."""
        import asyncio

        if not self.has_deadline():
            return await asyncio.to_thread(complete, effect.messages, effect.tools, **keywords)
        return await in_daemon_worker(lambda: complete(effect.messages, effect.tools, **keywords))

    async def _aopen_store(self, *, new: bool, overwrite: bool = False, expected: int | None = None) -> None:
        """``_open_store``, awaited: the store's async methods write the run and take its lease."""
        if self._journal is not None:
            self._observe()
            await self._journal.aopen(self.position, self.paused, new=new, overwrite=overwrite, expected=expected)

    async def _aafter(self, entry: Transition) -> Transition:
        """``_after``, awaited: the transition's checkpoint is the async driver's write (``_asave``)."""
        self._deferred = True
        try:
            self._after(entry)
        finally:
            self._deferred = False
        await self._asave()
        return entry

    async def _asave(self) -> None:
        """Checkpoint the transition just taken, awaited (the async driver's write), then close it."""
        journal = self._journal
        if journal is not None:
            await journal.asave(self.position, self.paused)
            entry, self._closing = self._closing, None
            if entry is not None:
                self._close(entry)

    async def _aend_cut(self) -> None:
        """Its task cancelled during or just after a write (``cut_runs``), or its stream's reader gone: ended, no call.

        The cut write is written or read back, the transitions needing no call
        are taken (an answer that had come ends it ``Done``), and the run stops
        ``cancelled`` on the ``interrupted`` edge before any call (a finalize call's
        too: the run keeps its stop, the call left for a resume).
        """
        stepper = self.stepper
        while self._result is None:
            if self._closing is None:
                if stepper.gated and stepper.paused:
                    return  # written paused: nothing is called until a decision
                self._observe()
                if isinstance(stepper.effect(), ModelCall | ToolBatch | CompactHistory):
                    self._deferred = True
                    try:
                        self._interrupt(INTERRUPTED, None)
                    finally:
                        self._deferred = False
                    await self._asave()
                    return
            await self.aadvance()

    async def _akeep_cut(self, exc: BaseException) -> None:
        """``_keep_cut``, awaited; also when ``exc`` is the cancel a call's Ctrl-C became (``leaving.left_above``).

        The run is whole there too: the batch's other calls are cut or came
        back, and a task of this loop changes the run only between two awaits.
        """
        journal = self._journal
        if journal is None or not self._cut_here(exc) or not journal.unwritten(self.position):
            return
        try:
            await journal.akeep(self.position, self.paused)
        except BaseException:  # noqa: BLE001 - the interrupt propagates; the next owner hears those transitions again
            logger().warning("fsm_agent: the run cut by an interrupt in a call could not be written", exc_info=True)

    def _aunfinished(self, effect: ModelCall | ToolBatch, unmade: list[str]) -> str | None:
        if isinstance(effect, ModelCall):
            return f"model call of turn {effect.turn}"
        ran = self.position.calls.ran
        waiting = [call.id for call in effect.calls if call.id not in ran and call.id not in unmade]
        return ", ".join(waiting) or None
