"""What a recorded run met from outside the machine, met again where it met it: its clock, its cancel token, its cuts.

A recorded run's calls came back when they came back, its deadline passed,
its token was cancelled, its task was cut with a call in flight: none of
that is in its replies or results, but each left its stop in the trace at
one index.  A run taken again from the recording (a replay,
``fsm_agent.testing.replay``; a fork's rebuild, ``drivers.rebuild``) makes
no real call, so its calls come back at once and nobody cancels it; it
meets each of those stops again here, at the same index.  Why in
``drivers``: both a fork (a driver's) and a replay (``testing``) use it,
and the drivers import nothing of ``testing``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from fsm_agent.core.approval import rejection_in
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.snapshot import cut_shares_of, cuts_taken_back_of
from fsm_agent.definition.states import AwaitModel
from fsm_agent.definition.triggers import EXPIRED, INTERRUPTED
from fsm_agent.drivers.fork_source import error_in
from fsm_agent.records import ChildOutcome, ToolCall, Transition

if TYPE_CHECKING:
    from fsm_agent.drivers.agent_run import AgentRun


class Departs(Protocol):
    """The model a recorded run is taken again with: ``departure`` is not None once a request left the recording.

    A fork's rebuild never departs (it refuses instead); a replay's
    ``RecordedModel`` may, and past there the run is new (re-recording):
    no recorded cut is its own.
    """

    @property
    def departure(self) -> object | None: ...


class RecordedCuts:
    """Where the recorded run was cut with a call due: its ``interrupted`` edges (and a deadline's in a tool batch).

    Each is taken again where it was.

    Why a replay or a fork's rebuild needs them: its calls come back at once
    and nobody cancels its task, so the call the recorded run's task was
    cancelled in would be made, and the run depart there.  At a cut no call
    is made:
    a model call in flight counted as a turn (it may be billed) and left no
    reply, so the recording's next model call is of a later turn (one cut
    before it started left the turn uncounted); a tool batch's leading calls
    that came back before the cut are kept by its stop, so the run takes
    their outcomes first (as many as the resume did not make again; the
    recording's last stop names its cut calls, ``unfinished``).  What each
    cut counted of a sub-agent call in flight (``cut_shares``; the same
    for a deadline's or a cancel's stop, whichever edge it took) is counted
    again before the transition where it was, and where the recorded run
    was made a fork, what it took back (``cuts_taken_back``) is taken back.
    """

    def __init__(self, recording: dict[str, Any], model: Departs) -> None:
        self.model = model  # a replay whose request departed is a new run past there (re-recording): never cut
        self.trace: list[dict[str, Any]] = recording["trace"]
        # A deadline that passed while a tool batch was out is such a cut too: the batch's leading calls that came
        # back first are kept by its stop.
        self.at = [
            i
            for i, entry in enumerate(self.trace)
            if entry["trigger"] == INTERRUPTED or (entry["trigger"] == EXPIRED and entry["source"] == "ExecuteTool")
        ]
        self.turns = [call.get("turn") for call in recording["model_calls"]]
        self.last = (len(self.trace) - 1, recording.get("unfinished"))
        # The calls the recording holds an outcome of: a call answered without one (its run stopped, or finalized,
        # before making it: "not executed") was never made, and came back before no cut.
        self.answered = {call["id"] for call in recording["tool_calls"]}
        # A call a person rejected was never made either, but its rejection is taken in one transition as a
        # result is: after a resume it is one of the calls the resume took in.
        self.answered |= {i for i, (_, said) in recorded_decisions(recording).items() if said is not True}
        # Each cut's share of a sub-agent call, by the transitions taken before it was counted (none recorded: a
        # recording from before they were kept, whose answers bring what the cuts counted instead; fork_spend).
        self.shares: dict[int, list[tuple[str, ChildOutcome]]] = {}
        for at, call_id, share in cut_shares_of(recording):
            self.shares.setdefault(at, []).append((call_id, share))
        self.taken_back = set(cuts_taken_back_of(recording))
        self._counted: set[int] = set()

    def ahead(self, run: AgentRun) -> bool:
        """Whether ``run`` is to be taken one transition at a time (``take``, else advance), or ``finish()``-ed.

        One at a time up to its last recorded cut, cut's share, or fork point's take-back.
        """
        index = len(run.trace)
        points = (*self.at, *self.shares, *self.taken_back)
        return any(at >= index for at in points) and not run.done and not run.paused

    def take(self, run: AgentRun) -> Transition | None:
        """Cut ``run`` as the recorded run was if it is about to take a recorded cut (the calls that came back first).

        The cut's transition, or None where no recorded cut comes next.  What
        the recorded run's cuts counted just before this transition is
        counted first.
        """
        self._count_shares(run)
        back = self._due(run)
        if back is None:
            return None
        for call in back:
            run.stepper.accept_tool(call, run._registry.execute(call))  # noqa: SLF001 - the call the driver made
        return self._cut(run)

    async def atake(self, run: AgentRun) -> Transition | None:
        """``take``, the calls that came back first awaited."""
        self._count_shares(run)
        back = self._due(run)
        if back is None:
            return None
        for call in back:
            run.stepper.accept_tool(call, await run._registry.aexecute(call))  # noqa: SLF001 - as in take
        return self._cut(run)

    def _count_shares(self, run: AgentRun) -> None:
        """Count the shares the recorded run's cuts counted before the transition ``run`` takes next, once.

        First, where the recorded run was made a fork there, take back what
        cuts counted of its calls unanswered (as the fork did, before any
        cut of its own).
        """
        index = len(run.trace)
        due = index in self.shares or index in self.taken_back
        if not due or index in self._counted or not self._own(run, index):
            return
        self._counted.add(index)
        if index in self.taken_back:
            run.stepper.forked_here()
        run.stepper.cuts_recorded(self.shares.get(index, ()))

    def _own(self, run: AgentRun, index: int) -> bool:
        """Whether ``run`` took the recorded run's transitions so far (re-recording past a departure does not)."""
        return self.model.departure is None and list(run.trace) == [Transition(**e) for e in self.trace[:index]]

    def _due(self, run: AgentRun) -> list[ToolCall] | None:
        """None if ``run`` is not about to take a recorded cut; else the calls of its batch that came back before it."""
        index, position = len(run.trace), run.position
        if index not in self.at or run.done or run.paused or position.at.state != self.trace[index]["source"]:
            return None
        if not self._own(run, index):
            return None  # departed before (re-recording goes on live): the recorded cut is not this run's
        if position.at.state is AwaitModel:
            return []
        pending = list(position.calls.pending)
        if index == self.last[0]:  # its stop named the calls it cut, those before the first came back (none: none)
            cut = set(str(self.last[1]).split(", ")) if self.last[1] is not None else {c.id for c in pending}
            return pending[: next((n for n, call in enumerate(pending) if call.id in cut), len(pending))]
        # The calls of the batch the resume made (or took in) one transition each, up to the turn's end; a later
        # cut of the batch (``interrupted``) made none: its calls are made after the resume that follows it, or,
        # where the recording ends before the turn does or a stop answers them unmade, never (no outcome is recorded).
        made = sum(1 for call in pending if call.id not in self.answered)
        for entry in self.trace[index + 1 :]:
            if entry["source"] == "ExecuteTool" and entry["trigger"] != "interrupted":
                made += 1
                if entry["dest"] != "Dispatch":
                    break
        return pending[: max(len(pending) - made, 0)]

    def _cut(self, run: AgentRun) -> Transition:
        """The driver's stop for the call its task's cancel (or its deadline) cut: the edge the recorded run took."""
        index, position = len(run.trace), run.position
        if index == self.last[0]:  # the recording ends on this stop: it names what it cut (none: cut before a call)
            named = str(self.last[1] or "")
        elif position.at.state is AwaitModel:
            turn = position.counts.turns + 1
            made = turn not in self.turns and any(isinstance(t, int) and t > turn for t in self.turns)
            named = f"model call of turn {turn}" if made else ""
        else:
            ran = position.calls.ran
            named = ", ".join(call.id for call in position.calls.pending if call.id not in ran)
        trigger = self.trace[index]["trigger"]
        return run._interrupt(trigger, named or None)  # noqa: SLF001 - the driver's own stop, as it took it


_AFTER_CALL = ("tool_done", "finalize")
"""The triggers of a stop from ``ExecuteTool`` that the recorded run saw once the call it closes had come back."""


class RecordedOutside:
    """What the recorded run met from outside the machine, met again just before the same transitions.

    A replay's (or a fork's rebuild's) calls come back at once, so its clock would never reach a
    recorded deadline, nor would anybody cancel its token.  ``clock`` stands
    still but for passing the run's ``timeout`` at each transition where the
    recorded run stopped on it (or finalized on it), and ``token()`` (a
    recording that stopped with ``cancelled`` only) is cancelled at each where
    it stopped with ``cancelled``.  "Just before" that transition: once the
    call it closes came back, for a stop after a tool call; at once for any
    other, so a stop before a call (``expired``) is taken without making it.
    The transition comes next when the run taken again (``run``) holds as
    many transitions as its index.  ``cuts`` are where its task was cancelled
    with a call due (``interrupted`` edges, see ``RecordedCuts``).
    """

    def __init__(self, recording: dict[str, Any], model: Departs) -> None:
        trace = recording["trace"]
        self.cuts = RecordedCuts(recording, model)
        self.stops: dict[int, tuple[str, bool]] = {}  # index: (reason, whether the call before it must be back)
        last = len(trace) - 1
        for index, entry in enumerate(trace):
            dest, trigger, reason = entry["dest"], entry["trigger"], entry.get("reason")
            if trigger == "finalize" and entry.get("guard") == "finalize_on_timeout":
                reason = "timeout"
            elif dest != "Failed" or trigger == "interrupted":
                continue
            if reason == "output_invalid":
                reason = _blocked_by(recording, index, last)
            if reason in ("timeout", "cancelled"):
                self.stops[index] = (reason, entry["source"] == "ExecuteTool" and trigger in _AFTER_CALL)
        self.run: AgentRun | None = None
        self.until: int | None = None
        """The last transition taken again (a fork's point); a stop after it is not met (None: every stop)."""
        self.now = 0.0
        self._met: set[int] = set()
        self._token: CancelToken | None = None

    def token(self) -> CancelToken | None:
        """A fresh cancel token for the next run taken again (a resumed one too); None if no cancel was recorded."""
        if not any(reason == "cancelled" for reason, _ in self.stops.values()):
            return None
        self._token = CancelToken()
        return self._token

    def clock(self) -> float:
        """Seconds since the run was taken again: still, but past the deadline where the recorded run was."""
        run = self.run
        if run is None:
            return self.now
        index = len(run.trace)
        stop = self.stops.get(index)
        if stop is None or index in self._met or (self.until is not None and index > self.until):
            return self.now
        reason, after_call = stop
        if after_call:
            pending, ran = run.position.calls.pending, run.position.calls.ran
            if not pending or pending[0].id not in ran:
                return self.now  # the tool call this transition closes has not come back yet
        self._met.add(index)
        if reason == "timeout":
            timeout = run.limits.timeout
            if timeout is not None:
                self.now = max(self.now, timeout)
        elif self._token is not None:
            self._token.cancel("the recorded run was cancelled here")
        return self.now


def _blocked_by(recording: dict[str, Any], index: int, last: int) -> str | None:
    """The cut that forbade the retry an ``output_invalid`` stop at ``index`` owed its answer (None: none, or a limit).

    The recording's last stop names it (``blocked_by``).  One it went on
    from (``resumes_output_retry``) names nothing, and a limit that forbade
    the retry there is met again by the run taken again, under the same
    limits; so any other is met as a cancel: its resume, with a fresh token,
    goes on as the recorded one did.
    """
    if index == last:
        return recording.get("blocked_by")
    trace = recording["trace"]
    resumed = index + 1 < len(trace) and trace[index + 1].get("guard") == "resumes_output_retry"
    return "cancelled" if resumed else None


def recorded_decisions(recording: dict[str, Any]) -> dict[str, tuple[str, bool | str | None]]:
    """What the recording says of each call a person could have decided on: by call id, its tool and the decision.

    None: the call ran without waiting for anyone; True: it waited and was
    approved; False or a reason text: a person rejected it.  A call that
    ran is known where the recording kept whether it waited (``held``, kept
    for runs made since it was); a rejected one in any recording, from the
    answer the model was given.  Calls the recording says nothing of are
    left out.
    """
    found: dict[str, tuple[str, bool | str | None]] = {}
    for call in recording["tool_calls"]:
        if isinstance(call.get("held"), bool):
            found[call["id"]] = (call["name"], True if call["held"] else None)
    ran = {c["id"] for c in recording["tool_calls"]}
    own = recording["messages"][recording["prior"] :]
    names = {c["id"]: c["name"] for m in own for c in m.get("tool_calls") or ()}
    for message in own:
        call_id = message.get("tool_call_id")
        if message["role"] != "tool" or call_id in ran or call_id not in names:
            continue
        rejected = rejection_in(names[call_id], error_in(message["content"]) or "")
        if rejected is not None:
            found[call_id] = (names[call_id], rejected)
    return found
