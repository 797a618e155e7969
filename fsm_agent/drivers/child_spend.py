"""What a sub-agent's run spent, as its parent counts it: so far, at a cut, and once the call is made again.

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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fsm_agent.records import ChildOutcome, RunResult, ToolCall

if TYPE_CHECKING:
    from fsm_agent.drivers.base import RunBase


def spent_by(run: RunBase) -> ChildOutcome:
    """What ``run`` spent so far: its own counts, and what its sub-agent calls in flight spent beyond them.

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
    )
    flying = run._flying  # noqa: SLF001 - the run's calls in flight, as its own cut reads them
    if flying:
        pending = {call.id for call in tuple(position.calls.pending)}
        for call_id, read in flying.items():
            if call_id in pending:
                spent = plus(spent, read()[1])
    return spent


def spent_in(run_id: str, result: RunResult) -> ChildOutcome:
    """What a finished child's run spent, from its result (``tool_calls``: as its last step counted them)."""
    usage = result.usage
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
    )


def shared(parent: RunBase, call: ToolCall, run_id: str, begun: RunBase | RunResult) -> ChildOutcome | None:
    """What the parent counted already of the child run ``begun`` takes up for ``call``; None: nothing.

    That is what the parent counted when the call was cut, as far as the
    child's run holds it where ``begun`` starts (or ends, read back): the
    smaller of the two, count by count.  A cut of another run (the call's
    child renamed) shares nothing.
    """
    cut = parent.position.calls.cut_children.get(call.id)
    if cut is None or cut.run_id != run_id:
        return None
    start = spent_in(run_id, begun) if isinstance(begun, RunResult) else spent_by(begun)
    return ChildOutcome(
        run_id,
        min(cut.input_tokens, start.input_tokens),
        min(cut.output_tokens, start.output_tokens),
        None,
        min(cut.tool_calls, start.tool_calls),
        None if cut.cost is None or start.cost is None else min(cut.cost, start.cost),
        min(cut.cache_read_tokens, start.cache_read_tokens),
        min(cut.cache_write_tokens, start.cache_write_tokens),
        min(cut.reasoning_tokens, start.reasoning_tokens),
    )


def lent_back(parent: RunBase, call: ToolCall, run_id: str, data: Mapping[str, Any] | None) -> tuple[int, int]:
    """The tokens and tool calls of the stored child run ``data`` that the parent counted already at a cut of ``call``.

    Why: the child taking its stored run up gets its share of what the
    parent has left as its limits, and counts against them from its stored
    counts on; the part both count (``shared``, as far as ``data`` holds it)
    would be held against the parent's limits twice, so it is added back.
    """
    cut = parent.position.calls.cut_children.get(call.id)
    if cut is None or cut.run_id != run_id or data is None:
        return 0, 0
    counters = data.get("counters")
    if not isinstance(counters, Mapping):
        return 0, 0

    def stored(name: str) -> int:
        value = counters.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    tokens = min(cut.input_tokens, stored("input_tokens")) + min(cut.output_tokens, stored("output_tokens"))
    return tokens, min(cut.tool_calls, stored("tool_calls"))


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
    )


def plus(one: ChildOutcome, other: ChildOutcome) -> ChildOutcome:
    """Two spends added up, under ``one``'s run id (a cost unknown in either is unknown)."""
    cost = None if one.cost is None or other.cost is None else round(one.cost + other.cost, 12)
    return ChildOutcome(
        one.run_id,
        one.input_tokens + other.input_tokens,
        one.output_tokens + other.output_tokens,
        None,
        one.tool_calls + other.tool_calls,
        cost,
        one.cache_read_tokens + other.cache_read_tokens,
        one.cache_write_tokens + other.cache_write_tokens,
        one.reasoning_tokens + other.reasoning_tokens,
    )


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
    kept = {call_id: read for call_id, read in flying.items() if call_id in pending and call_id not in ran}

    def read() -> tuple[ChildOutcome, ChildOutcome]:
        spent = spent_by(child)
        return spent, beyond(spent, counted)

    kept[call.id] = read
    parent._flying = kept  # noqa: SLF001
