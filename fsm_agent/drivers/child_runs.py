"""A sub-agent call's run: found in the store by its link and read back or taken over, or started, and carried out.

The child's run id is ``<parent run id>/<call id>``; with a store the child is
stored there, linked to its parent (``parent_run_id``, ``parent_call_id``, the
digest of its input), so resuming a parent after a crash finds the child: a
finished one is read back, never run again, and an unfinished one goes on
from its own last checkpoint (waiting out a dead owner's lease).  The
parent's remaining deadline and token budget, shared among the sub-agent
calls of its turn, become the child's limits; its deps, unless the tool
has its own, become the child's deps (never stored: a child taken over is
given them again).  A call the parent gives up in flight (its deadline, a
cancel) leaves what the child spent until then counted by the parent; made
again, it brings only what the child's run spends beyond that
(``drivers.child_spend``).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core.batch import unrun
from fsm_agent.definition.limits import Limits
from fsm_agent.drivers.child import FINISHED, PARAMETERS, ChildTool, answer_of
from fsm_agent.drivers.child_spend import beyond, fly, lent_back, shared, spent_in
from fsm_agent.drivers.read_back import stored_result
from fsm_agent.drivers.stored import astored, awaited, stored
from fsm_agent.errors import AgentLoopError, RunLeasedError
from fsm_agent.jsontext import input_digest
from fsm_agent.observe.events import logger
from fsm_agent.records import ChildOutcome, RunResult, ToolCall
from fsm_agent.tools.registry import ToolResult
from fsm_agent.tools.schema import arguments_error

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.drivers.agent_run import AgentRun
    from fsm_agent.drivers.base import RunBase


def _bad_input(call: ToolCall) -> ToolResult | None:
    problem = arguments_error(call.arguments, PARAMETERS) if call.raw_arguments is None else "not valid JSON"
    if problem is None:
        return None
    message = f"bad arguments for tool {call.name!r}: {problem}"
    return ToolResult(json.dumps({"error": message}, ensure_ascii=False), message)


def shares(parent: RunBase) -> tuple[int | None, int | None]:
    """The tokens and tool calls of the parent's limits this sub-agent call may spend (None: no such limit).

    What the parent has not spent (its own calls, and the calls whose
    outcomes it holds but has not recorded yet, a child's with all its
    tokens and tool calls) is shared equally among the turn's sub-agent
    calls still to finish, this one included: children run in parallel draw
    on the parent's limits together, never each on all of them.  Each of
    those calls is one of the parent's tool calls itself, so it is set
    aside first, and so is each ordinary call planned to run beside them
    (the async driver's batch, ``core.batch``) that has not run yet: it
    runs whatever the children make.  A child stops after the model call
    that reaches its token share, so the parent's budget is passed by at
    most one model call per child in flight; its tool-call share it never
    passes.
    """
    run = parent.position
    budget, cap = run.limits.token_budget, run.limits.total_tool_calls
    if budget is None and cap is None:
        return None, None
    children = parent._children  # noqa: SLF001 - the parent's driver hands over its own run
    held = [outcome.child for outcome in run.calls.ran.values() if outcome.child is not None]
    to_finish = sum(1 for call in run.calls.pending if call.name in children and call.id not in run.calls.ran)
    tokens = calls = None
    if budget is not None:
        spent = run.counts.tokens + sum(child.input_tokens + child.output_tokens for child in held)
        tokens = max(budget - spent, 0) // max(to_finish, 1)
    if cap is not None:
        made = run.counts.tool_calls + len(run.calls.ran) + sum(child.tool_calls for child in held)
        cleared = parent.stepper._cleared  # noqa: SLF001 - the batch was planned with the stepper's own rule
        beside = sum(1 for call in unrun(run, cleared) if call.name not in children)
        calls = max(cap - made - to_finish - beside, 0) // max(to_finish, 1)
    return tokens, calls


def _with_lent_back(
    parent: RunBase, call: ToolCall, run_id: str, data: dict[str, Any] | None, tokens: int | None, calls: int | None
) -> tuple[int | None, int | None]:
    """The child's shares of tokens and tool calls, with what its stored run holds that a cut counted already.

    The child counts against its limits from its stored counts on; what a
    cut of this call counted of those is the parent's already, so it is no
    part of what the parent has left (``child_spend.lent_back``).
    """
    lent_tokens, lent_calls = lent_back(parent, call, run_id, data)
    return (
        None if tokens is None else tokens + lent_tokens,
        None if calls is None else calls + lent_calls,
    )


def _limits(parent: RunBase, agent: Agent, tokens: int | None, calls: int | None) -> Limits:
    """The child agent's limits, each cut to what the parent has left (time, and its shares of tokens and calls)."""
    own = agent.limits
    timeout, budget, caps = own.timeout, own.token_budget, own.max_tool_calls
    remaining = parent._remaining()  # noqa: SLF001 - the parent's driver hands over its own run
    if remaining is not None:
        timeout = remaining if timeout is None else min(timeout, remaining)
    if tokens is not None:
        budget = tokens if budget is None else min(budget, tokens)
    if calls is not None:
        if isinstance(caps, dict):
            caps = {**caps, "*": min(caps.get("*", calls), calls)}
        else:
            caps = calls if caps is None else min(caps, calls)
    # A parent already out of time still asks: the child then stops at once, saying so (no tokens: not asked;
    # no tool calls left: it may still answer, and stops at its first call).
    return attrs.evolve(
        own,
        timeout=max(timeout, 1e-9) if timeout is not None else None,
        token_budget=budget,
        max_tool_calls=caps,
    )


def _no_tokens(child: ChildTool, run_id: str, parent: RunBase) -> ToolResult:
    """A sub-agent call the parent's token budget leaves nothing for: a ``token_budget`` stop, never run."""
    run = parent.position
    evidence = {"token_budget": run.limits.token_budget, "tokens": run.counts.tokens, "share": 0}
    facts = {"reason": "token_budget", "evidence": evidence}
    message = f"sub-agent {child.name!r} not run: the parent's token budget is used up (run {run_id!r})"
    content = json.dumps({"error": message, **facts}, ensure_ascii=False)
    stop = facts if child.on_child_stop == "raise" else None
    return ToolResult(content, message, child=ChildOutcome(run_id, 0, 0, stop))


def _outcome(child: ChildTool, run_id: str, result: RunResult, counted: ChildOutcome | None = None) -> ToolResult:
    """The call's outcome from its child's result; it brings the parent what the child spent beyond ``counted``.

    ``counted`` is what the parent counted already of this child's run, at
    a cut of this call (``child_spend.shared``): the call made again brings
    only the rest, so no token is counted twice.
    """
    spent = spent_in(run_id, result)
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


def _begin(parent: RunBase, child: ChildTool, call: ToolCall) -> tuple[str, AgentRun | RunResult | ToolResult, bool]:
    """The child's run and whether it is new (its store entry still to be written), or its result if it finished.

    A finished child is read back, never run again; one under way goes on
    from its own last checkpoint; otherwise a new one starts, unless the
    parent's token budget leaves it nothing (then the call's outcome says so).
    ``_abegin`` is the same, awaited.
    """
    from fsm_agent.persist.journal import link_of  # as every store module, loaded by the first call that needs it

    store, (run_id, link) = parent._store, _named(parent, call)  # noqa: SLF001 - the parent's driver hands over its run
    data = None if store is None else stored(store, run_id)
    if data is not None and link_of(data) != link:
        run_id = _renamed(run_id, link, data)
        data = stored(store, run_id)
        if data is not None and link_of(data) != link:  # only a store someone wrote by hand: a fresh id
            run_id, data = f"{run_id}-{uuid.uuid4().hex[:8]}", None
    tokens, calls = shares(parent)
    if tokens == 0 and not _finished(data):
        return run_id, _no_tokens(child, run_id, parent), False
    limits = _limits(parent, child.agent, *_with_lent_back(parent, call, run_id, data, tokens, calls))
    if data is None:
        return run_id, _new_run(parent, child, call, run_id, link, limits), True
    return run_id, _taken_over(child, store, run_id, data, parent, limits), False


async def _abegin(
    parent: RunBase, child: ChildTool, call: ToolCall
) -> tuple[str, AgentRun | RunResult | ToolResult, bool]:
    """``_begin``, awaited: the store is read (and the child claimed) through its async methods."""
    from fsm_agent.persist.journal import link_of

    store, (run_id, link) = parent._store, _named(parent, call)  # noqa: SLF001 - the parent's driver hands over its run
    data = None if store is None else await astored(store, run_id)
    if data is not None and link_of(data) != link:
        run_id = _renamed(run_id, link, data)
        data = await astored(store, run_id)
        if data is not None and link_of(data) != link:  # only a store someone wrote by hand: a fresh id
            run_id, data = f"{run_id}-{uuid.uuid4().hex[:8]}", None
    tokens, calls = shares(parent)
    if tokens == 0 and not _finished(data):
        return run_id, _no_tokens(child, run_id, parent), False
    limits = _limits(parent, child.agent, *_with_lent_back(parent, call, run_id, data, tokens, calls))
    if data is None:
        return run_id, _new_run(parent, child, call, run_id, link, limits), True
    return run_id, await _ataken_over(child, store, run_id, data, parent, limits), False


def _named(parent: RunBase, call: ToolCall) -> tuple[str, dict[str, str]]:
    """The child's run id, ``<parent run id>/<call id>``, and the ``LINK`` its stored run keeps of the call."""
    link = {
        "parent_run_id": parent.run_id,
        "parent_call_id": call.id,
        "input_digest": input_digest(call.arguments["input"]),
    }
    return f"{parent.run_id}/{call.id}", link


def _renamed(run_id: str, link: dict[str, str], data: dict[str, Any]) -> str:
    """The id for a child whose own id holds another run's child: one its input names.

    Another run's child (a provider reusing call ids across runs, a parent
    started again over its old id) is never taken for this call's answer.
    """
    from fsm_agent.persist.journal import LINK

    renamed = f"{run_id}@{link['input_digest'][:12]}"
    logger.warning("fsm_agent: stored run %r answers another call (%s); running %r", run_id, data.get(LINK[0]), renamed)
    return renamed


def _finished(data: dict[str, Any] | None) -> bool:
    """Whether a stored child (None: none stored) finished, so its result is read back, never run again."""
    return data is not None and data.get("state") in FINISHED and not data.get("paused")


def _new_run(
    parent: RunBase, child: ChildTool, call: ToolCall, run_id: str, link: dict[str, str], limits: Limits
) -> AgentRun:
    """A new child run under ``limits``, linked to its call; its store entry is written by whoever drives it."""
    text, store, cancel = call.arguments["input"], parent._store, parent._cancel  # noqa: SLF001 - the parent's run
    deps = _deps(parent, child)
    begun = child.agent._begin(text, cancel, (), store, run_id, limits=limits, parent=link, deps=deps)  # noqa: SLF001
    if parent.position.calls.carried_down:
        # Taken from the parent's run before the child's run holding it is stored: a Ctrl-C meanwhile must not
        # write the parent without it (RunBase._keep_cut), until the child's store entry is written (_opened).
        parent._handing_down += 1  # noqa: SLF001 - the parent's driver hands over its own run
        begun._hands_down = True  # noqa: SLF001
    handed = parent.stepper.handed_down(call)  # a fork making this call again: the child forks with it
    if handed:
        begun.stepper.carry_in(handed)
    return begun


def _opened(parent: RunBase, child: RunBase) -> None:
    """The new child's run is stored, with what its parent handed down: a Ctrl-C may write the parent again."""
    if child._hands_down:  # noqa: SLF001 - the parent's driver hands over its own run
        child._hands_down = False  # noqa: SLF001
        parent._handing_down -= 1  # noqa: SLF001


def _deps(parent: RunBase, child: ChildTool) -> Any:
    """The child run's deps: the sub-agent tool's own if it was given some, else the parent run's."""
    return child.deps if child.deps is not None else parent._deps  # noqa: SLF001 - the parent's driver hands over its run


def _taken_over(
    child: ChildTool, store: Any, run_id: str, data: dict[str, Any], parent: RunBase, limits: Limits
) -> AgentRun | RunResult:
    """The stored child's result if it finished, else its run resumed here once nobody else holds it.

    A parent resumed after its process died finds its child still leased
    to that process for up to a lease: it waits for the lease to lapse (or
    for a live owner to finish the child, whose result it then takes),
    within two leases; a child some live owner keeps advancing past that
    is a ``RunLeasedError`` naming it.  Nothing of the child runs twice.
    ``_ataken_over`` is the same, awaited.
    """
    from fsm_agent.persist.store import traits

    agent, cancel, deps = child.agent, parent._cancel, _deps(parent, child)  # noqa: SLF001 - the parent's run
    patience = time.time() + 2 * traits(store).lease
    while True:
        if _finished(data):
            return stored_result(agent, data)
        try:
            return agent.resume(
                data, cancel=cancel, store=store, timeout=limits.timeout, token_budget=limits.token_budget, deps=deps
            )
        except RunLeasedError as busy:
            time.sleep(_lease_wait(busy, patience))
        data = dict(store.load(run_id))


async def _ataken_over(
    child: ChildTool, store: Any, run_id: str, data: dict[str, Any], parent: RunBase, limits: Limits
) -> AgentRun | RunResult:
    """``_taken_over``, awaited: the claim, the wait for a lease and the store's reads block no event loop."""
    import asyncio  # as in drivers.aio: import fsm_agent loads no asyncio

    from fsm_agent.persist.store import traits

    agent, cancel, deps = child.agent, parent._cancel, _deps(parent, child)  # noqa: SLF001 - the parent's run
    patience = time.time() + 2 * traits(store).lease
    while True:
        if _finished(data):
            return stored_result(agent, data)
        try:
            return await agent.aresume(
                data, cancel=cancel, store=store, timeout=limits.timeout, token_budget=limits.token_budget, deps=deps
            )
        except RunLeasedError as busy:
            await asyncio.sleep(_lease_wait(busy, patience))
        data = dict(await awaited(store, "load", run_id))


def _lease_wait(busy: RunLeasedError, patience: float) -> float:
    """Seconds to wait for the lease ``busy`` names to lapse; ``busy`` itself if it never will within ``patience``."""
    now = time.time()
    if busy.stale or now >= patience:
        raise busy
    return min(max(busy.until - now, 0.0) + _SLACK, patience - now)


_SLACK = 0.05
"""Seconds waited past a lease's end before taking it over: the clocks of two writers are never quite equal."""


def run_child(parent: RunBase, child: ChildTool, call: ToolCall) -> ToolResult:
    """Carry out a parent's call of a sub-agent on the sync driver."""
    bad = _bad_input(call)
    if bad is not None:
        return bad
    run_id, begun, new = _begin(parent, child, call)
    if isinstance(begun, ToolResult):
        return begun
    counted = shared(parent, call, run_id, begun)
    if isinstance(begun, RunResult):
        return _outcome(child, run_id, begun, counted)
    if new:
        begun._open_store(new=True)  # noqa: SLF001 - written as Agent.start writes a new run
        _opened(parent, begun)
    fly(parent, call, begun, counted)  # a cut of the parent counts what the child spent until then
    try:
        result = begun.finish()
    except AgentLoopError as stop:
        result = stop.result
    return _outcome(child, run_id, result, counted)


async def arun_child(parent: RunBase, child: ChildTool, call: ToolCall) -> ToolResult:
    """Carry out a parent's call of a sub-agent on the async driver (a cancel of the parent cancels the child)."""
    bad = _bad_input(call)
    if bad is not None:
        return bad
    run_id, begun, new = await _abegin(parent, child, call)
    if isinstance(begun, ToolResult):
        return begun
    counted = shared(parent, call, run_id, begun)
    if isinstance(begun, RunResult):
        return _outcome(child, run_id, begun, counted)
    if new:
        await begun._aopen_store(new=True)  # noqa: SLF001 - written as Agent.arun writes a new run
        _opened(parent, begun)
    fly(parent, call, begun, counted)  # a cut of the parent (the child cancelled with it) counts what it spent
    try:
        result = await begun.afinish()
    except AgentLoopError as stop:
        result = stop.result
    return _outcome(child, run_id, result, counted)
