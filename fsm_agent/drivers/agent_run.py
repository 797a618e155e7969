"""``AgentRun``, one run of an agent: both drivers over one stepper, and how a run comes back from its snapshot.

``advance()``/``finish()`` call, ``aadvance()``/``afinish()`` await, and a
run may switch between them at any transition.  ``Agent.run``, ``arun``,
``stream`` and ``astream`` are built on them; ``Agent.resume`` and
``aresume`` on ``AgentRun._resumed``, and differ only in how they claim the
run in its store.
"""

from __future__ import annotations

import contextlib
import queue
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from fsm_agent.core import snapshot
from fsm_agent.core.approval import check_approvals, rule_name
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.late_decisions import not_pending, too_late
from fsm_agent.core.snapshot_fields import request_turns
from fsm_agent.definition.derived import describe_resumable
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.definition.stops import blocking_stop, next_call_forbidden
from fsm_agent.drivers import streaming
from fsm_agent.drivers.aio import AsyncDriver
from fsm_agent.drivers.checks import check_sync_model
from fsm_agent.drivers.cut_runs import astop_cut
from fsm_agent.drivers.streaming import StreamEvent
from fsm_agent.drivers.sync import SyncDriver
from fsm_agent.drivers.watched import Observer
from fsm_agent.errors import DecisionError, SnapshotError
from fsm_agent.records import RunResult, Transition

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.persist.store import Store


class AgentRun(SyncDriver, AsyncDriver):
    """One run of an agent, driven by ``advance()``/``aadvance()`` (one transition) or ``finish()``/``afinish()``."""

    def stream(self) -> Generator[StreamEvent, None, None]:
        """Drive the run to its end or a pause, yielding its events from here on, as ``Agent.stream`` does.

        For a run ``Agent.resume`` returned (after a person's decision, say):
        the resume edge it took is in its trace, and the stream begins with
        the transition after it.  Stopping early stops the run as it does
        for ``Agent.stream``.
        """
        check_sync_model(self.agent.model, "stream", "run.astream()", "complete_stream")
        feed: queue.SimpleQueue[StreamEvent] = queue.SimpleQueue()
        yield from streaming.events(self, feed)

    async def astream(self) -> AsyncGenerator[StreamEvent, None]:
        """The async twin of ``stream`` (a model streams through ``acomplete_stream``)."""
        feed: deque[StreamEvent] = deque()
        # Closed with this generator (a reader that stops reading), as ``yield from`` closes the sync one's.
        async with contextlib.aclosing(streaming.aevents(self, feed)) as events:
            async for event in events:
                yield event

    @classmethod
    def _resumed(
        cls,
        agent: Agent,
        source: RunResult | dict[str, Any] | str,
        approvals: Mapping[str, bool | str] | None,
        retry: bool,
        cancel: CancelToken | None,
        observers: Sequence[Observer],
        store: Store | None,
        lifted: Mapping[str, Any],
        deps: Any = None,
        *,
        resumable: str | None = None,
        instead: str | None = None,
    ) -> tuple[Self, int | None, Transition | None]:
        """A run of ``agent`` back from its snapshot (``Agent.resume``), the version to claim it at, and its edge.

        ``lifted`` holds the new limits (None: the run's own).  Nothing is
        written yet: the caller claims the run at ``expected`` (the version
        its snapshot was read at), then closes the resume edge (None for a
        run that was paused, not stopped).  ``deps`` are the new owner's: a
        snapshot never holds them.  ``resumable`` says, in the error at a stop
        these limits do not lift, which stops the caller goes on from
        (default: those ``Agent.resume`` does), and ``instead`` what else it
        can do where they forbid the call the run goes on with.
        """
        from fsm_agent.persist.journal import (  # see stored: import fsm_agent loads no store module
            forked_from_of,
            link_of,
        )
        from fsm_agent.persist.summary import session_id, stored_version

        if isinstance(source, RunResult):
            if source.snapshot is None:
                msg = f"a RunResult with reason {source.reason!r} has no snapshot: only stopped or paused runs resume"
                raise ValueError(msg)
            source = source.snapshot
        try:
            data = snapshot.parse(source)
        except SnapshotError as exc:
            _no_json(source, exc)
            raise
        expected = stored_version(data)
        if approvals and expected is not None and store is None:
            raise ValueError(_decided_without_store(data.get("run_id")))
        position = Run(snapshot.limits_of(data, **lifted), [], table=agent.table, policies=agent.on_stop)
        snapshot.load(position, data, agent.table.states)
        run_id, start_id = data.get("run_id"), data.get("start_id")
        run = cls(
            agent,
            position,
            cancel=cancel,
            observers=observers,
            store=store,
            run_id=run_id if isinstance(run_id, str) and run_id else None,
            start_id=start_id if isinstance(start_id, str) else "",  # none: a snapshot older than start ids
            session=session_id(data.get("session_id")),
            request=session_id(data.get("request_id")),  # the request that took a session's turn: kept with it
            parent=link_of(data),
            forked_from=forked_from_of(data),
            deps=deps,
        )
        run._resumes = True  # its call events say the run was under way (a run cut before its first transition too)
        if run._journal is not None and (turns := request_turns(data)):
            run._journal.name_requests(turns)  # a session's turn keeps the request ids its session's turns took
        try:
            run.stepper.gate()  # this agent's approve= holds back calls too, beside those the run already holds back
        except Exception as exc:
            # Asked before anything is claimed: the user's error is raised as it is, the run left as it was.
            assert run.stepper.approve is not None  # gate() asks nothing without a predicate
            exc.add_note(
                f"raised by {rule_name(run.stepper.approve)} while resuming run {run.run_id or '(no id)'}: "
                "nothing was claimed, written or called; resume it again once the predicate answers"
            )
            raise
        if position.at.state is State.Done:
            msg = "the run finished in Done; there is nothing to resume"
            if isinstance(approvals, Mapping) and approvals:
                # Decisions that came too late (another request resumed the run): told the decision that stood.
                check_approvals(approvals)  # a malformed decision is the request's error, not a late one
                late = f"{msg}: {too_late(position, approvals, run.stepper.approve)}"
                raise DecisionError(run.run_id, next(iter(approvals)), late)
            raise ValueError(msg)
        entry = None
        if position.at.state is State.Failed:
            run._observe()
            entry = run.stepper.resume(retry, snapshot.limits_of(data))  # the edge keeps what it stopped under
            if entry is None:
                evidence = position.at.evidence
                failed = position.at.reason == "model_error" and "error" in evidence  # what the model call raised
                msg = (
                    f"the run stopped with {position.at.reason!r}"
                    + (f" ({evidence.get('type', 'error')}: {evidence['error']})" if failed else "")
                    + f", which these limits do not lift{_also_forbidding(position)} (counters {position.counters()}); "
                    f"{resumable or describe_resumable(agent.table.stops)}"
                )
                if isinstance(approvals, Mapping) and approvals:
                    check_approvals(approvals)  # a malformed decision is the request's error, not a late one
                    if gone := not_pending(position, approvals, run.stepper.approve):
                        # Decided on calls the stopped run went past (another request resumed it to this stop).
                        late = f"{gone[1]}; the run has stopped ({position.at.reason})"
                        raise DecisionError(run.run_id, gone[0], late)
                raise ValueError(msg)
        if approvals:
            # Decided before the claim, so the claim stores the decisions and, with nothing left to wait
            # for, keeps the lease: nobody can decide or resume in between, and a refused decision writes nothing.
            run.decide(approvals)
        if entry is None:
            _refuse_spent(position, snapshot.limits_of(data), instead or "resume with the run's own limits")
        # The caller takes the run over before anything is called: a run another owner is advancing is a
        # RunLeasedError there, and one that moved on since this snapshot was read (or that the snapshot was never
        # read from) a StaleRunError.  A stopped run is claimed with its resume edge already taken, so the claim
        # keeps the lease; claimed while still Failed it would be let go at once, and a second owner could take it.
        return run, expected, entry

    def _claimed(self, expected: int | None, entry: Transition | None, still: Callable[[], None] | None = None) -> None:
        """The resumed run claimed in its store at ``expected`` (``_resumed``), and its resume edge taken, heard.

        ``still`` is asked between the claim and the edge, and may refuse the
        resume by raising, nothing called; it leaves the stored run as it
        must be (a session's resume writes its turn back: ``session_owners``).
        """
        self._open_store(new=False, expected=expected)
        if still is not None:
            still()
        if entry is not None:
            self._after(entry)  # observers and the store see the resume edge like any other

    async def _aclaimed(
        self, expected: int | None, entry: Transition | None, still: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``_claimed``, awaited; a cancel that cuts it ends the run (``_aopened``) before it propagates."""
        await self._aopened(entry, still, new=False, expected=expected)

    async def _aopened(
        self,
        entry: Transition | None,
        still: Callable[[], Awaitable[None]] | None = None,
        *,
        new: bool,
        expected: int | None = None,
    ) -> None:
        """The run written whole (created, or claimed at ``expected``), ``still`` asked, its edge ``entry`` taken.

        The caller (``Agent.aresume``, ``Agent.afork``, a session's resume)
        never gets the run when a cancel cuts this, so nobody would go on
        with it: a write the store committed, cut or not, would hold the
        run's lease until it lapses, and an answer sent again would wait for
        it.  So the cut run is ended (``astop_cut``).
        """
        landed = False
        try:
            await self._aopen_store(new=new, expected=expected)
            landed = True
            if still is not None:
                await still()
            if entry is not None:
                await self._aafter(entry)
        except BaseException as exc:
            # Only a cancel (a BaseException that is no Exception) ends a run whose write landed: an Exception is a
            # refusal (``still``'s RunStateError, a StaleRunError), and whoever raised it left the run as it must be.
            await astop_cut(self, exc, landed=landed and not isinstance(exc, Exception))
            raise


def _refuse_spent(position: Run, own: Limits, instead: str) -> None:
    """A ``ValueError`` if new limits forbid the call the run comes back to make (``next_call_forbidden``).

    Why refused rather than stopped: the run is past the checkpoint where
    that stop is taken (passed under its own limits), so it would make the
    call first; refused, nothing is called or written.  Limits equal to the
    run's own (a takeover) are not checked: they let the call through when
    the run got there.
    """
    if position.limits == own:
        return
    stop = next_call_forbidden(position)
    if stop is None:
        return
    pending = position.calls.pending
    call = f"tool call {pending[0].id!r} ({pending[0].name})" if pending else "a model call"
    assert stop.limit is not None  # a limit's stop: next_call_forbidden's
    assert stop.counter is not None
    used, what = position.counters()[stop.counter.name][0], stop.counter.name
    scope = stop.evidence(position).get("scope", "*")  # a tool's own cap (max_tool_calls={"send": 3}): its count
    if scope != "*":
        used, what = stop.evidence(position)["used"], f"calls of {scope}"
    was = getattr(own, stop.limit)
    msg = (
        f"the run goes on with {call}, which these limits forbid: {stop.limit}={getattr(position.limits, stop.limit)!r}"
        f", with {what} at {used!r} already ({stop.reason}; counters {position.counters()}); give a higher "
        f"{stop.limit} (the run's own {'has none' if was is None else f'is {was!r}'}), or {instead}"
    )
    raise ValueError(msg)


def _no_json(source: object, exc: SnapshotError) -> None:
    """A ``SnapshotError`` saying what resume takes, if ``source`` was a text that is no JSON at all (``exc``'s cause).

    Such a text is most often a stored run's id, which resume does not look
    up: the error shows how to resume that run.  A text that starts like a
    snapshot (``{``) keeps ``exc``, which says where its JSON breaks.
    """
    if isinstance(source, str) and isinstance(exc.__cause__, ValueError) and not source.lstrip().startswith("{"):
        shown = source if len(source) <= 60 else f"{source[:57]}..."
        if not source.strip():
            msg = "resume takes a snapshot (a dict or its JSON text) or a stopped or paused RunResult, not a blank text"
            raise SnapshotError(msg) from exc
        msg = (
            f"resume takes a snapshot (a dict or its JSON text) or a stopped or paused RunResult, and the text "
            f"{shown!r} is no JSON; to resume the stored run of that id, pass its snapshot: "
            f"agent.resume(store.load({shown!r}), store=store)"
        )
        raise SnapshotError(msg) from exc


def _decided_without_store(run_id: object) -> str:
    """Why decisions on a snapshot loaded from a store are refused without that store: the call would run twice.

    Why: the stored run would stay paused, undecided, while this one makes
    the call; the next resume from the store (``runs resume``, the viewer)
    would make it again.  Resuming such a snapshot without its store and
    without decisions stays allowed: nothing is decided behind the store's back.
    """
    return (
        f"approvals given for run {run_id!r}, a snapshot of a stored run, without store=: the stored run would "
        "stay paused and make the call again when resumed from the store; pass store= (the store it came from), "
        "or record the decisions there with store.decide and resume with store="
    )


def _also_forbidding(position: Run) -> str:
    """What a refused resume's message adds when another stop than the run's own forbids the next call.

    Several stops can hold at once and only the first is recorded: a run
    cancelled on its last allowed turn also stands at ``max_steps``, and a
    fresh token alone lifts its stop but not that one.  Naming it says
    which limit to raise as well.
    """
    blocker = blocking_stop(position)
    if blocker is None or blocker == position.at.reason:
        return ""
    return f": {blocker!r} holds as well and forbids the next call, so raise its limit too"
