"""A sub-agent call's stored run found again by its parent: read back if it finished, else taken over.

A finished child is read back, never run again (``ReadBack``); one that
stopped with its parent (the parent's cancel or deadline cut it) or is
under way goes on from its own last checkpoint, once nobody else holds it:
the take-over waits out a dead owner's lease, and reads the child again when
it moved on meanwhile (a person's decision, another owner's write), so a
live owner's result is taken and nothing of the child runs twice.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core import snapshot
from fsm_agent.core.snapshot_fields import ended_on
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.run import Run
from fsm_agent.definition.table import first_row
from fsm_agent.definition.triggers import RESUME
from fsm_agent.drivers.child import FINISHED, ChildTool
from fsm_agent.drivers.cut_spend import CUT_WITH_PARENT, spent_in
from fsm_agent.drivers.read_back import stored_result
from fsm_agent.drivers.stored import awaited
from fsm_agent.errors import RunLeasedError
from fsm_agent.records import ChildOutcome, RunResult

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.drivers.agent_run import AgentRun
    from fsm_agent.drivers.base import RunBase


@attrs.frozen
class ReadBack:
    """A stored child that finished, read back (never run again): its result, and what its run spent."""

    result: RunResult
    spent: ChildOutcome


def read_back(agent: Agent, run_id: str, data: dict[str, Any]) -> ReadBack:
    """The finished stored child ``data``: its result, and its spend (its model calls from its stored counters)."""
    result = stored_result(agent, data)
    counters = data.get("counters")
    return ReadBack(result, spent_in(run_id, result, counters if isinstance(counters, dict) else {}))


def is_finished(
    data: dict[str, Any] | None, again: str | None = None, agent: Agent | None = None, limits: Limits | None = None
) -> bool:
    """Whether a stored child (None: none stored) finished, so its result is read back, never run again.

    ``again``: the parent's stop that cut this call in flight
    (``parent_cut``).  A child that stopped ``cancelled`` then (the token
    it shares with its parent, or its task cancelled with the parent's)
    stopped with its parent, not of itself, and so did one that stopped
    ``timeout`` (its deadline is its parent's): either is resumed, as the
    parent is, from where it stopped, where its ``agent``'s table resumes it
    under ``limits``, what the parent has left for it (``_resumes_under``).
    Where it does not (a typed answer's retry the cut forbade, which the
    child's agent no longer allows), it is read back as it stopped.  A child whose
    finalize call the parent's cut reached stopped with its parent too: its
    run keeps the stop that asked for the finalize, the cut is on its last
    edge, and its resume makes that call again.
    """
    if data is None or data.get("state") not in FINISHED or data.get("paused"):
        return False
    cut = ended_on(data)
    if again is None or cut not in CUT_WITH_PARENT:
        return True
    return agent is not None and limits is not None and not _resumes_under(agent, data, limits)


def _resumes_under(agent: Agent, data: dict[str, Any], limits: Limits) -> bool:
    """Whether ``agent``'s table takes the stopped child ``data`` on under ``limits``: its ``resume`` edge.

    Why the table's own row, not the stop's rule said again here: what
    ``Agent.resume`` would do with it (``Stepper.resume``) is what decides
    whether the child goes on or is read back as it stopped.
    """
    output = agent.settings.output  # a typed answer's retries left are the resume's to weigh, as the stepper's
    limits_now = snapshot.limits_of(data, **resumed_under(limits))
    retries = 0 if output is None else output.retries
    position = Run(limits_now, [], table=agent.table, policies=agent.on_stop, output_retries=retries)
    snapshot.load(position, data, agent.table.states)
    return first_row(position, RESUME) is not None


def deps_of(parent: RunBase, child: ChildTool) -> Any:
    """The child run's deps: the sub-agent tool's own if it was given some, else the parent run's."""
    return child.deps if child.deps is not None else parent._deps  # noqa: SLF001 - the parent's driver hands over its run


def taken_over(
    child: ChildTool, store: Any, run_id: str, data: dict[str, Any], parent: RunBase, limits: Limits, again: str | None
) -> AgentRun | ReadBack:
    """The stored child's result if it finished, else its run resumed here once nobody else holds it.

    A parent resumed after its process died finds its child still leased
    to that process for up to a lease: it waits for the lease to lapse (or
    for a live owner to finish the child, whose result it then takes),
    within two leases; a child some live owner keeps advancing past that
    is a ``RunLeasedError`` naming it.  A child that moved on since it was
    read (a person's decision, another owner's write) is read again at once.
    Nothing of the child runs twice.
    ``ataken_over`` is the same, awaited.
    """
    from fsm_agent.persist.store import traits

    agent, cancel, deps = child.agent, parent._cancel, deps_of(parent, child)  # noqa: SLF001 - the parent's run
    patience = time.time() + 2 * traits(store).lease
    while True:
        if is_finished(data, again, agent, limits):
            return read_back(agent, run_id, data)
        try:
            return agent.resume(data, cancel=cancel, store=store, deps=deps, **resumed_under(limits))
        except RunLeasedError as busy:
            time.sleep(_lease_wait(busy, patience))
        data = dict(store.load(run_id))


async def ataken_over(
    child: ChildTool, store: Any, run_id: str, data: dict[str, Any], parent: RunBase, limits: Limits, again: str | None
) -> AgentRun | ReadBack:
    """``taken_over``, awaited: the claim, the wait for a lease and the store's reads block no event loop."""
    import asyncio  # as in drivers.aio: import fsm_agent loads no asyncio

    from fsm_agent.persist.store import traits

    agent, cancel, deps = child.agent, parent._cancel, deps_of(parent, child)  # noqa: SLF001 - the parent's run
    patience = time.time() + 2 * traits(store).lease
    while True:
        if is_finished(data, again, agent, limits):
            return read_back(agent, run_id, data)
        try:
            return await agent.aresume(data, cancel=cancel, store=store, deps=deps, **resumed_under(limits))
        except RunLeasedError as busy:
            await asyncio.sleep(_lease_wait(busy, patience))
        data = dict(await awaited(store, "load", run_id))


def resumed_under(limits: Limits) -> dict[str, Any]:
    """The limits a stored child taken over goes on under: the time, tokens, tool calls and dollars left for it.

    Each counts what the child's run used before (``limits_for``'s ``used``, ``with_lent_back``), as its own
    counters go on from there.
    """
    return {
        "timeout": limits.timeout,
        "token_budget": limits.token_budget,
        "max_tool_calls": limits.max_tool_calls,
        "cost_budget": limits.cost_budget,
    }


def _lease_wait(busy: RunLeasedError, patience: float) -> float:
    """Seconds to wait before the stored child is read again; ``busy`` itself once ``patience`` is over.

    A leased child: until its lease lapses.  A child that moved on since it
    was read (a person's decision, another owner's write: ``stale``): none,
    it is read again at once, and taken back or its result read.
    """
    now = time.time()
    if now >= patience:
        raise busy
    if busy.stale:
        return 0.0
    return min(max(busy.until - now, 0.0) + _SLACK, patience - now)


_SLACK = 0.05
"""Seconds waited past a lease's end before taking it over: the clocks of two writers are never quite equal."""
