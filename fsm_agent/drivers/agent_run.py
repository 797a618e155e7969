"""``AgentRun``, one run of an agent: both drivers over one stepper, and how a run comes back from its snapshot.

``advance()``/``finish()`` call, ``aadvance()``/``afinish()`` await, and a
run may switch between them at any transition.  ``Agent.run``, ``arun``,
``stream`` and ``astream`` are built on them; ``Agent.resume`` and
``aresume`` on ``AgentRun._resumed``, and differ only in how they claim the
run in its store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from fsm_agent.core import snapshot
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.late_decisions import too_late
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.definition.table import describe_resumable
from fsm_agent.drivers.aio import AsyncDriver
from fsm_agent.drivers.sync import SyncDriver
from fsm_agent.drivers.watched import Observer
from fsm_agent.errors import SnapshotError
from fsm_agent.observe.events import logger
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
        *,
        resumable: str | None = None,
    ) -> tuple[Self, int | None, Transition | None]:
        """A run of ``agent`` back from its snapshot (``Agent.resume``), the version to claim it at, and its edge.

        ``lifted`` holds the new limits (None: the run's own).  Nothing is
        written yet: the caller claims the run at ``expected`` (the version
        its snapshot was read at), then closes the resume edge (None for a
        run that was paused, not stopped).  ``deps`` are the new owner's: a
        snapshot never holds them.  ``resumable`` says, in the error at a stop
        these limits do not lift, which stops the caller goes on from
        (default: those ``Agent.resume`` does).
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
        try:
            data = snapshot.parse(source)
        except SnapshotError as exc:
            _no_json(source, exc)
            raise
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
            request=session_id(data.get("request_id")),  # the request that took a session's turn: kept with it
            parent=link_of(data),
            forked_from=forked_from_of(data),
            deps=deps,
        )
        run._resumes = True  # its call events say the run was under way (a run cut before its first transition too)
        run.stepper.gate()  # this agent's approve= holds back calls too, beside those the run already holds back
        if position.at.state is State.Done:
            msg = "the run finished in Done; there is nothing to resume"
            if isinstance(approvals, Mapping) and approvals:
                # Decisions that came too late (another request resumed the run): told the decision that stood.
                msg += f": {too_late(position, approvals, run.stepper.approve)}"
            raise ValueError(msg)
        entry = None
        if position.at.state is State.Failed:
            run._observe()
            entry = run.stepper.resume(retry, snapshot.limits_of(data))  # the edge keeps what it stopped under
            if entry is None:
                msg = (
                    f"the run stopped with {position.at.reason!r}, which these limits do not lift "
                    f"(counters {position.counters()}); {resumable or describe_resumable(agent.table.stops)}"
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

    def _claimed(self, expected: int | None, entry: Transition | None, still: Callable[[], None] | None = None) -> None:
        """The resumed run claimed in its store at ``expected`` (``_resumed``), and its resume edge taken, heard.

        ``still`` is asked between the claim and the edge, and may refuse the
        resume by raising: the claim of a stopped or paused run gives its
        lease up at once, so the run is left as it was, nothing called.
        """
        self._open_store(new=False, expected=expected)
        if still is not None:
            still()
        if entry is not None:
            self._after(entry)  # observers and the store see the resume edge like any other

    async def _aclaimed(
        self, expected: int | None, entry: Transition | None, still: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``_claimed``, awaited; a cancel that cuts it ends the run (``astop_cut``) before it propagates.

        The caller (``Agent.aresume``) never gets the run, so nobody would go
        on with it: a claim the store committed all the same would hold the
        run's lease until it lapses, and an answer sent again would wait for it.
        """
        try:
            await self._aopen_store(new=False, expected=expected)
            if still is not None:
                await still()
            if entry is not None:
                await self._aafter(entry)
        except BaseException:
            await astop_cut(self)
            raise


def _no_json(source: object, exc: SnapshotError) -> None:
    """A ``SnapshotError`` saying what resume takes, if ``source`` was a text that is no JSON at all (``exc``'s cause).

    Such a text is most often a stored run's id, which resume does not look
    up: the error shows how to resume that run.  A text that starts like a
    snapshot (``{``) keeps ``exc``, which says where its JSON breaks.
    """
    if isinstance(source, str) and isinstance(exc.__cause__, ValueError) and not source.lstrip().startswith("{"):
        shown = source if len(source) <= 60 else f"{source[:57]}..."
        if not source.strip():
            msg = "resume takes a snapshot (a dict or its JSON text) or a stopped or paused RunResult, not a blank text"
            raise SnapshotError(msg) from exc
        msg = (
            f"resume takes a snapshot (a dict or its JSON text) or a stopped or paused RunResult, and the text "
            f"{shown!r} is no JSON; to resume the stored run of that id, pass its snapshot: "
            f"agent.resume(store.load({shown!r}), store=store)"
        )
        raise SnapshotError(msg) from exc


async def astop_cut(run: AgentRun) -> None:
    """A run whose task was cancelled, with its token, while one of its writes was under way: ended.

    Nobody goes on with a session's turn once it is cut, nor with a run
    whose ``Agent.aresume`` was cut while claiming it (its caller never got
    the run), so the transition left closing (see ``AsyncDriver._aadvance``),
    or the run's first write or claim, which the store may have committed all
    the same (``persist/cut_writes``), would keep the run unfinished in the
    store, its lease held until it lapses.  The run is finished here instead,
    out of reach of the cancel (``AsyncDriver._aend_cut``): the cut write is
    read back or written again, and the run stops ``cancelled`` before its
    next call (none is made), or, when the model's answer had come, ends
    ``Done`` with it (nothing it produced is dropped); the end is stored and
    lets the run go.  A run whose first write never landed is not in the
    store (``KeyError``): there is nothing to end.  The cancel propagates as
    it came, whatever happens here.
    """
    import asyncio  # as in drivers.aio: import fsm_agent loads no asyncio

    token, journal = run._cancel, run._journal  # noqa: SLF001 - the run's own token, set by whoever cut the turn
    cut = run._closing is not None or (journal is not None and journal.cut_pending())  # noqa: SLF001 - as _aadvance
    if not cut or token is None or not token.cancelled:
        return
    try:
        await asyncio.shield(run._aend_cut())  # noqa: SLF001 - whoever cut the run ends it
    except KeyError:  # the turn was never stored
        pass
    except Exception:  # noqa: BLE001 - the cancel is what propagates; the turn's lease lapses as a dead owner's
        logger.warning("fsm_agent: the cut turn %s could not be ended", run.run_id, exc_info=True)
