"""``AgentRun``, one run of an agent: both drivers over one stepper, and how a run comes back from its snapshot.

``advance()``/``finish()`` call, ``aadvance()``/``afinish()`` await, and a
run may switch between them at any transition.  ``Agent.run``, ``arun``,
``stream`` and ``astream`` are built on them; ``Agent.resume`` and
``aresume`` on ``AgentRun._resumed``, and differ only in how they claim the
run in its store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from fsm_agent.core import snapshot
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.definition.table import describe_resumable
from fsm_agent.drivers.aio import AsyncDriver
from fsm_agent.drivers.sync import SyncDriver
from fsm_agent.drivers.watched import Observer
from fsm_agent.records import RunResult, Transition

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.persist.store import Store


class AgentRun(SyncDriver, AsyncDriver):
    """One run of an agent, driven by ``advance()``/``aadvance()`` (one transition) or ``finish()``/``afinish()``."""

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
    ) -> tuple[Self, int | None, Transition | None]:
        """A run of ``agent`` back from its snapshot (``Agent.resume``), the version to claim it at, and its edge.

        ``lifted`` holds the new limits (None: the run's own).  Nothing is
        written yet: the caller claims the run at ``expected`` (the version
        its snapshot was read at), then closes the resume edge (None for a
        run that was paused, not stopped).  ``deps`` are the new owner's: a
        snapshot never holds them.
        """
        from fsm_agent.persist.journal import (  # see stored: import fsm_agent loads no store module
            forked_from_of,
            link_of,
        )
        from fsm_agent.persist.store import session_id, stored_version

        if isinstance(source, RunResult):
            if source.snapshot is None:
                msg = f"a RunResult with reason {source.reason!r} has no snapshot: only stopped or paused runs resume"
                raise ValueError(msg)
            source = source.snapshot
        data = snapshot.parse(source)
        expected = stored_version(data)
        position = Run(snapshot.limits_of(data, **lifted), [], table=agent.table, policies=agent.on_stop)
        snapshot.load(position, data, agent.table.states)
        run_id = data.get("run_id")
        run = cls(
            agent,
            position,
            cancel=cancel,
            observers=observers,
            store=store,
            run_id=run_id if isinstance(run_id, str) and run_id else None,
            session=session_id(data.get("session_id")),
            parent=link_of(data),
            forked_from=forked_from_of(data),
            deps=deps,
        )
        run.stepper.gate()  # this agent's approve= holds back calls too, beside those the run already holds back
        if position.at.state is State.Done:
            msg = "the run finished in Done; there is nothing to resume"
            raise ValueError(msg)
        entry = None
        if position.at.state is State.Failed:
            run._observe()
            entry = run.stepper.resume(retry, snapshot.limits_of(data))  # the edge keeps what it stopped under
            if entry is None:
                msg = (
                    f"the run stopped with {position.at.reason!r}, which these limits do not lift "
                    f"(counters {position.counters()}); {describe_resumable(agent.table.stops)}"
                )
                raise ValueError(msg)
        if approvals:
            # Decided before the claim, so the claim stores the decisions and, with nothing left to wait
            # for, keeps the lease: nobody can decide or resume in between, and a refused decision writes nothing.
            run.decide(approvals)
        # The caller takes the run over before anything is called: a run another owner is advancing is a
        # RunLeasedError there, and one that moved on since this snapshot was read (or that the snapshot was never
        # read from) a StaleRunError.  A stopped run is claimed with its resume edge already taken, so the claim
        # keeps the lease; claimed while still Failed it would be let go at once, and a second owner could take it.
        return run, expected, entry
