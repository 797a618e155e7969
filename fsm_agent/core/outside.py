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

import json
from collections.abc import Iterable, Mapping
from typing import TypeVar

import attrs

from fsm_agent.core.ledger import answer_unexecuted, canonical_arguments, count_child, down_parts, take_carried_down
from fsm_agent.core.walker import Walker
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import AwaitModel, Failed
from fsm_agent.definition.triggers import INTERRUPTED, RESUME
from fsm_agent.records import ChildOutcome, ToolCall, Transition
from fsm_agent.tools import ToolResult

R = TypeVar("R")
Carried = tuple[str, str, ToolResult]
"""A completed tool call's outcome kept for another run: (tool name, arguments as canonical JSON, result).

One a sub-agent of that run's sub-agent completed (a level further down)
has as arguments the JSON array text ``[arguments of the sub-agent call,
tool name, arguments]`` (``below``): arguments are always a JSON object,
so no call of the run itself ever matches it.
"""


def below(run: Run) -> list[Carried]:
    """What ``run`` carries down for its own sub-agent calls, as outcomes its parent keeps one level further down.

    Why: the parent hands them to the new run of its call made again, which
    hands them on to the new run of its sub-agent call (``split_down``), so
    what a grandchild completed runs no more than what a child completed.
    """
    return [
        entry
        for name, arguments, outcomes in run.calls.carried_down
        for entry in one_down(name, down_parts(arguments)[1], outcomes)  # the calls made again there get new ids
    ]


def one_down(name: str, arguments: str, outcomes: Iterable[tuple[str, str, R]]) -> list[tuple[str, str, R]]:
    """The ``outcomes`` of the run of sub-agent call ``name`` (canonical ``arguments``), one level further down.

    Why one encoder: ``below`` (a cut run's, as results) and a fork's
    (``drivers.fork``, as the recording's results) write the same text,
    which ``split_down`` reads back at the next level.
    """
    return [
        (name, json.dumps([arguments, tool, kept], ensure_ascii=False, separators=(",", ":")), result)
        for tool, kept, result in outcomes
    ]


def below_problem(arguments: str) -> str | None:
    """Why a handed outcome's arguments text, one a level down (``below``), is not as ``below`` writes it; or None."""
    while arguments.startswith("["):
        try:
            path = json.loads(arguments)
        except ValueError:
            path = None
        if not (isinstance(path, list) and len(path) == 3 and all(isinstance(part, str) for part in path)):
            return f"{arguments!r:.80} is not [arguments of the sub-agent call, tool name, arguments]"
        if (problem := down_problem(path[0])) is not None:
            return problem
        arguments = path[2]
    return None


def down_key(call: ToolCall) -> str:
    """The arguments text an entry handed down for sub-agent call ``call`` is kept under: ``[call id, arguments]``.

    Why the id: a resume from the same snapshot keeps the call ids, so each
    call takes what its own cut child completed (``take_carried_down``); the
    arguments (canonical JSON) match a call made again under another id.
    """
    return json.dumps([call.id, canonical_arguments(call.arguments)], ensure_ascii=False, separators=(",", ":"))


def down_problem(text: str) -> str | None:
    """Why a handed-down entry's arguments text is neither canonical arguments nor ``[call id, arguments]``; or None."""
    if not text.startswith("["):
        return None
    try:
        parts = json.loads(text)
    except ValueError:
        parts = None
    if isinstance(parts, list) and len(parts) == 2 and all(isinstance(part, str) for part in parts):
        return None
    return f"{text!r:.80} is not [call id, arguments]"


def count_cut_child(run: Run, call_id: str, spent: ChildOutcome, uncounted: ChildOutcome) -> None:
    """A sub-agent call was given up in flight: keep what its run had ``spent``, and count the ``uncounted`` part.

    Why: the child's model calls were made and billed whether or not the
    parent waits for its answer, so a stopped parent's usage must hold them.
    ``spent`` is kept by call id (``Calls.cut_children``, part of the
    snapshot): if the call is made again and its child's stored run taken
    back, that run's outcome brings only what it spent beyond what was
    counted here (``drivers.child_spend``), so nothing is counted twice.
    ``uncounted`` is ``spent`` less what an earlier cut of the same call
    counted already: a cut child that made no model call adds none.  Its
    tool calls count here too, whatever the call's outcome will be (a budget
    may refuse it, a person reject it): the loaded snapshot's check reads
    them from ``cut_children`` (``core.consistency``).
    """
    run.calls.cut_children[call_id] = spent
    count_child(run, uncounted)


def split_down(outcomes: list[Carried]) -> tuple[list[Carried], list[tuple[str, str, list[Carried]]]]:
    """A new sub-agent run's handed outcomes: its own calls', and its sub-agent calls' carried down (``below``)."""
    own: list[Carried] = []
    down: dict[tuple[str, str], list[Carried]] = {}
    for name, arguments, result in outcomes:
        if arguments.startswith("["):
            call_arguments, tool, kept = json.loads(arguments)
            down.setdefault((name, call_arguments), []).append((tool, kept, result))
        else:
            own.append((name, arguments, result))
    return own, [(name, arguments, kept) for (name, arguments), kept in down.items()]


@attrs.frozen
class CutWithRun(ToolResult):
    """No outcome: a sub-agent call whose child the cancel token it shares with this run stopped, cut with the run.

    Why: the cancel is the run's stop, not the child's answer (``child_runs``).
    The call stays pending, counted as a cut (``spent``; ``child``: the part
    not counted yet), and the run stops ``cancelled``; a resume makes it again.
    ``done``: the tool calls the child's run completed, when no store keeps
    that run: the new child run of the call made again takes their outcomes
    instead of calling its tools again (``Calls.carried_down``).
    """

    spent: ChildOutcome | None = None
    done: tuple[Carried, ...] = ()


class OutsideEvents:
    """The stepper's half that takes in what the driver observed; each method is one event."""

    __slots__ = ()
    run: Run
    walker: Walker
    _left: dict[str, tuple[ToolCall, tuple[Carried, ...]]]
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

    def children_cut(self, spent: Mapping[str, tuple[ChildOutcome, ChildOutcome]]) -> None:
        """Sub-agent calls were given up in flight (the deadline, a cancel): count what their runs spent.

        ``spent`` maps a call id to what its child's run had spent and the
        part of that not counted yet (``ledger.count_cut_child``).  A call
        whose outcome the run holds, or that is no longer pending, was not
        cut: its outcome is recorded, and counts its child, as any other.
        """
        run = self.run
        pending = {call.id for call in run.calls.pending}
        for call_id, (whole, uncounted) in spent.items():
            if call_id in pending and call_id not in run.calls.ran:
                count_cut_child(run, call_id, whole, uncounted)

    def hand_down(self, call: ToolCall, done: tuple[Carried, ...]) -> None:
        """Sub-agent call ``call``, still pending, was cut with this run's cancel: keep its child's ``done`` outcomes.

        Why: without a store nothing else keeps what the cut child did; the
        new child run of the call made again takes them (``child_runs``), so
        no tool call it completed runs twice.  Kept in ``Calls.carried_down``,
        part of the snapshot, beside a fork's.
        """
        run = self.run
        if done and call.id not in run.calls.ran and any(waiting.id == call.id for waiting in run.calls.pending):
            run.calls.carried_down.append((call.name, down_key(call), list(done)))

    def handed_down(self, call: ToolCall) -> list[Carried] | None:
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
        if not any((name, down_parts(arguments)[1]) == key for name, arguments, _ in run.calls.carried_down):
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

    def carry_in(self, outcomes: list[Carried], prepaid: bool = False) -> None:
        """Before a sub-agent run starts: the outcomes handed down to it, taken instead of its calls (``_carry``).

        Those of its own sub-agent calls' runs it carries down in turn (``below``).
        ``prepaid``: a cut of the call counted them already in its parent's
        (``prepaid``), so what this run reports as spent leaves them out.
        """
        self.run.calls.carried, self.run.calls.carried_down = split_down(outcomes)
        self.run.calls.prepaid = prepaid

    @property
    def prepaid(self) -> bool:
        """Whether what this sub-agent run was handed down (and hands on) a cut of its call counted already.

        Why: a cut counts every tool call its child's run completed in the
        parent's ``tool_calls`` (``drivers.child_spend``); the new run of the
        call made again takes them instead of calling its tools, and counts
        each in its own counters, so the spend it reports leaves them out and
        its own sub-agent runs, taking those handed on, do the same.
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

    def child_left(self, call: ToolCall, done: tuple[Carried, ...]) -> None:
        """Sub-agent call ``call`` was cut in flight by its task's cancel (async): its child's ``done`` outcomes.

        Held (not run state) until the run stops: a cancel of its task keeps
        them (``hand_down``, from ``interrupt``); its deadline, which cuts the
        task the same way, does not, as the sync driver's deadline keeps none.
        """
        self._left[call.id] = (call, done)

    def _settle_left(self, trigger: str) -> None:
        """The run stops on ``trigger``: the cut children's outcomes held by ``child_left`` are kept on a cancel."""
        left = dict(self._left)
        self._left.clear()
        if trigger == INTERRUPTED:
            for call, done in left.values():
                self.hand_down(call, done)

    def resume(self, retry: bool, before: Limits | None = None) -> Transition | None:
        """Take the ``resume`` edge out of ``Failed`` if the run's limits now lift its stop; None if they do not.

        ``retry`` lets a ``model_error`` run call the model again.  On the
        edge, the stop's facts are cleared, and a reply whose calls never ran
        has them answered, so the next model call sees every call answered.
        ``before`` (the limits the run stopped under, which the resume may have
        lifted) is kept with the edge's index, so a fork can rebuild the run past it.
        """
        run = self.run
        if run.at.state is not Failed:
            return None
        run.at.retry_model = retry
        entry = self.walker.try_fire(run, RESUME)
        if entry is None:
            return None
        if entry.dest == AwaitModel:
            answer_unexecuted(run, "the reply that asked for this call was not usable")
        run.at.reason, run.at.evidence, run.at.final, run.at.finalizing = None, {}, "", None
        run.faults.model_exception = run.faults.condition_error = None
        run.at.unfinished = None
        if before is not None:
            run.at.earlier_limits = (*run.at.earlier_limits, (len(run.at.trace) - 1, before))
        return entry
