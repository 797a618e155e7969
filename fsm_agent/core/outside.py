"""What a driver tells the stepper from outside the machine: the time, a cancel, a failed hook, a cut child, a resume.

The stepper is the one writer of a run (as h11's ``_state.py`` is of a
connection): a driver reads a clock, a cancel token and its hooks, and hands
what it saw to the stepper as an event here; it never sets a field of the
run itself.  A planned parallel batch freezes the run's clock and cancel
flag, so the replay of its calls takes the edges the plan assumed: while it
is frozen the time and a cancel are held, not taken in, until the replay of
the batch's last outcome (``thaw``), whose checks before the next model call
see them as the sync driver's would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import TYPE_CHECKING

import attrs

from fsm_agent.core.hand_down import (
    HandDown,
    canonical_arguments,
    down_key,
    holds_down,
    origins,
    split_down,
    take_carried_down,
)
from fsm_agent.core.ledger import answer_unexecuted, count_cut_child, count_cut_share, send_back, uncount_cuts
from fsm_agent.core.walker import Walker
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import AwaitModel, Failed
from fsm_agent.definition.table import first_row
from fsm_agent.definition.triggers import INTERRUPTED, RESUME
from fsm_agent.records import ChildOutcome, ToolCall, Transition
from fsm_agent.tools import ToolResult

if TYPE_CHECKING:
    from fsm_agent.core.output import OutputSpec


@attrs.frozen
class CutWithRun(ToolResult):
    """No outcome: a sub-agent call whose child stopped with this run (its cancel, its deadline), cut with the run.

    Why: the cancel or the deadline is the run's stop, not the child's answer
    (``child_runs``).  The call stays pending, counted as a cut (``spent``;
    ``child``: the part not counted yet), and the run stops on ``trigger``
    (``cancelled`` or ``timeout``); a resume makes it again.
    ``done``: the tool calls the child's run completed, when no store keeps
    that run, and which of them the cut counted: the new child run of the
    call made again takes their outcomes instead of calling its tools again
    (``Calls.carried_down``).
    """

    spent: ChildOutcome | None = None
    done: HandDown = attrs.field(factory=HandDown)
    trigger: str = INTERRUPTED


class OutsideEvents:
    """The stepper's half that takes in what the driver observed; each method is one event."""

    __slots__ = ()
    run: Run
    walker: Walker
    output: OutputSpec | None
    _took: set[str]

    def tell_time(self, elapsed: float) -> None:
        """The run has been going ``elapsed`` seconds by the driver's clock: the guards of a deadline read it."""
        run = self.run
        if run.at.frozen:
            run.at.held = (elapsed, run.at.held[1])
        else:
            run.counts.elapsed = elapsed

    def cancel(self, why: str) -> None:
        """The run's cancel token was set (``why``): the next transition stops the run with ``cancelled``."""
        run = self.run
        if run.at.frozen:
            run.at.held = (run.at.held[0], why)
        else:
            run.counts.cancelled, run.counts.cancel_why = True, why

    def thaw(self) -> None:
        """A planned batch's last outcome is being replayed: take in the time and a cancel held since its plan."""
        run = self.run
        (elapsed, why), run.at.frozen, run.at.held = run.at.held, False, (None, None)
        if elapsed is not None:
            self.tell_time(elapsed)
        if why is not None:
            self.cancel(why)

    def hook_failed(self, error: BaseException) -> None:
        """A strict hook raised: the first such error is kept, and the next transition stops on ``hook_error``."""
        run = self.run
        if run.faults.hook_error is None:
            run.faults.hook_error = error

    def children_cut(self, cut: Mapping[str, tuple[ChildOutcome, ChildOutcome, HandDown]]) -> None:
        """Sub-agent calls were given up in flight (the deadline, a cancel): count what their runs spent, keep what
        they completed.

        ``cut`` maps a call id to what its child's run had spent, the part of
        that not counted yet (``ledger.count_cut_child``) and, without a store,
        the outcomes it completed (``hand_down``).  A call whose outcome the
        run holds, or that is no longer pending, was not cut: its outcome is
        recorded, and counts its child, as any other.
        """
        run = self.run
        pending = {call.id: call for call in run.calls.pending}
        for call_id, (whole, uncounted, done) in cut.items():
            call = pending.get(call_id)
            if call is not None and call_id not in run.calls.ran:
                count_cut_child(run, call_id, whole, uncounted)
                self.hand_down(call, done)

    def cuts_recorded(self, shares: Iterable[tuple[str, ChildOutcome]]) -> None:
        """A recorded run's cuts counted these shares of its sub-agent calls here: counted again (a replay, a rebuild).

        Why: a run taken again from a recording reads no child in flight at
        its cuts, yet its guards must see what the recorded run's saw.
        """
        for call_id, share in shares:
            count_cut_share(self.run, call_id, share)

    def forked_here(self) -> None:
        """The run is made a fork here (or, taken again from a fork's recording, is where the fork was made): what
        cuts counted of calls still unanswered is taken back.

        Each such call's outcome, taken past the fork point, brings it (``ledger.uncount_cuts``).
        """
        uncount_cuts(self.run)

    def hand_down(self, call: ToolCall, done: HandDown) -> None:
        """Sub-agent call ``call``, still pending, was cut with this run: keep its child's ``done`` outcomes.

        Why: without a store nothing else keeps what the cut child did; the
        new child run of the call made again takes them (``child_runs``), so
        no tool call it completed runs twice.  Kept in ``Calls.carried_down``,
        part of the snapshot, beside a fork's; those the cut counted are
        marked (``Calls.prepaid``), so the run that takes them leaves them out
        of its spend, and takes the others as a fork's, counting them.
        """
        run = self.run
        if done.entries and call.id not in run.calls.ran and any(w.id == call.id for w in run.calls.pending):
            run.calls.carried_down.append((call.name, down_key(call), list(done.entries)))
            run.calls.prepaid |= done.counted & origins(done.entries)

    def handed_down(self, call: ToolCall) -> HandDown | None:
        """What the new sub-agent run ``call`` starts takes (``carried_down``): a cut child's outcomes, or a fork's."""
        handed = take_carried_down(self.run, call) if self.run.calls.carried_down else None
        if handed is not None:
            self._took.add(call.id)
        return handed

    def alike(self, call: ToolCall) -> list[ToolCall]:
        """The other pending calls of ``call``'s tool and arguments, begun nowhere here, while one is handed down.

        Why: one of them may have begun before (this run resumed): its run,
        stored, took what was handed down for it then, and this run's stored
        snapshot may still hold it (a Ctrl-C cut that run before this one's
        next write).  The driver looks each up in the store (``child_runs``),
        and those found are ``taken_back`` before ``call``'s new run takes any.
        """
        run, key = self.run, (call.name, canonical_arguments(call.arguments))
        if not holds_down(run, call):
            return []
        return [
            other
            for other in run.calls.pending
            if other.id != call.id
            and other.id not in self._took
            and (other.name, canonical_arguments(other.arguments)) == key
        ]

    def taken_back(self, calls: Iterable[ToolCall]) -> None:
        """Sub-agent calls whose stored runs began before (taken back, or read back): they take nothing handed down.

        Why: each such run took what was handed down for its call when it
        started (``handed_down``) and holds it in its own store entry; this
        run's stored snapshot may still hold it (a Ctrl-C cut that run before
        this one's next write).  Dropped here, once per call, it goes to no
        other call of the same tool and arguments, a new request whose run
        starts before the call is answered (a parallel batch, or ``alike``);
        and ``answered`` drops nothing more for the call.
        """
        for call in calls:
            if call.id not in self._took:
                self._took.add(call.id)
                if self.run.calls.carried_down:
                    take_carried_down(self.run, call)

    def carry_in(self, handed: HandDown) -> None:
        """Before a sub-agent run starts: the outcomes handed down to it, taken instead of its calls (``_carry``).

        Those of its own sub-agent calls' runs it carries down in turn (``below``).
        ``handed.counted``: those a cut counted already (``prepaid``), so what
        this run reports as spent leaves them out; the others it counts.
        """
        self.run.calls.carried, self.run.calls.carried_down = split_down(handed.entries)
        self.run.calls.prepaid = set(handed.counted & origins(handed.entries))

    @property
    def prepaid(self) -> Set[str]:
        """Which outcomes handed to this sub-agent run (taken, or handed on) a cut counted already, by origin.

        Why: a cut counts every tool call its child's run completed in the
        parent's ``tool_calls`` (``drivers.cut_spend``); the new run of the
        call made again takes them instead of calling its tools, and counts
        each in its own counters, so the spend it reports leaves them out and
        its own sub-agent runs, taking those handed on, do the same.  What the
        cut child was handed and never took no cut counted, unless an earlier
        one did: it counts where it is taken.
        """
        return self.run.calls.prepaid

    def answered(self, call: ToolCall) -> None:
        """``call`` has its outcome: what was handed down for it and no child of it took is dropped.

        Why: a call refused (a budget leaves it nothing), rejected or never
        run starts no child, and what a cut child of it completed must not
        be taken by another call of the same tool and arguments, a new
        request; nor linger in later snapshots and forks.  The cut's own
        snapshot keeps it (docs/how-to/sub-agents.md).
        """
        if call.id in self._took:
            self._took.discard(call.id)
        elif self.run.calls.carried_down:
            take_carried_down(self.run, call)

    def resume(self, retry: bool, before: Limits | None = None) -> Transition | None:
        """Take the ``resume`` edge out of ``Failed`` if the run's limits now lift its stop; None if they do not.

        ``retry`` lets a ``model_error`` run call the model again.  On the
        edge, the stop's facts are cleared, and a reply whose calls never ran
        has them answered, so the next model call sees every call answered.
        A finalize call made again (a row that ``keeps_finalize``) keeps the
        stop it answers for: that stop still stands.
        ``before`` (the limits the run stopped under, which the resume may have
        lifted) is kept with the edge's index, so a fork can rebuild the run past it.
        """
        run = self.run
        if run.at.state is not Failed:
            return None
        run.at.retry_model = retry
        row = first_row(run, RESUME)
        if row is None:
            return None
        entry = self.walker.take(run, row)
        if entry.dest == AwaitModel:
            answer_unexecuted(run, "the reply that asked for this call was not usable")
        if row.asks_again:  # the retry a cut forbade: the answer goes back as the edge into AwaitModel sends it
            send_back(run, self.output)
        run.at.reason, run.at.evidence, run.at.final = None, {}, ""
        if not row.keeps_finalize:
            run.at.finalizing = None
        run.faults.model_exception = run.faults.condition_error = None
        run.at.unfinished = None
        if before is not None:
            run.at.earlier_limits = (*run.at.earlier_limits, (len(run.at.trace) - 1, before))
        return entry
