"""What a watched run tells its hooks and observers: call and transition events, streamed text, hooks that fail.

A run nobody watches builds no event at all (``RunBase._observed`` is
false), so all of this is the observed run's: kept apart from the run
handle, it reads as one concern, the events a transition and a call
produce, and the one way a strict hook's failure reaches the stepper.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fsm_agent.core.effects import ModelCall, ToolBatch
from fsm_agent.definition.states import ExecuteTool, Failed
from fsm_agent.observe.events import CallEvent, Hooks, TextDelta, TransitionEvent, logger, notify
from fsm_agent.records import ModelResponse, ToolCall, Transition
from fsm_agent.tools import ToolResult

if TYPE_CHECKING:
    from fsm_agent.core.settings import AgentSettings
    from fsm_agent.core.stepper import Stepper
    from fsm_agent.definition.run import Counters, Run
    from fsm_agent.records import RunResult

Observer = Callable[[TransitionEvent], None]
"""Who is handed every transition of a run, as a ``TransitionEvent`` (``Agent.run(observers=...)``)."""


class WatchedRun:
    """The events half of a run handle (``RunBase``): what its hooks, observers and text observers are told."""

    _reply_unheard = False
    """A model's reply was taken in; its write and ``after_model`` event are to come (the drivers' ``_after_reply``)."""

    # Most runs never change these, so they are read from the class until a run sets its own.
    _text_observers: tuple[Callable[[TextDelta], object], ...] = ()
    # What moved the current transition, for its event (an observed run's only).
    _response: ModelResponse | None = None
    _error: str | None = None
    _call: ToolCall | None = None
    _outcome: ToolResult | None = None
    # Ids of kept outcomes (``Calls.ran``) whose ``after_tool`` was already heard, at a cut or a stop, before the
    # transition that records them: taking one in announces it no more.  A run built from a position whose
    # ``Calls.ran`` holds outcomes starts with their ids (``RunBase``): the owner that cut the run announced them.
    _heard: set[str] | frozenset[str] = frozenset()
    # A run handle that goes on from a run begun before (AgentRun._resumed: a resume, a fork): its call events say so.
    _resumes = False
    # A stream is reading the run now (drivers.streaming): a second is refused, as it would drive the run too.
    _streamed = False
    position: Run
    stepper: Stepper
    _settings: AgentSettings
    _hooks: Hooks
    _observers: tuple[Observer, ...]
    _observed: bool
    _clock_each_transition: bool
    _wants_text: bool
    _shown: list[str]  # the text of the reply streaming in, kept for the stop's evidence if the reply never comes
    # Made by a run's first streaming call: held while a piece of text is taken in and heard, and while a stop
    # takes the text shown (_take_shown).
    _showing: threading.Lock | None = None
    _model: Any
    _result: RunResult | None

    if TYPE_CHECKING:  # the run handle's (RunBase)

        @property
        def run_id(self) -> str: ...

        @property
        def done(self) -> bool: ...

        def counters(self) -> Counters: ...

        def _paused_result(self) -> RunResult: ...

        def _out_of_time(self) -> bool: ...

        def _observe(self) -> None: ...

    def _heard_before(self, effect: ModelCall | ToolBatch) -> bool:
        """The ``before_model`` or ``before_tool`` event of the call about to be made; whether it may still be made.

        A hook is a watcher: one slow enough for the run's deadline to pass
        in it must not change what the run does.  Had the deadline passed just
        before the hooks, the call would not have been made (the drivers look
        before each call), so past it after them, it is not made either: the
        driver stops the run ``timeout`` with the call left unmade, and a
        resume makes it once.  A parallel batch's calls are heard each as it
        starts (``_heard_in_time``, from the async driver's batch).
        """
        if isinstance(effect, ModelCall):
            self._before_model()
        elif len(effect.calls) == 1:
            self._before_tool(effect.calls[0])
        else:
            return True
        return not self._out_of_time()

    def _heard_in_time(self, call: ToolCall) -> bool:
        """``_heard_before`` for one call of a parallel batch, as it starts: False if the deadline passed in its hooks.

        Only in its hooks: time a call beside it took (up already as this one
        starts) is the deadline's own business, cutting the calls in flight,
        as in a run nobody watches.  The batch leaves the calls after one so
        left unmade (``ConcurrentCalls._run_batch``), as the sync driver stops there.
        """
        before = self._out_of_time()
        self._before_tool(call)
        return before or not self._out_of_time()

    def _before_model(self) -> None:
        """The ``before_model`` event (only for an observed run)."""
        self._call_hooks(self._call_event("before_model", self.position.counts.turns + 1))

    def _watched_by(self, observer: Observer) -> None:
        """Tell ``observer`` of each transition from the next on too: a stream of a run begun without one."""
        self._observers = (*self._observers, observer)
        self._observed = True
        self._clock_each_transition = True  # an observed run is told the time before every transition (RunBase)

    def _unwatched_by(self, observer: Observer, text: Callable[[TextDelta], object] | None = None) -> None:
        """Tell ``observer`` (and ``text``) no more: a stream that ended, so a later one of the run does not feed it.

        Why: a stream ended at a pause leaves a run that may be streamed
        again, maybe from another event loop; its old observers would still
        be handed every event, one of them a closed loop's.
        """
        self._observers = tuple(known for known in self._observers if known is not observer)
        if text is not None:
            self._text_observers = tuple(known for known in self._text_observers if known is not text)
            hooks = self._hooks
            self._wants_text = bool(self._text_observers) or (hooks.active and bool(hooks.get("text")))

    def on_text(self, observer: Callable[[TextDelta], object]) -> None:
        """Also hand this run's streamed reply text to ``observer``, from the thread or task calling the model.

        From then on a model that can stream (``complete_stream``,
        ``acomplete_stream``) is called that way; ``Agent.stream`` uses this.
        """
        self._text_observers = (*self._text_observers, observer)
        self._wants_text = True

    def _streaming(self, method: str) -> tuple[Callable[..., Any], Callable[[str], None]] | None:
        """The model's streaming ``method`` (``complete_stream``, ...), if it has one, and this call's ``on_text``.

        Asked once per model call, before the call is made: the text handed
        to that ``on_text`` is this call's alone, so a piece a cut call's
        thread sends later cannot pass for the next call's (see ``_text``).
        """
        found = getattr(self._model, method, None)
        shown: list[str] = []
        self._shown = shown  # a new reply's text
        if not callable(found):
            return None
        if self._showing is None:
            self._showing = threading.Lock()
        return found, lambda piece: self._text(shown, piece)

    def _text(self, shown: list[str], piece: str) -> None:
        """Hand a piece of a call's reply text to the ``text`` hooks and the text observers, unless the call was cut.

        A model's thread cannot be stopped: a call the run was cut in may go on
        streaming after the stop.  Its pieces then belong to no run, so once a
        stop took the call's text (``_take_shown``: ``shown`` is no longer
        ``_shown``) they are dropped.  The same lock makes a piece arriving as
        the stop is taken either kept (and heard) or dropped (and not heard).
        It is held only to keep the piece, not while hooks hear it: a hook
        that hangs must not hold up the deadline's stop.
        """
        if not piece:
            return
        showing = self._showing
        assert showing is not None  # made with this call's on_text (_streaming)
        with showing:
            if shown is not self._shown:
                return
            shown.append(piece)
        delta = TextDelta(piece, self.position.counts.turns + 1, self.run_id)
        if self._hooks:
            self._hook_failed(self._hooks.call("text", delta), False)
        if self._text_observers:
            self._hook_failed(notify(self._text_observers, delta), False)

    def _take_shown(self) -> str:
        """The text the model call being ended had shown, for its stop; the call's later pieces are dropped (``_text``).

        A run none of whose calls streamed has shown nothing, and needs no lock.
        """
        showing = self._showing
        if showing is None:
            return ""
        with showing:
            shown, self._shown = self._shown, []
        return "".join(shown)

    def _model_replied(self, response: object) -> None:
        """The reply taken in, and what its ``after_model`` event tells, once the driver wrote it (``_after_reply``)."""
        self.stepper.accept_reply(response)
        run = self.position
        if run.faults.model_exception is not None:
            self._error = f"{type(run.faults.model_exception).__name__}: {run.faults.model_exception}"
        else:
            self._response = run.talk.last_response
        self._reply_unheard = True

    def _model_failed(self, error: Exception) -> None:
        self.stepper.accept_model_error(error, self._take_shown())
        if self._observed:
            self._error = f"{type(error).__name__}: {error}"
            self._after_model()

    def _after_model(self) -> None:
        turn = self.position.counts.turns
        if self._error is not None:
            self._call_hooks(self._call_event("after_model", turn, error=self._error))
        else:
            self._call_hooks(self._call_event("after_model", turn, response=self._response))

    def _before_tool(self, call: ToolCall) -> None:
        """The ``before_tool`` event (only for an observed run)."""
        self._call_hooks(self._call_event("before_tool", self.position.counts.turns, tool_call=call))

    def _tool_done_event(self) -> None:
        """The ``after_tool`` event of the call the next transition records (a rejected one included)."""
        run = self.position
        call = run.calls.pending[0]
        outcome = self.stepper.outcome_of(call)
        if outcome is None:
            return
        if call.id not in run.calls.ran:
            self._before_tool(call)  # a rejected call: it never ran, but observers see it dealt with
        self._call, self._outcome = call, outcome
        if call.id not in self._heard:  # else its end was heard when its batch was cut (_batch_cut_events)
            self._after_tool(call, outcome)

    def _tool_step(self) -> Transition:
        """Take a transition out of ``ExecuteTool``, heard: the call it records, and the calls a stop keeps beside it.

        A stop in the middle of a replayed batch (``tool_failures``, a strict
        hook's error) keeps the batch's calls that ran (evidence ``also_ran``,
        or ``came_back`` for a resume to take in): their ``after_tool`` events
        come before the stop's transition event, as at a cut.
        """
        self._tool_done_event()
        self._observe()  # a cancel (or the time) its after_tool hooks took: the edge to the next call reads it
        calls = self.position.calls
        ran = calls.ran
        beside = None
        if ran and calls.pending and (len(ran) > 1 or calls.pending[0].id not in ran):
            first = calls.pending[0].id
            beside = [(call, ran[call.id]) for call in calls.pending if call.id in ran and call.id != first]
        entry = self.stepper.step()
        if beside:
            ran, done = self.position.calls.ran, self.done
            for call, outcome in beside:
                if (done or call.id not in ran) and call.id not in self._heard:
                    self._heard_end(call, outcome)
        return entry

    def _heard_end(self, call: ToolCall, outcome: ToolResult) -> None:
        """The ``after_tool`` event of a kept call before the transition that records it, remembered (``_heard``)."""
        heard = self._heard
        if not isinstance(heard, set):
            heard = self._heard = set()
        heard.add(call.id)
        self._after_tool(call, outcome)

    def _after_tool(self, call: ToolCall, outcome: ToolResult) -> None:
        """The ``after_tool`` event of a call that ran: none for one a fork took from its source (``reused_from``).

        Such a call was not made (no ``before_tool`` opened it): the hooks hear
        only executions, and the transition that records it, with
        ``reused_from`` set, is how a watcher sees it taken.
        """
        if outcome.reused_from is not None:
            return
        turn, result, error = self.position.counts.turns, outcome.content, outcome.error
        self._call_hooks(self._call_event("after_tool", turn, tool_call=call, tool_result=result, tool_error=error))

    def _left_unfinished(self, exc: BaseException) -> None:
        """The ``unfinished`` event: ``exc`` left the run where it was, neither ended nor paused.

        A ``KeyboardInterrupt`` in a tool, a store that refused a write: the
        run stays as it was for a resume, and observers that opened something
        for it (a trace's spans) hear that it was left.
        """
        if not self._observed or self._result is not None:
            return
        cause = exc.__cause__
        if isinstance(cause, KeyboardInterrupt | SystemExit) and not isinstance(exc, Exception):
            exc = cause  # a sub-agent's run cut beside a call's interrupt (leaving.left_above)
        error = f"{type(exc).__name__}: {exc}"
        self._call_hooks(self._call_event("unfinished", self.position.counts.turns, error=error))

    def _batch_cut_events(self) -> None:
        """The ``after_tool`` events of a batch's calls that returned before the batch was cut.

        Their outcomes are kept (a resume does not make them again), but the
        transitions that would have recorded them are not taken: without this,
        observers heard those calls begin and never end.  Each is heard ending
        once: the transition that takes it in later (``_tool_done_event``, on
        this handle or on one resumed from the cut's snapshot) announces no more.
        """
        ran = self.position.calls.ran
        for call in self.position.calls.pending:
            outcome = ran.get(call.id)
            if outcome is not None and call.id not in self._heard:
                self._heard_end(call, outcome)

    def _emit(self, last: Transition) -> None:
        run = self.position
        call = self._call
        if call is None and last.dest == ExecuteTool and run.calls.pending:
            call = run.calls.pending[0]
        terminal = self.done
        paused = not terminal and self.stepper.gated and self.stepper.paused
        event = TransitionEvent(
            seq=len(run.at.trace) - 1,
            source=last.source,
            trigger=last.trigger,
            dest=last.dest,
            guard=last.guard,
            reason=last.reason,
            counters=self.counters(),
            response=self._response,
            error=self._error,
            tool_call=call,
            tool_result=None if self._outcome is None else self._outcome.content,
            tool_error=None if self._outcome is None else self._outcome.error,
            reused_from=None if self._outcome is None else self._outcome.reused_from,
            evidence=run.at.evidence if run.at.state is Failed else None,
            result=self._result if terminal else None,
            run_id=self.run_id,
            paused=self._paused_result() if paused else None,
        )
        raised = self._hooks.announce(event, run.at.state is Failed) if self._hooks else None
        # Observers (a log= file among them) fail as hooks do: logged, and a strict agent's stop (hook_error).
        told = notify(self._observers, event) if self._observers else None
        self._hook_failed(raised or told, terminal)
        if paused and self._hooks:
            self._paused_event()

    def _paused_event(self) -> None:
        """The ``paused`` event: the transition just taken left the run waiting for a person's decision.

        The run stays as it is for ``decide`` or a resume, here or in another
        process, which may never come: observers that opened something for it
        (a trace's run span) close it now.  ``tool_call`` is the call waiting.
        """
        run = self.position
        call = run.calls.pending[0] if run.calls.pending else None
        self._call_hooks(self._call_event("paused", run.counts.turns, tool_call=call))

    def _call_event(self, kind: str, turn: int, **payload: Any) -> CallEvent:
        """A call event of this run: the counters now, the run's id, whether it goes on from an earlier handle."""
        return CallEvent(kind, turn, self.counters(), run_id=self.run_id, resumed=self._resumes, **payload)

    def _call_hooks(self, event: CallEvent) -> None:
        self._hook_failed(self._hooks.call(event.kind, event), False)

    def _hook_failed(self, exc: BaseException | None, terminal: bool) -> None:
        if exc is None or not self._settings.strict_hooks or self.position.faults.hook_error is not None:
            return
        if terminal:
            logger().warning("fsm_agent: strict hook raised after the run finished; the result stands")
            return
        self.stepper.hook_failed(exc)
