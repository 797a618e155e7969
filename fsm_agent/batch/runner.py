"""``run_batch`` and ``iter_batch``: many runs of one agent, on Ray or in this process, each ending as a result.

Both check everything they are given before the first run starts (a bad
input, a store the workers cannot reach), then hand the runs to an
executor.  A stop, a broken run or a lost worker is that run's result, never
an exception for the batch: a batch of ten thousand does not die of one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import IO, Any, Literal

from fsm_agent.batch.items import BatchItem, batch_items
from fsm_agent.batch.local import DEFAULT_IN_FLIGHT, iter_local
from fsm_agent.batch.progress import Bar, Tally
from fsm_agent.batch.worker import (
    DEFAULT_LEASE,
    AgentFactory,
    DepsFactory,
    Opened,
    StoreSpec,
    absolute,
    open_store,
    unstarted,
)
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.persist import SqliteStore
from fsm_agent.persist.checks import check_store
from fsm_agent.persist.store import Store
from fsm_agent.records import RunResult

Executor = Literal["ray", "local"]
Finished = tuple[BatchItem, RunResult]


def iter_batch(
    make_agent: AgentFactory,
    inputs: Iterable[str | Mapping[str, Any]],
    *,
    store: StoreSpec | Store,
    executor: Executor = "ray",
    ray_address: str | None = None,
    max_retries: int = 3,
    max_in_flight: int | None = None,
    cancel: CancelToken | None = None,
    ray_options: Mapping[str, Any] | None = None,
    lease: float = DEFAULT_LEASE,
    on_start: Callable[[BatchItem], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    deps: Any = None,
    make_deps: DepsFactory | None = None,
    on_end: Callable[[BatchItem], None] | None = None,
) -> Generator[Finished, None, None]:
    """Yield ``(item, result)`` for every input as its run ends, in the order they end (see ``run_batch``).

    ``item`` says which input it was (``index``, ``input``, ``run_id``), so a
    caller can write results as they come.  Leaving the loop early (or
    Ctrl-C) cancels the runs in flight; each keeps its last checkpoint.
    ``on_start`` is called with each item as its run is handed to a worker,
    and ``on_end`` as the run leaves it: it ended (``on_end`` comes before
    its result is yielded), or it goes back in line (another owner's lease
    on it, its Ray worker died) and is handed to a worker again later, with
    ``on_start`` again.  The runs started and not ended are the runs in
    flight, never more than ``max_in_flight``, however far behind the
    executor the loop reads.  With ``executor="local"`` both are called from
    the batch's own thread, so they must be thread-safe (as ``Tally``'s
    ``start`` and ``end`` are).  ``on_status`` is called with a line saying
    what the batch does while it sets up (starting or joining Ray,
    starting its workers), before the first run.
    """
    items = _check(make_agent, inputs, executor, max_retries, max_in_flight, cancel)
    _check_store(store)
    deps_for = _deps_for(deps, make_deps, executor)
    return _iter(
        make_agent,
        items,
        store,
        executor,
        ray_address,
        max_retries,
        max_in_flight,
        cancel,
        ray_options,
        lease,
        on_start,
        on_end,
        on_status,
        deps_for,
    )


def _iter(
    make_agent: AgentFactory,
    items: list[BatchItem],
    store: StoreSpec | Store,
    executor: Executor,
    ray_address: str | None,
    max_retries: int,
    max_in_flight: int | None,
    cancel: CancelToken | None,
    ray_options: Mapping[str, Any] | None,
    lease: float,
    on_start: Callable[[BatchItem], None] | None,
    on_end: Callable[[BatchItem], None] | None,
    on_status: Callable[[str], None] | None = None,
    make_deps: DepsFactory | None = None,
) -> Generator[Finished, None, None]:
    if not items:
        return  # nothing to run: no store to open, no Ray instance to start
    if executor == "local":
        limit = max_in_flight or DEFAULT_IN_FLIGHT
        if not isinstance(store, str | os.PathLike):
            yield from iter_local(
                make_agent,
                store,
                items,
                max_in_flight=limit,
                cancel=cancel,
                on_start=on_start,
                on_end=on_end,
                make_deps=make_deps,
            )
            return
        opened = open_store(store, lease)
        try:
            yield from iter_local(
                make_agent,
                opened,
                items,
                max_in_flight=limit,
                cancel=cancel,
                on_start=on_start,
                on_end=on_end,
                make_deps=make_deps,
            )
        finally:
            _close(opened)
        return
    from fsm_agent.batch import on_ray, ray_cluster  # Ray is imported only by a batch on Ray

    spec = _spec_for_workers(store)
    # Opened here first: a store that cannot be used fails the batch before any run, and a new SQLite file
    # gets its tables now rather than from many workers at once.
    _close(open_store(spec, lease))
    if cancel is not None and cancel.cancelled:
        # Cancelled before it began: as on the local executor, every run ends unstarted, and Ray is not even joined.
        yield from unstarted(items, cancel.why)
        return
    say = on_status or (lambda _: None)
    if not ray_cluster.connected():
        say(ray_cluster.connecting(ray_address))
    started = ray_cluster.connect(ray_address)
    try:
        ray_cluster.check_store_reach(spec, ray_address)
        if started:
            say(f"ray: {ray_cluster.describe(ray_address, started)}")
        yield from on_ray.iter_ray(
            make_agent,
            spec,
            items,
            max_in_flight=max_in_flight or ray_cluster.default_in_flight(),
            max_retries=max_retries,
            cancel=cancel,
            ray_options=ray_options or {},
            lease=lease,
            on_start=on_start,
            on_end=on_end,
            on_status=on_status,
            make_deps=make_deps,
        )
    finally:
        if started:
            ray_cluster.disconnect()


def run_batch(
    make_agent: AgentFactory,
    inputs: Iterable[str | Mapping[str, Any]],
    *,
    store: StoreSpec | Store,
    executor: Executor = "ray",
    ray_address: str | None = None,
    max_retries: int = 3,
    progress: bool | IO[str] = True,
    max_in_flight: int | None = None,
    cancel: CancelToken | None = None,
    ray_options: Mapping[str, Any] | None = None,
    lease: float = DEFAULT_LEASE,
    deps: Any = None,
    make_deps: DepsFactory | None = None,
) -> list[RunResult]:
    """Run every input to its end and return one ``RunResult`` per input, in input order.

    ``make_agent`` is a picklable callable with no arguments returning an
    ``Agent``; it is called for each run where the run executes.  ``inputs``
    are strings or dicts ``{"input": ..., "run_id": ...}``; without a run id,
    one is derived from the position and the text, so running the same batch
    again returns the runs that ended from ``store`` (no model call) and
    resumes the others.  ``store`` is a SQLite file path, a store URL, or
    (``executor="local"`` only, or a ``SqliteStore``) a store object.

    ``executor="ray"`` runs them on a pool of long-lived Ray actors, one
    per CPU of the cluster, each opening the store once (PostgreSQL: a pool
    of at most ``ceil(max_in_flight / actors)`` connections) and running
    its share of the runs at once on the async driver; a run whose actor
    dies is submitted again, up to ``max_retries`` times, on the Ray this process is
    connected to, else on ``ray_address``: ``None`` starts a local Ray
    instance for the batch (even if a cluster is running), ``"auto"`` joins
    the running cluster (``RAY_ADDRESS``, else the last ``ray start``),
    ``HOST:PORT`` that one.  ``executor="local"`` runs them in this process
    on the async driver.
    ``max_in_flight`` bounds the runs at once (Ray: the cluster's CPUs x 4;
    local: 64).  ``cancel`` stops the batch: runs in flight stop at their
    next check, runs not begun end ``cancelled`` without starting.
    ``progress`` draws a bar on stderr (or on the stream given), after a
    line saying how Ray starts (a local instance, or the cluster joined).
    ``ray_options`` go to each actor's ``.options()`` (``num_cpus``, default 1, ...).
    ``lease`` is how long a worker's hold on a run outlives its last
    transition: a retry waits that long at most for a dead worker's run.
    A run another owner holds (a dead worker's, a crashed driver's) waits
    in line, not in a slot: it is tried again once that lease lapses,
    while the other runs go on.

    The runs' tools get deps (``RunContext.deps``): ``deps=`` one object
    shared by every run (``executor="local"`` only: Ray workers are other
    processes), or ``make_deps=`` a function of the ``BatchItem`` called for
    each run where it executes; on Ray each worker calls it, so it must
    pickle but the deps it returns need not.  A run resumed by a later pass
    is given its deps again the same way.
    """
    items = _check(make_agent, inputs, executor, max_retries, max_in_flight, cancel)
    _check_store(store)
    deps_for = _deps_for(deps, make_deps, executor)
    results: dict[int, RunResult] = {}
    tally = Tally(len(items))
    bar = None if progress is False else Bar(tally, None if progress is True else progress)
    try:
        finished = _iter(
            make_agent,
            items,
            store,
            executor,
            ray_address,
            max_retries,
            max_in_flight,
            cancel,
            ray_options,
            lease,
            tally.start,
            tally.end,
            None if bar is None else bar.say,
            deps_for,
        )
        for item, result in finished:
            results[item.index] = result
            if bar is not None:
                bar.update(result)
            else:
                tally.finish(result)
    finally:
        if bar is not None:
            bar.close()
    return [results[index] for index in range(len(items))]


def _check(
    make_agent: object,
    inputs: Iterable[str | Mapping[str, Any]],
    executor: str,
    max_retries: int,
    max_in_flight: int | None,
    cancel: object,
) -> list[BatchItem]:
    if not callable(make_agent):
        msg = f"make_agent must be a callable with no arguments returning an Agent, got {type(make_agent).__name__}"
        raise TypeError(msg)
    if executor not in ("ray", "local"):
        msg = f"executor must be 'ray' or 'local', got {executor!r}"
        raise ValueError(msg)
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        msg = f"max_retries must be an integer >= 0, got {max_retries!r}"
        raise ValueError(msg)
    if max_in_flight is not None and (
        isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1
    ):
        msg = f"max_in_flight must be None or an integer >= 1, got {max_in_flight!r}"
        raise ValueError(msg)
    if cancel is not None and not isinstance(cancel, CancelToken):
        msg = f"cancel must be a CancelToken, got {type(cancel).__name__}"
        raise TypeError(msg)
    return batch_items(inputs)


def _deps_for(deps: Any, make_deps: DepsFactory | None, executor: str) -> DepsFactory | None:
    """Each run's deps as one function of its item: ``make_deps``, or one returning the shared ``deps``."""
    if make_deps is not None and not callable(make_deps):
        msg = f"make_deps must be a function of a BatchItem returning the run's deps, got {type(make_deps).__name__}"
        raise TypeError(msg)
    if deps is None:
        return make_deps
    if make_deps is not None:
        msg = "give deps= (one object for every run) or make_deps= (one per run), not both"
        raise ValueError(msg)
    if executor == "ray":
        msg = (
            "deps= is one object in this process, which Ray workers cannot share: pass make_deps=, "
            "a function of the BatchItem each worker calls to build its runs' deps"
        )
        raise TypeError(msg)
    return lambda _: deps


def _is_store(store: object) -> bool:
    return not isinstance(store, str | os.PathLike)


def _check_store(store: object) -> None:
    """``store`` is a path, a URL or a store object, whichever the executor; refused before any run if not.

    Without this a local batch would hand ``None`` (or any object) to each
    run, and every input would end an ``error`` result of the same mistake.
    """
    if _is_store(store):
        check_store(store, given_as="a SQLite file path, a store URL or a store object (wants, save, load)")


def _spec_for_workers(store: StoreSpec | Store) -> str:
    """What Ray workers open: a path or URL as given, or a ``SqliteStore``'s ``path``.

    Each worker opens the store again (``open_store``), so a store object
    works only if it is a kind a path names: any other has no path to give.
    """
    if not _is_store(store):
        return absolute(store)  # type: ignore[arg-type]  # _is_store said it is a path or URL
    if isinstance(store, SqliteStore):
        return absolute(store.path)
    msg = f"executor='ray' needs the store's path or URL, which each worker opens; {type(store).__name__} has neither"
    raise TypeError(msg)


def _close(store: Opened) -> None:
    with contextlib.suppress(Exception):
        store.close()
