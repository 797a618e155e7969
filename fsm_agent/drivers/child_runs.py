"""A sub-agent call's run: found in the store by its link and read back or taken over, or started, and carried out.

The child's run id is ``<parent run id>/<call id>``; with a store the child is
stored there, linked to its parent (``parent_run_id``, ``parent_call_id``, the
digest of its input), so resuming a parent after a crash finds the child: a
finished one is read back, never run again, and an unfinished one goes on
from its own last checkpoint (waiting out a dead owner's lease), as does one
that stopped with its parent (the parent's cancel or deadline cut it).  The
parent's remaining deadline, and what it has left of its token and cost
budgets shared among the sub-agent calls of its turn (``child_spend.shares``),
become the child's limits; its deps, unless the tool has its own, become the
child's deps (never stored: a child taken over is given them again).  A call
the parent gives up in flight (its deadline, a cancel) leaves what the child
spent until then counted by the parent; made again, it brings only what the
child's run spends beyond that (``drivers.cut_spend``).  A stored child run
taken back took, when it started, what a fork handed down for its call:
whatever the parent's stored snapshot still holds of it goes to no other call.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core import child_ids
from fsm_agent.core.hand_down import HandDown
from fsm_agent.core.ledger import plus
from fsm_agent.core.outside import CutWithRun
from fsm_agent.core.snapshot_fields import ended_on
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.triggers import EXPIRED, INTERRUPTED
from fsm_agent.drivers.child import PARAMETERS, ChildTool, answer_of
from fsm_agent.drivers.child_limits import budget_used_up, limits_for, not_run, time_used
from fsm_agent.drivers.child_spend import shares, with_lent_back
from fsm_agent.drivers.child_stored import ReadBack, ataken_over, deps_of, is_finished, taken_over
from fsm_agent.drivers.cut_spend import (
    beyond,
    calls_of,
    completed_by,
    cut_record,
    cut_with_parent,
    fly,
    parent_cut,
    prepaid_calls,
    shared,
    spent_by,
    spent_in,
    unrecorded,
)
from fsm_agent.drivers.stored import astored, stored
from fsm_agent.errors import AgentLoopError
from fsm_agent.observe.events import logger
from fsm_agent.records import ChildOutcome, RunResult, ToolCall
from fsm_agent.tools.registry import ToolResult
from fsm_agent.tools.schema import arguments_error

if TYPE_CHECKING:
    from fsm_agent.drivers.agent_run import AgentRun
    from fsm_agent.drivers.base import RunBase


def _bad_input(call: ToolCall) -> ToolResult | None:
    problem = arguments_error(call.arguments, PARAMETERS) if call.raw_arguments is None else "not valid JSON"
    if problem is None:
        return None
    message = f"bad arguments for tool {call.name!r}: {problem}"
    return ToolResult(json.dumps({"error": message}, ensure_ascii=False), message)


def _outcome(child: ChildTool, result: RunResult, spent: ChildOutcome, counted: ChildOutcome | None) -> ToolResult:
    """The call's outcome from its child's result; it brings the parent what the child ``spent`` beyond ``counted``.

    ``counted`` is what the parent counted already of this child's run, at
    a cut of this call (``cut_spend.shared``): the call made again brings
    only the rest, so no token, dollar or model call is counted twice.
    """
    run_id = spent.run_id
    if result.ok:
        content = _answer_json(result)
        return ToolResult(content, child=beyond(spent, counted))
    facts: dict[str, Any] = {"reason": result.reason, "evidence": result.evidence}
    # What the child ended with (a finalize call's answer, a reply cut at max_tokens): the parent paid for it.
    # A typed child's finalize answer that passed its check is its output, as a finished child's is.
    if result.output is not None:
        facts["output"] = json.loads(_answer_json(result))
    elif result.final:
        facts["final"] = result.final
    message = f"sub-agent {child.name!r} stopped ({result.reason}) in run {run_id!r}"
    content = json.dumps({"error": message, **facts}, ensure_ascii=False, default=str)
    stop = facts if child.on_child_stop == "raise" else None
    return ToolResult(content, message, child=beyond(attrs.evolve(spent, stop=stop), counted))


def _answer_json(result: RunResult) -> str:
    """The child's answer as JSON text; one no JSON can hold (a validator's odd value, a NaN) is its final text."""
    try:
        return json.dumps(answer_of(result), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(result.final, ensure_ascii=False)


def _begin(parent: RunBase, child: ChildTool, call: ToolCall) -> tuple[str, AgentRun | ReadBack | ToolResult, bool]:
    """The child's run and whether it is new (its store entry still to be written), or its result if it finished.

    A finished child is read back, never run again; one under way goes on
    from its own last checkpoint; otherwise a new one starts, unless the
    parent's token or cost budget leaves it nothing (then the call's outcome says so).
    ``_abegin`` is the same, awaited.
    """
    store, ids = parent._store, _ids(parent, call)  # noqa: SLF001 - the parent's driver hands over its run
    run_id, data = ids[0], None
    if store is not None:
        for run_id in ids:
            data = stored(store, run_id)
            if data is None or _answers(parent, call, data):
                break
            _passed_over(run_id, data)
        else:
            run_id, data = _fresh(run_id), None
    # Its run, or a run of another call of the same arguments, began before and took what was handed down then.
    alike = parent.stepper.alike(call) if data is None and store is not None else []
    found = [(other, stored(store, _ids(parent, other)[0])) for other in alike]
    parent.stepper.taken_back([call] if data is not None else [c for c, held in found if _ours(parent, c, held)])
    share, again = shares(parent), parent_cut(parent, call, run_id)
    used_up = budget_used_up(share)
    if used_up is not None and not is_finished(data, again):
        return run_id, not_run(child, run_id, parent, used_up), False
    limits = limits_for(parent, child.agent.limits, with_lent_back(parent, call, run_id, data, share), time_used(data))
    if data is None:
        return run_id, _new_run(parent, child, call, run_id, limits), True
    return run_id, taken_over(child, store, run_id, data, parent, limits, again), False


async def _abegin(
    parent: RunBase, child: ChildTool, call: ToolCall
) -> tuple[str, AgentRun | ReadBack | ToolResult, bool]:
    """``_begin``, awaited: the store is read (and the child claimed) through its async methods."""
    store, ids = parent._store, _ids(parent, call)  # noqa: SLF001 - the parent's driver hands over its run
    run_id, data = ids[0], None
    if store is not None:
        for run_id in ids:
            data = await astored(store, run_id)
            if data is None or _answers(parent, call, data):
                break
            _passed_over(run_id, data)
        else:
            run_id, data = _fresh(run_id), None
    # Its run, or a run of another call of the same arguments, began before and took what was handed down then.
    alike = parent.stepper.alike(call) if data is None and store is not None else []
    found = [(other, await astored(store, _ids(parent, other)[0])) for other in alike]
    parent.stepper.taken_back([call] if data is not None else [c for c, held in found if _ours(parent, c, held)])
    share, again = shares(parent), parent_cut(parent, call, run_id)
    used_up = budget_used_up(share)
    if used_up is not None and not is_finished(data, again):
        return run_id, not_run(child, run_id, parent, used_up), False
    limits = limits_for(parent, child.agent.limits, with_lent_back(parent, call, run_id, data, share), time_used(data))
    if data is None:
        return run_id, _new_run(parent, child, call, run_id, limits), True
    return run_id, await ataken_over(child, store, run_id, data, parent, limits, again), False


def _ids(parent: RunBase, call: ToolCall) -> tuple[str, ...]:
    """The ids the call's child may be stored under (``core.child_ids``): its own first."""
    return child_ids.child_ids(parent.run_id, parent.start_id, call.id, call.arguments["input"])


def _answers(parent: RunBase, call: ToolCall, data: dict[str, Any]) -> bool:
    """Whether the stored run ``data`` is the child of ``call`` in this start of the parent (``core.child_ids``).

    A parent started again over its old id (``overwrite=True``, a fork
    under the id of a deleted run) is a new run, and takes no answer its
    old run's child gave, though the call and its input be the same.
    """
    return child_ids.is_child(data, parent.run_id, parent.start_id, call.id, call.arguments["input"])


def _ours(parent: RunBase, call: ToolCall, data: dict[str, Any] | None) -> bool:
    """Whether ``data``, stored under call ``call``'s child's own id, is that call's run (not another run's child's).

    Only its own id is looked at: a call whose child was renamed is one no store holds by hand.
    """
    return data is not None and _answers(parent, call, data)


def _passed_over(run_id: str, data: dict[str, Any]) -> None:
    """Say that the run stored at ``run_id`` answers another call, or the call in another start of its parent."""
    logger().warning(
        "fsm_agent: stored run %r answers another call (%s) or another start of its parent: not taken",
        run_id,
        data.get(child_ids.LINK[0]),
    )


def _fresh(run_id: str) -> str:
    """An id for a child every id of whose call holds another run: only a store someone wrote by hand (or a
    parent from before start ids started again twice over its id) leaves none."""
    return f"{run_id}-{uuid.uuid4().hex[:8]}"


def _new_run(parent: RunBase, child: ChildTool, call: ToolCall, run_id: str, limits: Limits) -> AgentRun:
    """A new child run under ``limits``, linked to its call; its store entry is written by whoever drives it."""
    text, store, cancel = call.arguments["input"], parent._store, parent._cancel  # noqa: SLF001 - the parent's run
    link, start = child_ids.link(parent.run_id, call.id, text), child_ids.child_start(parent.start_id, call.id)
    deps = deps_of(parent, child)
    begun = child.agent._begin(  # noqa: SLF001 - a sub-agent's run is begun by its parent's
        text, cancel, (), store, run_id, limits=limits, parent=link, deps=deps, start_id=start
    )
    if parent.position.calls.carried_down:
        # Taken from the parent's run before the child's run holding it is stored: a Ctrl-C meanwhile must not
        # write the parent without it (RunBase._keep_cut), until the child's store entry is written (_opened).
        parent._handing_down += 1  # noqa: SLF001 - the parent's driver hands over its own run
        begun._hands_down = True  # noqa: SLF001
    handed = parent.stepper.handed_down(call)  # a fork making this call again: the child forks with it
    if handed is not None and handed.entries:
        # What of it a cut counted (cut_spend) the child's spend leaves out; the rest (a fork's) it counts.
        begun.stepper.carry_in(handed)
    return begun


def _opened(parent: RunBase, child: RunBase) -> None:
    """The new child's run is stored, with what its parent handed down: a Ctrl-C may write the parent again."""
    if child._hands_down:  # noqa: SLF001 - the parent's driver hands over its own run
        child._hands_down = False  # noqa: SLF001
        parent._handing_down -= 1  # noqa: SLF001


def _owing(parent: RunBase, call: ToolCall) -> tuple[AgentRun, ChildOutcome | None] | None:
    """The child run of ``call`` left by a store write it owes (``_keep_owing``), and what the parent counted of it."""
    owing = parent._owing_children  # noqa: SLF001 - the parent's driver hands over its own run
    return owing.pop(call.id, None) if owing else None


def _keep_owing(parent: RunBase, call: ToolCall, begun: AgentRun, counted: ChildOutcome | None, exc: Exception) -> None:
    """Keep the child run ``begun`` that ``exc`` left owing a store write, for the parent's call made again.

    Why: a child taken over from its store lacks what that write held (a
    call it completed), and would make it again.  Driven on, this run writes
    it first (``Journal.owed``).  So is a child whose own sub-agent's run
    owes a write: driven on, it drives that one on.  A run another owner
    holds now, or one gone from its store, is taken over or started as usual.
    """
    if begun.kept_after(exc):
        parent._owing_children = {**(parent._owing_children or {}), call.id: (begun, counted)}  # noqa: SLF001


def run_child(parent: RunBase, child: ChildTool, call: ToolCall) -> ToolResult:
    """Carry out a parent's call of a sub-agent on the sync driver."""
    bad = _bad_input(call)
    if bad is not None:
        return bad
    owing = _owing(parent, call)
    if owing is not None:
        begun, counted = owing
    else:
        _, found, new = _begin(parent, child, call)
        if isinstance(found, ToolResult):
            return found
        if isinstance(found, ReadBack):
            return _outcome(child, found.result, found.spent, shared(parent, call, found.spent))
        begun, counted = found, shared(parent, call, spent_by(found), prepaid_calls(found))
        if new:
            begun._open_store(new=True)  # noqa: SLF001 - written as Agent.start writes a new run
            _opened(parent, begun)
    fly(parent, call, begun, counted)  # a cut of the parent counts what the child spent until then
    try:
        result = begun.finish()
    except AgentLoopError as stop:
        result = stop.result
    except Exception as exc:
        _keep_owing(parent, call, begun, counted, exc)
        raise
    return _ended(parent, child, call, result, begun, counted)


async def arun_child(parent: RunBase, child: ChildTool, call: ToolCall) -> ToolResult:
    """Carry out a parent's call of a sub-agent on the async driver (a cancel of the parent cancels the child)."""
    bad = _bad_input(call)
    if bad is not None:
        return bad
    owing = _owing(parent, call)
    if owing is not None:
        begun, counted = owing
    else:
        _, found, new = await _abegin(parent, child, call)
        if isinstance(found, ToolResult):
            return found
        if isinstance(found, ReadBack):
            return _outcome(child, found.result, found.spent, shared(parent, call, found.spent))
        begun, counted = found, shared(parent, call, spent_by(found), prepaid_calls(found))
        if new:
            await begun._aopen_store(new=True)  # noqa: SLF001 - written as Agent.arun writes a new run
            _opened(parent, begun)
    fly(parent, call, begun, counted)  # a cut of the parent (the child cancelled with it) counts what it spent
    try:
        result = await begun.afinish()
    except AgentLoopError as stop:
        result = stop.result
    except Exception as exc:
        _keep_owing(parent, call, begun, counted, exc)
        raise
    return _ended(parent, child, call, result, begun, counted)


def _ended(
    parent: RunBase,
    child: ChildTool,
    call: ToolCall,
    result: RunResult,
    begun: RunBase,
    counted: ChildOutcome | None,
) -> ToolResult:
    """The call's outcome from its child's ended run ``begun``; none (``CutWithRun``) if it stopped with the parent.

    Why none: the cancel (or the deadline) is the parent's stop, not the
    child's answer (``cut_with_parent``).  The
    call stays pending, as one the parent's cut found in flight, what the child
    spent is counted once, its tool calls included (``cut_record``), and the
    parent's resume resumes the child: its stored run, or without a store a
    new one given the outcomes this one completed.
    """
    spent = plus(spent_in(begun.run_id, result, calls_of(begun)), unrecorded(begun))
    if not cut_with_parent(parent, result):
        return _outcome(child, result, spent, counted)
    kept, uncounted = cut_record(spent, counted, prepaid_calls(begun))
    done = completed_by(begun) if parent._store is None else HandDown()  # noqa: SLF001 - the parent's driver hands it over
    trigger = INTERRUPTED if ended_on(result.snapshot) == "cancelled" else EXPIRED  # its reason may be the answer's
    return CutWithRun("", child=uncounted, spent=kept, done=done, trigger=trigger)
