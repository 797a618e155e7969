"""One run of a batch, wherever it executes: find it in the store, then return it, resume it or start it.

This is the whole recovery story.  A worker that picks up a run first reads
the store: a run that ended is returned as stored (no model call), a run
that was cut off (a dead worker, Ctrl-C) continues from its last checkpoint,
and only a run the store has never seen starts.  So retrying a task, or
running a whole batch again, never repeats a completed model or tool call.
A stored run that asked another question than the item (an input edited
under its explicit run id) is the item's ``error``: neither answered with
the old answer nor resumed.  Everything a worker is given (the agent
factory, the store's address, the item) pickles; the agent and the store
are built where the run executes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from fsm_agent import persist
from fsm_agent.batch.items import BatchItem
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.snapshot_fields import ended_on
from fsm_agent.drivers.agent import Agent, AgentRun
from fsm_agent.drivers.read_back import stored_result
from fsm_agent.drivers.stored import awaited
from fsm_agent.errors import AgentLoopError, RunExistsError, RunLeasedError, RunStateError
from fsm_agent.persist.store import DEFAULT_LEASE as STORE_LEASE
from fsm_agent.persist.store import Store, traits
from fsm_agent.records import Message, RunResult

AgentFactory = Callable[[], Agent]
"""What ``run_batch`` takes instead of an agent: called in each worker, because SDK clients do not pickle."""

DepsFactory = Callable[[BatchItem], Any]
"""``run_batch(make_deps=...)``: each run's deps from its item, made where the run executes (deps need not pickle)."""

StoreSpec = str | os.PathLike[str]
"""Where a worker finds the store: a SQLite file path, or a URL ``fsm_agent.persist.open_store`` understands."""

Opened = persist.SqliteStore | persist.PostgresStore
"""A store a batch opened from a ``StoreSpec``, and so closes itself (``close``, and ``aclose`` on a loop)."""

ERROR = "error"
"""The reason of a result whose run could not be carried out at all (the factory or the store raised)."""

LEASED = "leased"
"""The reason of a result whose run another live worker holds."""

DEFAULT_LEASE = STORE_LEASE
"""Seconds a batch worker's lease on a run lasts unless renewed: how long a retry waits for a dead worker's run.

The store's default: the lease follows its owner (a heartbeat renews it
while a call is in flight), so it need not outlast the slowest call.
"""

_MARGIN = 0.05
"""Seconds past a lease's end before trying again, so clocks that read a hair apart do not refuse the takeover."""

RESUMABLE = frozenset({"cancelled"})
"""Stops a batch resumes by itself: a cancelled batch (Ctrl-C, ``cancel``) continues where it was cut off (a run
whose finalize call the cancel cut, too: its resume makes that call again)."""


THREADS_PER_RUN = 4
"""Blocking calls one run of a batch may have waiting at once: a sync model's or a store's call, or a parallel batch of
sync tool calls.  Threads start only as calls need them, so the bound costs nothing until it is used."""


def blocking_calls(runs: int) -> concurrent.futures.ThreadPoolExecutor:
    """The executor of a batch's event loop: enough threads that no run in flight waits for another's call to end.

    The async driver hands sync tools and a sync model's ``complete`` to
    its loop's executor.  asyncio's default has ``min(32, CPUs + 4)``
    threads, six on two cores: a batch of 64 runs in flight made six such
    calls at a time, the other runs waiting for a thread.
    """
    return concurrent.futures.ThreadPoolExecutor(max(runs, 1) * THREADS_PER_RUN, "fsm_agent-batch-call")


def open_store(spec: StoreSpec, lease: float = DEFAULT_LEASE) -> Opened:
    """The store at ``spec`` (``fsm_agent.persist.open_store``: a PostgreSQL URL, else a SQLite file)."""
    return persist.open_store(os.fspath(spec), lease=lease)


def is_sqlite(spec: StoreSpec) -> bool:
    """Whether ``spec`` names a SQLite file, which only the processes of one machine can share."""
    return not persist.is_url(os.fspath(spec))


def absolute(spec: StoreSpec) -> str:
    """``spec`` as text a worker in another directory reads the same way: file paths made absolute."""
    text = os.fspath(spec)
    return text if "://" in text else str(Path(text).resolve())


_stores: dict[tuple[str, float], Opened] = {}


def store_at(spec: str, lease: float) -> Opened:
    """The store at ``spec``, opened once per worker process and kept for the next task the process runs."""
    store = _stores.get((spec, lease))
    if store is None:
        store = _stores[spec, lease] = open_store(spec, lease)
    return store


def failed_result(item: BatchItem, reason: str, **evidence: Any) -> RunResult:
    """The result of a run that never got going (not started before a cancel, or unable to start)."""
    return RunResult(messages=(Message("user", item.input),), steps=(), final="", reason=reason, evidence=evidence)


def unstarted(items: Iterable[BatchItem], why: str) -> Iterator[tuple[BatchItem, RunResult]]:
    """Each of ``items`` as a run a cancel (``why``) stopped before it began: ``cancelled``, never started."""
    for item in items:
        yield item, failed_result(item, "cancelled", why=why, started=False)


def error_result(item: BatchItem, exc: BaseException) -> RunResult:
    """A run the worker could not carry out, as a result: ``leased`` if another worker holds it, else ``error``."""
    reason = LEASED if isinstance(exc, RunLeasedError) else ERROR
    return failed_result(item, reason, type=type(exc).__name__, error=str(exc), run_id=item.run_id)


def left_result(item: BatchItem, exc: BaseException) -> RunResult:
    """A run a call's ``KeyboardInterrupt`` or ``SystemExit`` left in a worker process: an ``error`` saying so.

    The driver left the run as a Ctrl-C in a call leaves it: written as it
    stood, unfinished, its lease left to lapse; a later pass resumes it and
    makes that call again.
    """
    what = f"{type(exc).__name__}({exc})" if str(exc) else type(exc).__name__
    error = f"a call raised {what} in a worker: the run is left unfinished at its last checkpoint for a later pass"
    return failed_result(item, ERROR, type=type(exc).__name__, error=error, run_id=item.run_id)


def agent_of(make_agent: AgentFactory) -> Agent:
    """The agent ``make_agent()`` built, or a ``TypeError`` saying what it returned instead of an Agent.

    Used as an agent, another value fails later with an error naming
    neither the factory nor the Agent it should have returned (``'str'
    object has no attribute 'astart'``), in every result of the batch.
    """
    agent = make_agent()
    if not isinstance(agent, Agent):
        name = getattr(make_agent, "__qualname__", type(make_agent).__name__)
        msg = f"make_agent ({name}) returned a {type(agent).__name__} where an Agent was wanted: return the Agent"
        raise TypeError(msg)
    return agent


def prepare(
    agent: Agent, store: Store, item: BatchItem, cancel: CancelToken | None = None, deps: Any = None
) -> AgentRun | RunResult:
    """The run to drive for ``item``, or its result if the store says it is over (no model call then).

    A run paused for a person's decision is returned as paused: a batch
    cannot decide for them (``runs resume --approve`` can).  ``deps`` go to
    the run, started or resumed (a snapshot holds none).
    """
    try:
        data = store.load(item.run_id)
    except KeyError:
        return agent.start(item.input, store=store, run_id=item.run_id, cancel=cancel, deps=deps)
    other = _asked_otherwise(item, data)
    if other is not None:
        return other
    if data.get("paused") or data["state"] == "Done":
        return stored_result(agent, data)
    if data["state"] == "Failed" and ended_on(data) not in RESUMABLE:
        return stored_result(agent, data)
    try:
        return agent.resume(data, store=store, cancel=cancel, deps=deps)
    except ValueError:
        # Limits that do not lift the stop: the stored run stands as it ended.
        return stored_result(agent, data)


async def aprepare(
    agent: Agent, store: Store, item: BatchItem, cancel: CancelToken | None = None, deps: Any = None
) -> AgentRun | RunResult:
    """``prepare``, awaited: the store read and the run written or claimed by its async methods, the loop never held."""
    try:
        data = await awaited(store, "load", item.run_id)
    except KeyError:
        return await agent.astart(item.input, store=store, run_id=item.run_id, cancel=cancel, deps=deps)
    other = _asked_otherwise(item, data)
    if other is not None:
        return other
    if data.get("paused") or data["state"] == "Done":
        return stored_result(agent, data)
    if data["state"] == "Failed" and ended_on(data) not in RESUMABLE:
        return stored_result(agent, data)
    try:
        return await agent.aresume(data, store=store, cancel=cancel, deps=deps)
    except ValueError:
        # Limits that do not lift the stop: the stored run stands as it ended.
        return stored_result(agent, data)


def _asked_otherwise(item: BatchItem, data: dict[str, Any]) -> RunResult | None:
    """An ``error`` result if the stored run ``data`` under ``item``'s run id asked another question, else ``None``.

    The run's own question is its first message after those it started
    from (``prior``: the system prompt, a history), as ``Agent.start``
    wrote it.  An input edited under an explicit ``run_id`` is not the
    stored conversation: it is neither answered with the old answer nor
    resumed as if it were.  Nothing is run for it.
    """
    messages, prior = data.get("messages") or [], data.get("prior") or 0
    first = messages[prior] if isinstance(prior, int) and 0 <= prior < len(messages) else None
    asked = first.get("content") if isinstance(first, dict) and first.get("role") == "user" else None
    if asked == item.input:
        return None
    said = f"{asked!r}" if isinstance(asked, str) else "no question this batch can compare"
    msg = (
        f"run_id {item.run_id!r} holds a run that asked {said}, not input {item.index}'s {item.input!r}: "
        "give this input a new run_id, or delete the stored run (store.delete(run_id)) to ask it afresh"
    )
    return error_result(item, RunStateError(msg))


def _outcome(run: AgentRun) -> RunResult:
    try:
        return run.finish()
    except AgentLoopError as exc:
        return exc.result


async def _aoutcome(run: AgentRun) -> RunResult:
    try:
        return await run.afinish()
    except AgentLoopError as exc:
        return exc.result


@attrs.frozen
class Patience:
    """How long a run another owner holds is waited for, carried from one attempt at the run to the next.

    ``give_up``: the first attempt's time plus a lease.  ``seen``: where the
    holder's lease ended at the attempt before.  A holder whose lease ends
    past ``give_up`` at two attempts in a row, renewed between them, is live:
    the run is reported ``leased`` rather than waited for without end.  One
    that renewed past ``give_up`` once and then stopped (it died) is waited
    for until that lease lapses, and its run taken over.
    """

    give_up: float
    seen: float | None = None


@attrs.frozen
class Later:
    """A run another owner holds for now: try it again at ``at`` (seconds since the epoch), with ``patience``.

    What one attempt at a run returns instead of waiting out the lease in
    its executor slot: the executor puts the run back, gives the slot to
    the next run, and tries this one again once ``at`` has passed (passing
    ``patience`` along).
    """

    at: float
    patience: Patience


def _wait_for(exc: RunLeasedError | RunExistsError, patience: Patience) -> Later | None:
    """When to try a run again that another owner holds (None: at once); ``exc`` re-raised for a live holder.

    A holder that died (a killed worker, a crashed driver) stops renewing,
    so its lease lapses at ``until``; a live holder keeps pushing ``until``
    on (``Patience``).  A run two workers created at once is simply read again.
    """
    if isinstance(exc, RunExistsError) or exc.stale:
        return None
    seen, give_up = patience.seen, patience.give_up
    if exc.until > give_up and seen is not None and seen > give_up and exc.until != seen:
        raise exc
    return Later(max(exc.until, time.time()) + _MARGIN, attrs.evolve(patience, seen=exc.until))


def _plan(
    agent: Agent, store: Store, item: BatchItem, cancel: CancelToken | None, patience: Patience, deps: Any
) -> AgentRun | RunResult | Later:
    """``prepare``, read again at once after a race; ``Later`` if another owner's lease on the run is live."""
    while True:
        try:
            return prepare(agent, store, item, cancel, deps)
        except (RunLeasedError, RunExistsError) as exc:
            later = _wait_for(exc, patience)
            if later is not None:
                return later


async def _aplan(
    agent: Agent, store: Store, item: BatchItem, cancel: CancelToken | None, patience: Patience, deps: Any
) -> AgentRun | RunResult | Later:
    """``_plan``, awaited."""
    while True:
        try:
            return await aprepare(agent, store, item, cancel, deps)
        except (RunLeasedError, RunExistsError) as exc:
            later = _wait_for(exc, patience)
            if later is not None:
                return later


def try_item(
    make_agent: AgentFactory,
    store: Store,
    item: BatchItem,
    cancel: CancelToken | None = None,
    patience: Patience | None = None,
    make_deps: DepsFactory | None = None,
) -> RunResult | Later:
    """One attempt at a run with the sync driver: its result, or ``Later`` if it is leased elsewhere (no waiting).

    ``patience`` is the attempt before's ``Later.patience`` (``None`` on the
    first attempt: now plus the store's lease).  ``make_deps(item)`` gives
    the run its deps; what it raises is the run's ``error`` result.
    """
    try:
        agent = agent_of(make_agent)
        deps = None if make_deps is None else make_deps(item)
        plan = _plan(agent, store, item, cancel, _patience(store, patience), deps)
        return plan if isinstance(plan, RunResult | Later) else _outcome(plan)
    except Exception as exc:  # noqa: BLE001 - a batch never raises for one run: the error is that run's result
        return error_result(item, exc)


async def atry_item(
    make_agent: AgentFactory,
    store: Store,
    item: BatchItem,
    cancel: CancelToken | None = None,
    patience: Patience | None = None,
    make_deps: DepsFactory | None = None,
) -> RunResult | Later:
    """One attempt at a run with the async driver (see ``try_item``); cancelling the task checkpoints the run."""
    try:
        agent = agent_of(make_agent)
        deps = None if make_deps is None else make_deps(item)
        plan = await _aplan(agent, store, item, cancel, _patience(store, patience), deps)
        return plan if isinstance(plan, RunResult | Later) else await _aoutcome(plan)
    except Exception as exc:  # noqa: BLE001 - a batch never raises for one run: the error is that run's result
        return error_result(item, exc)


def run_item(
    make_agent: AgentFactory,
    store: Store,
    item: BatchItem,
    cancel: CancelToken | None = None,
    make_deps: DepsFactory | None = None,
) -> RunResult:
    """Carry out one run with the sync driver, waiting here for another owner's lease; every end is a result."""
    patience: Patience | None = None
    while True:
        got = try_item(make_agent, store, item, cancel, patience, make_deps)
        if not isinstance(got, Later):
            return got
        patience = got.patience
        time.sleep(max(got.at - time.time(), 0.0))


async def arun_item(
    make_agent: AgentFactory,
    store: Store,
    item: BatchItem,
    cancel: CancelToken | None = None,
    make_deps: DepsFactory | None = None,
) -> RunResult:
    """Carry out one run with the async driver, waiting here for another owner's lease; every end is a result."""
    patience: Patience | None = None
    while True:
        got = await atry_item(make_agent, store, item, cancel, patience, make_deps)
        if not isinstance(got, Later):
            return got
        patience = got.patience
        await asyncio.sleep(max(got.at - time.time(), 0.0))


def _patience(store: Store, patience: Patience | None) -> Patience:
    """``patience`` if given, else a first attempt's: now plus the store's lease.

    The lease the engine leases with (``traits``): the store's own, or
    ``DEFAULT_LEASE`` for a store that declares none.
    """
    return patience if patience is not None else Patience(time.time() + traits(store).lease + _MARGIN)
