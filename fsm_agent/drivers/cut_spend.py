"""What a sub-agent's run spent, and what a cut of its call in flight counted of it: each part counted once.

A parent that gives a sub-agent call up in flight (its deadline, a cancel)
still counts what the child's run spent until then: the child's model calls
were made and billed.  Each call in flight is registered on the parent
(``fly``) with a way to read its child's spend, which the parent's driver
reads at the cut (``RunBase._interrupt``), and the parent keeps that spend
by call id (``Calls.cut_children``, part of its snapshot).

The call made again later (the parent resumed, here or in another process)
may take the child's stored run back, read back as it finished or continued
from its last checkpoint.  Its outcome then brings only what it spent beyond
what the parent counted: the part both counts share is what the parent
counted at the cut as far as the stored run holds it (``shared``).  Both
figures are points on the same run's spend, which only grows, so the shared
part is each count's smaller value: a stored run that lags behind the cut
(it had not written its last reply) makes that reply again, and it is
counted again, as it was made again.  A call whose child starts afresh
(no store, or none found) shares nothing with the cut.

Without a store, a call cut with its parent (a cancel, the deadline) hands
the parent what its child's run completed (``completed_by``): the new child
run of the call made again takes those outcomes instead of calling its tools
again.  Their sub-agents' spend the cut counted already, so they bring none
of it again.
What of its limits the call made again may spend is ``drivers.child_spend``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core.exchanges import ToolExchange
from fsm_agent.core.hand_down import Carried, HandDown, below, canonical_arguments, one_down, origins
from fsm_agent.core.ledger import plus
from fsm_agent.core.snapshot_fields import ended_on
from fsm_agent.records import ChildOutcome, RunResult, ToolCall

if TYPE_CHECKING:
    from fsm_agent.drivers.base import RunBase


def spent_by(run: RunBase) -> ChildOutcome:
    """What ``run`` spent so far: its own counts (``unrecorded``), and what its sub-agent calls in flight spent.

    A call in flight counts while the run has it pending: once recorded,
    its outcome is in the counts.  The counts are read first, and a run
    drops a call from its pending ones before recording it and takes its
    calls in flight off before a cut counts them (``RunBase._interrupt``),
    so a read racing either from another thread (the sync driver's
    deadline) sees a child's spend once at most.
    """
    position = run.position
    counts = position.counts
    usage = counts.usage()
    spent = ChildOutcome(
        run.run_id,
        usage.input_tokens,
        usage.output_tokens,
        None,
        counts.tool_calls,
        usage.cost,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        usage.reasoning_tokens,
        counts.priced,
        counts.unpriced,
    )
    spent = plus(spent, unrecorded(run))
    flying = run._flying  # noqa: SLF001 - the run's calls in flight, as its own cut reads them
    if flying:
        pending = {call.id for call in tuple(position.calls.pending)}
        for call_id, in_flight in flying.items():
            if call_id in pending:
                spent = plus(spent, in_flight.spent()[1])
    return spent


def unrecorded(run: RunBase) -> ChildOutcome:
    """What ``run``'s counters leave out of what it spent, less what they hold that its parent counted: a change.

    Added: the calls that came back but are not recorded yet (``Calls.ran``:
    each a tool call, a sub-agent's with its spend), so a cut counts them as
    it hands them down.  Taken off: each call whose outcome it took from
    what a cut had counted already (``Stepper.prepaid``, marked one by one),
    so a tool call the cut child completed counts once, not again when the
    call made again takes its outcome; one the cut child was handed and never
    took counts here.  Read after the counts: a call recorded meanwhile
    (another thread's cut) is missed, never counted twice.
    """
    position, prepaid = run.position, run.stepper.prepaid
    taken = sum(1 for step in tuple(position.talk.steps) if step.reused_from in prepaid) if prepaid else 0
    spent, tool_calls = ChildOutcome(run.run_id, 0, 0, None, 0, 0.0, 0, 0, 0, 0, 0), -taken
    for outcome in tuple(position.calls.ran.values()):
        if not (prepaid and outcome.reused_from in prepaid):
            tool_calls += 1
            if outcome.child is not None:
                spent = plus(spent, outcome.child)
    return attrs.evolve(spent, tool_calls=spent.tool_calls + tool_calls)


def prepaid_calls(run: RunBase) -> int:
    """How many outcomes ``run`` took (recorded or come back) that a cut of its call counted already (``prepaid``).

    Why: what ``run`` reports as spent leaves them out (``unrecorded``), but
    its own counters hold them, and so does its stored run: a cut keeps them
    in its record of the run (``cut_record``), which a run taken back from
    the store, knowing nothing of the cut, is measured against.
    """
    prepaid = run.stepper.prepaid
    if not prepaid:
        return 0
    position = run.position
    steps = sum(1 for step in tuple(position.talk.steps) if step.reused_from in prepaid)
    return steps + sum(1 for outcome in tuple(position.calls.ran.values()) if outcome.reused_from in prepaid)


def spent_in(run_id: str, result: RunResult, counters: Mapping[str, Any]) -> ChildOutcome:
    """What a finished child's run spent, from its result and its own ``counters`` (a snapshot's ``counters``).

    ``counters`` hold the model calls it priced and could not price, which a
    result does not, and its tool calls: a cut of its own sub-agent call
    counted some after its last step (``tool_calls``: as that step counted
    them where ``counters`` has none, a snapshot from before).
    """
    usage = result.usage
    used = counters.get("tool_calls")
    if not isinstance(used, int) or isinstance(used, bool):
        used = result.steps[-1].counters.get("tool_calls", [0])[0] if result.steps else 0
    return ChildOutcome(
        run_id,
        usage.input_tokens,
        usage.output_tokens,
        None,
        int(used or 0),
        usage.cost,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        usage.reasoning_tokens,
        count_of(counters, "priced"),
        count_of(counters, "unpriced"),
    )


def calls_of(run: RunBase) -> dict[str, int]:
    """The model calls ``run`` priced and could not price, and its tool calls, as its snapshot's ``counters`` say."""
    counts = run.position.counts
    return {"priced": counts.priced, "unpriced": counts.unpriced, "tool_calls": counts.tool_calls}


def count_of(counters: Mapping[str, Any], name: str) -> int:
    """A whole count >= 0 of ``counters`` (0 where a snapshot from before runs were priced has none)."""
    value = counters.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def shared(parent: RunBase, call: ToolCall, start: ChildOutcome, prepaid: int = 0) -> ChildOutcome | None:
    """What the parent counted already of the child run that ``start`` (its spend so far) takes up for ``call``.

    That is what the parent counted when the call was cut, as far as the
    child's run holds it where it starts (or ends, read back): the smaller
    of the two, count by count.  None: nothing; a cut of another run (the
    call's child renamed) shares nothing.  ``prepaid``: the outcomes a run
    taken back took that an earlier cut counted (``prepaid_calls``), which
    ``start`` leaves out and the cut's record holds (``cut_record``): its
    tool calls are compared with them, and counted without them, as the
    run's spend will be.  Compared without them, a run that recorded a call
    after the cut read it (the sync driver's child, on its own thread) was
    taken to hold one call more of the record than it did.
    """
    cut = parent.position.calls.cut_children.get(call.id)
    if cut is None or cut.run_id != start.run_id:
        return None
    return ChildOutcome(
        start.run_id,
        min(cut.input_tokens, start.input_tokens),
        min(cut.output_tokens, start.output_tokens),
        None,
        min(cut.tool_calls, start.tool_calls + prepaid) - prepaid,
        None if cut.cost is None or start.cost is None else min(cut.cost, start.cost),
        min(cut.cache_read_tokens, start.cache_read_tokens),
        min(cut.cache_write_tokens, start.cache_write_tokens),
        min(cut.reasoning_tokens, start.reasoning_tokens),
        min(cut.priced_calls, start.priced_calls),
        min(cut.unpriced_calls, start.unpriced_calls),
    )


def beyond(whole: ChildOutcome, counted: ChildOutcome | None) -> ChildOutcome:
    """``whole`` less what was ``counted`` of it already (its stop kept); ``whole`` itself if nothing was."""
    if counted is None:
        return whole
    cost = whole.cost
    if cost is not None:
        cost = max(round(cost - (counted.cost or 0.0), 12), 0.0)
    return ChildOutcome(
        whole.run_id,
        whole.input_tokens - counted.input_tokens,
        whole.output_tokens - counted.output_tokens,
        whole.stop,
        whole.tool_calls - counted.tool_calls,
        cost,
        whole.cache_read_tokens - counted.cache_read_tokens,
        whole.cache_write_tokens - counted.cache_write_tokens,
        whole.reasoning_tokens - counted.reasoning_tokens,
        whole.priced_calls - counted.priced_calls,
        whole.unpriced_calls - counted.unpriced_calls,
    )


def cut_record(
    spent: ChildOutcome, counted: ChildOutcome | None, prepaid: int = 0
) -> tuple[ChildOutcome, ChildOutcome]:
    """What a cut of a sub-agent call keeps of its child's run, and the part of its ``spent`` not counted yet.

    Its tool calls too: they count in the parent's ``tool_calls`` at the cut,
    whatever the call's outcome (a budget may refuse the call made again, a
    person reject it); a loaded snapshot's check reads the kept cut as their
    evidence (``core.consistency``).  The record holds the run as its own
    counters do: with the ``prepaid`` outcomes it took (``prepaid_calls``),
    which ``spent`` leaves out, as an earlier cut counted them.  Why: the call
    made again may take the child's stored run back, which keeps no word of
    that earlier cut, and brings only what it did beyond this record
    (``shared``): measured against a record without them, it would bring them
    a second time.
    """
    kept = spent if not prepaid else attrs.evolve(spent, tool_calls=spent.tool_calls + prepaid)
    return kept, beyond(spent, counted)


@attrs.frozen
class InFlight:
    """A sub-agent call's child run in flight, as a cut of the parent reads it: what it spent, what it completed.

    Why both from one place: the cut counts what the child spent (``spent``)
    and, without a store, hands down what it completed (``done``), which the
    call made again takes instead of calling those tools again; whatever the
    cut counted of it is marked so.  On the sync driver the child runs on
    its own thread until its own deadline, so without a store each read
    holds the child's run between two consistent points (``RunBase._still``):
    what is handed down must be what was counted.  With a store the spend is
    read as it stands, as before, never waiting for the child's write.
    """

    child: RunBase
    counted: ChildOutcome | None
    hands_down: bool
    """The parent has no store: nothing else keeps the child's run, so the cut keeps what it completed."""

    def spent(self) -> tuple[ChildOutcome, ChildOutcome]:
        """What the child's run spent so far (the cut's record), and the part of it not counted yet."""
        child = self.child
        with child._still() if self.hands_down else nullcontext():  # noqa: SLF001 - the child's own driver holds it
            return cut_record(spent_by(child), self.counted, prepaid_calls(child))

    def done(self) -> HandDown:
        """What the child's run completed so far, handed down, when the parent has no store; else nothing."""
        if not self.hands_down:
            return HandDown()
        with self.child._still():  # noqa: SLF001 - the child's own driver holds it
            return completed_by(self.child)


def fly(parent: RunBase, call: ToolCall, child: RunBase, counted: ChildOutcome | None) -> None:
    """Register ``child``'s run as in flight for ``call`` until the parent holds the call's outcome.

    A cut of the parent reads it (``RunBase._interrupt``).  The calls whose
    outcomes the parent holds, or that it no longer has pending, are dropped
    here.  The parent's table of calls is replaced, never changed in place:
    a cut on another thread (the sync driver's deadline) reads the one it took.
    """
    run = parent.position
    pending = {waiting.id for waiting in tuple(run.calls.pending)}
    ran = run.calls.ran
    flying = parent._flying or {}  # noqa: SLF001 - the parent's driver hands over its own run
    kept = {call_id: other for call_id, other in flying.items() if call_id in pending and call_id not in ran}
    kept[call.id] = InFlight(child, counted, parent._store is None)  # noqa: SLF001
    parent._flying = kept  # noqa: SLF001


CUT_WITH_PARENT = ("cancelled", "timeout")
"""The stops a parent's cut gives a sub-agent run in flight: its cancel and its deadline are the child's."""


def parent_cut(parent: RunBase, call: ToolCall, run_id: str) -> str | None:
    """The parent's last stop (``cancelled``, ``timeout``) if it cut ``call``'s child ``run_id`` in flight, else None.

    Why: a cancel of the parent reaches its children through the token (or
    the task) they share, and its deadline is theirs (``child_limits``): the
    child's ``cancelled`` or ``timeout`` is then the parent's stop, and the
    parent's resume lifts it for both.
    """
    run = parent.position
    cut = run.calls.cut_children.get(call.id)
    if cut is None or cut.run_id != run_id:
        return None
    last_stop = next((entry.reason for entry in reversed(run.at.trace) if entry.dest == "Failed"), None)
    return last_stop if last_stop in CUT_WITH_PARENT else None


def completed_by(child: RunBase) -> HandDown:
    """What a store-less ``child`` cut with its parent hands it, and which of it the cut counted.

    The tool calls ``child``'s run completed (ran, or took), the outcomes it
    was handed and never took, and its sub-agent calls' (``below``; those
    still in flight, which on the sync driver its own cut has not reached
    yet, read through ``InFlight``).  Each
    outcome names where it came from (``reused_from``).  One that is a
    sub-agent's own keeps no spend: the cut of ``child`` counted its tokens,
    dollars, model calls and tool calls (``spent_by``, ``cut_record``).
    Counted: what it completed (an earlier cut's, which it took, included),
    and what it holds untaken that a cut counted (``prepaid``: an earlier
    cut's, or a cut of one of its own sub-agent calls); not what a fork
    handed it and it never took, which counts where it is taken.
    """
    run = child.position
    asked = {call.id: call for message in run.talk.messages for call in message.tool_calls}
    done: list[Carried] = []
    for item in run.talk.io:
        call = asked.get(item.id) if isinstance(item, ToolExchange) else None
        if call is None or call.raw_arguments is not None:  # arguments that were not JSON ran nothing
            continue
        outcome = item.result
        if outcome.reused_from is None:
            outcome = attrs.evolve(outcome, reused_from=f"{child.run_id}/{call.id}")
        if outcome.child is not None:  # recorded or come back: counted in the run's spend (``unrecorded``)
            spend = ChildOutcome(outcome.child.run_id, 0, 0, outcome.child.stop, 0, 0.0, 0, 0, 0, 0, 0)
            outcome = attrs.evolve(outcome, child=spend)
        done.append((call.name, canonical_arguments(call.arguments), outcome))
    held = [*run.calls.carried, *below(run)]
    counted = origins(done) | (origins(held) & child.stepper.prepaid)
    flying = child._flying  # noqa: SLF001 - its sub-agent calls in flight: on the sync driver, not cut yet
    if flying:
        calls = {call.id: call for call in tuple(run.calls.pending)}
        for call_id, below_it in flying.items():
            call = calls.get(call_id)
            if call is not None and call_id not in run.calls.ran:
                handed = below_it.done()  # counted by the cut with this child's spend (``spent_by``)
                held += one_down(call.name, canonical_arguments(call.arguments), handed.entries)
                counted |= handed.counted
    return HandDown((*done, *held), frozenset(counted))


def cut_with_parent(parent: RunBase, result: RunResult) -> bool:
    """Whether the child's run stopped with the parent: ``cancelled`` by the token they share (cancelled now), or
    ``timeout`` with the parent's time up too.

    Why the deadline: the child's deadline is the parent's
    (``child_limits``), and on the sync driver its thread may stop it there
    a moment before the parent's own cut; its ``timeout`` is the parent's
    stop then, as a cut of the parent in flight (``InFlight``) would make it:
    the call made again goes on with the child (its stored run taken back,
    or without a store a new one given what this one completed).
    """
    cut = ended_on(result.snapshot)  # a child whose finalize answered its timeout ended Done, of itself
    if cut == "timeout":
        return parent._out_of_time()  # noqa: SLF001 - the parent's driver hands over its own run
    token = parent._cancel  # noqa: SLF001
    return cut == "cancelled" and token is not None and token.cancelled
