"""An agent's runs that continue another run: ``resume`` a stopped or paused one, ``fork`` one at any transition.

``Agent`` (``drivers.agent``) starts new runs; these begin from an earlier
run's position (its snapshot, or its recording rebuilt up to a transition:
``drivers.rebuild``), so they share how a run comes back (``AgentRun._resumed``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from fsm_agent.core.cancellation import CancelToken
from fsm_agent.drivers.agent_parts import AgentParts
from fsm_agent.drivers.agent_run import AgentRun
from fsm_agent.drivers.fork import forked, prepared
from fsm_agent.drivers.fork_edit import ForkEdit, checked_edit, edited_source, unpaired
from fsm_agent.drivers.fork_source import ForkSource, Rerun, arecording_of_source, recording_of_source
from fsm_agent.drivers.rebuild import arebuilt, rebuilt
from fsm_agent.drivers.stored import astore_for, store_for
from fsm_agent.drivers.watched import Observer
from fsm_agent.errors import ForkError, RunExistsError
from fsm_agent.records import RunResult, Transition

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.persist import StoreTarget
    from fsm_agent.persist.store import Store


class RunsAgain(AgentParts):
    """The half of an agent whose runs begin where another run was: resumed, or forked."""

    def resume(
        self,
        source: RunResult | dict[str, Any] | str,
        *,
        approvals: Mapping[str, bool | str] | None = None,
        retry: bool = False,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        store: StoreTarget | None = None,
        max_steps: int | None = None,
        token_budget: int | None = None,
        timeout: float | None = None,
        max_tool_calls: int | Mapping[str, int] | None = None,
        cost_budget: float | None = None,
        deps: Any = None,
    ) -> AgentRun:
        """Continue a run from a snapshot (dict or JSON text) or from a stopped or paused ``RunResult``.

        The run comes back exactly where it was, with its own limits unless
        new ones are given; no callbacks are re-fired.  A run that stopped on
        ``max_steps``, ``token_budget``, ``cost_budget``, ``timeout``,
        ``max_tool_calls`` or ``cancelled`` continues if the new limits (or a fresh token) lift the
        stop, and a ``model_error`` run with ``retry=True``; the trace shows
        that as a ``resume`` edge out of ``Failed``.  Anything else is a
        ``ValueError`` saying why, as are new limits that forbid the call a
        run that did not stop comes back to make.  With a ``store`` the run is claimed here,
        before anything is called (see ``aresume`` to await that); ``deps`` are given again (no snapshot holds them).
        """
        lifted = _lifted(max_steps, token_budget, timeout, max_tool_calls, cost_budget)
        opened = store_for(store)
        run, expected, entry = unclaimed(
            _agent(self), source, opened, deps, approvals, retry, cancel, observers, **lifted
        )
        run._claimed(expected, entry)  # noqa: SLF001 - the agent opens its own runs' stores
        return run

    async def aresume(
        self,
        source: RunResult | dict[str, Any] | str,
        *,
        approvals: Mapping[str, bool | str] | None = None,
        retry: bool = False,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        store: StoreTarget | None = None,
        max_steps: int | None = None,
        token_budget: int | None = None,
        timeout: float | None = None,
        max_tool_calls: int | Mapping[str, int] | None = None,
        cost_budget: float | None = None,
        deps: Any = None,
    ) -> AgentRun:
        """``resume``, awaited: with a ``store``, the claim and the resume edge's checkpoint block no event loop.

        Drive the run it returns with ``afinish()`` or ``aadvance()``: the
        store's async methods (``aclaim``, ``aappend``, ...) do every write.
        """
        lifted = _lifted(max_steps, token_budget, timeout, max_tool_calls, cost_budget)
        opened = await astore_for(store)
        run, expected, entry = unclaimed(
            _agent(self), source, opened, deps, approvals, retry, cancel, observers, **lifted
        )
        await run._aclaimed(expected, entry)  # noqa: SLF001 - the agent opens its own runs' stores
        return run

    def fork(
        self,
        source: ForkSource,
        at: int,
        *,
        run_id: str | None = None,
        store: StoreTarget | None = None,
        edit: ForkEdit | None = None,
        rerun: Rerun = None,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        deps: Any = None,
    ) -> AgentRun:
        """A new run whose history is ``source``'s up to and including its transition ``at``; drive it like ``start``'s.

        ``source`` is a ``RunResult``, a snapshot or recording (dict or JSON
        text), or the id of a run in ``store``, where the fork is stored too
        (under ``run_id``, a fresh id by default, naming its source as
        ``forked_from``).  The source is rebuilt up to ``at`` from its own
        replies and results, nothing called, and ``edit`` (a ``ForkEdit``)
        changes messages, results, limits or decisions before the fork goes
        on.  A call the source completed after ``at`` is not made again when
        the fork asks for it with the same arguments: the recorded result is
        taken (``Step.reused_from``) unless ``rerun`` names the call (or is
        ``"all"``).  The fork keeps the source's system prompt (or none), not
        the agent's.  Taken at a stop, it goes on where ``edit``'s limits lift
        the stop (a ``timeout`` too), from ``cancelled`` with a token nobody
        cancelled (or none), or asks its model again at a failed model call
        (``model_error``, ``context_overflow``).  The source's deadlines and
        cancels before ``at`` are met again where they were, nothing called
        (``recorded_outside``).  A ``ForkError`` says why a
        fork cannot be taken; nothing is stored then.  See
        ``fsm_agent.drivers.fork``.
        """
        opened = store_for(store)
        edit = checked_edit(edit)
        edited = edited_source(recording_of_source(source, opened), edit)
        try:
            rebuilt_run = rebuilt(_agent(self), edited, at)
        except ForkError as exc:
            _refuse_unpaired(edited, edit, exc)
            raise
        ready = prepared(rebuilt_run, edited, at, run_id, edit, rerun)
        run, entry = forked(_agent(self), ready, cancel=cancel, observers=observers, store=opened, deps=deps)
        try:
            run._open_store(new=True)  # noqa: SLF001 - the agent opens its own runs' stores
        except RunExistsError as exc:
            raise _taken(exc) from None
        if entry is not None:
            run._after(entry)  # noqa: SLF001 - forked at a stop its edit lifts: the resume edge, as resume() takes it
        return run

    async def afork(
        self,
        source: ForkSource,
        at: int,
        *,
        run_id: str | None = None,
        store: StoreTarget | None = None,
        edit: ForkEdit | None = None,
        rerun: Rerun = None,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        deps: Any = None,
    ) -> AgentRun:
        """``fork``, awaited: the source read and the fork written with the store's async methods."""
        opened = await astore_for(store)
        edit = checked_edit(edit)
        edited = edited_source(await arecording_of_source(source, opened), edit)  # type: ignore[arg-type]
        try:
            rebuilt_run = await arebuilt(_agent(self), edited, at)
        except ForkError as exc:
            _refuse_unpaired(edited, edit, exc)
            raise
        ready = prepared(rebuilt_run, edited, at, run_id, edit, rerun)
        run, entry = forked(_agent(self), ready, cancel=cancel, observers=observers, store=opened, deps=deps)
        try:
            # Written, then its resume edge taken (see fork); a cancel that cuts it ends the fork, as aresume's run.
            await run._aopened(entry, new=True)  # noqa: SLF001 - the agent opens its own runs' stores
        except RunExistsError as exc:
            raise _taken(exc) from None
        return run


def _refuse_unpaired(edited: dict[str, Any], edit: ForkEdit, exc: ForkError) -> None:
    """The edited source could not be rebuilt: a ``ForkError`` saying so if its edited messages are unpaired."""
    problem = unpaired(edited, edit)
    if problem is not None:
        raise ForkError(problem) from exc


def _taken(exc: RunExistsError) -> RunExistsError:
    """A fork's ``run_id`` that the store holds already: the same error, with what a fork can do about it."""
    return RunExistsError(exc.run_id, exc.where, "fork under another run_id, or with none for a fresh one")


def _agent(half: RunsAgain) -> Agent:
    """This half as the ``Agent`` it is always part of (the runs it builds read the whole agent)."""
    return cast("Agent", half)


def unclaimed(
    agent: Agent,
    source: RunResult | dict[str, Any] | str,
    store: Store | None,
    deps: Any,
    approvals: Mapping[str, bool | str] | None = None,
    retry: bool = False,
    cancel: CancelToken | None = None,
    observers: Sequence[Observer] = (),
    **limits: Any,
) -> tuple[AgentRun, int | None, Transition | None]:
    """``Agent.resume``'s run before its claim: the run, the stored version to claim it at, and its resume edge.

    ``limits`` are ``resume``'s by name (``max_steps=``, ...; None: the
    run's own).  A ``Session`` claims its last turn itself, to check between
    the claim and the edge that no other owner took a turn after it
    (``StoredTurns._resumed_last``).
    """
    lifted = _lifted(**{name: limits.pop(name, None) for name in _LIMITS})
    if limits:
        msg = f"resume() got unexpected keyword arguments: {', '.join(sorted(limits))}"
        raise TypeError(msg)
    return AgentRun._resumed(agent, source, approvals, retry, cancel, observers, store, lifted, deps)  # noqa: SLF001


_LIMITS = ("max_steps", "token_budget", "timeout", "max_tool_calls", "cost_budget")
"""The limits ``resume`` takes by name."""


def _lifted(
    max_steps: int | None,
    token_budget: int | None,
    timeout: float | None,
    max_tool_calls: int | Mapping[str, int] | None,
    cost_budget: float | None,
) -> dict[str, Any]:
    """The limits a resume gives by name (None: the run's own)."""
    return {
        "max_steps": max_steps,
        "token_budget": token_budget,
        "timeout": timeout,
        "max_tool_calls": max_tool_calls,
        "cost_budget": cost_budget,
    }
