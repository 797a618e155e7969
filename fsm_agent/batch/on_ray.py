"""The Ray executor: a pool of long-lived Ray actors, each running many runs at once on its event loop.

Ray gives what a home-made pool would not: placement over a cluster,
restarts of workers whose process or node was lost, and cancellation.  Each
actor of the pool opens the store once (for PostgreSQL, one connection pool
of at most ``runs_per_actor`` connections: see ``PoolWorker``) and drives its
runs with the async driver, as the local executor does in one process, so a
run costs about what it costs there instead of a Ray task, a worker hop and
a store opened per task.  The run's own durability comes from the store: a
run whose actor died is submitted again (up to ``max_retries`` times) to
the restarted actor, which reads the last checkpoint, so completed model and
tool calls are not made again.  An actor that died takes no run until it
answers again: a restart takes seconds on a busy machine, and a run sent to
an actor still restarting is refused, which must not count against its
retries.  A run never sleeps on another owner's lease
(a dead worker's, a crashed driver's): it returns at once, and is submitted
again once that lease has lapsed, while other runs use the slot.  Joining
Ray and sizing the pool are ``ray_cluster``'s, each actor's share of the
runs and its restarts ``ray_slots``'; ``ray`` is imported only by these
modules, and only when a batch asks for it.
"""

from __future__ import annotations

import functools
import heapq
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from fsm_agent.batch.items import BatchItem
from fsm_agent.batch.ray_cluster import pool_size
from fsm_agent.batch.ray_pool import PoolWorker, Switch, ray_module
from fsm_agent.batch.ray_slots import Slots
from fsm_agent.batch.worker import (
    AgentFactory,
    DepsFactory,
    Later,
    Patience,
    agent_of,
    error_result,
    failed_result,
    open_store,
    unstarted,
)
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.drivers.read_back import stored_result
from fsm_agent.records import RunResult

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent

ACTOR_CPUS = 1.0
"""CPUs each actor of the pool asks Ray for, unless ``ray_options`` says ``num_cpus``: one core runs its event loop."""

_POLL = 0.2
"""Seconds between looks at the cancel token while every run in flight is still working."""

GRACE = 10.0
"""Seconds the runs in flight get, once the batch is cancelled, to reach their next check and stop there."""


_DRAIN = 10.0
"""Seconds to wait, after cancelling tasks outright, for them to end (each has its last checkpoint already)."""

Finished = tuple[BatchItem, RunResult]

_NO_WORKER = "every worker of the batch died and Ray restarted none of them"

_remotes: dict[str, Any] = {}


def _remote(name: str, what: Any) -> Any:
    """``ray.remote(what)``, built once per process: Ray exports a function or class to the workers once."""
    made = _remotes.get(name)
    if made is None:
        made = _remotes[name] = ray_module().remote(what)
    return made


def iter_ray(
    make_agent: AgentFactory,
    spec: str,
    items: list[BatchItem],
    *,
    max_in_flight: int,
    max_retries: int,
    cancel: CancelToken | None,
    ray_options: Mapping[str, Any],
    lease: float,
    on_start: Callable[[BatchItem], None] | None = None,
    on_worker: Callable[[BatchItem, int], None] | None = None,
    actors: int | None = None,
    on_status: Callable[[str], None] | None = None,
    make_deps: DepsFactory | None = None,
    on_end: Callable[[BatchItem], None] | None = None,
) -> Iterator[Finished]:
    """Yield ``(item, result)`` as runs finish, keeping at most ``max_in_flight`` runs submitted to the pool.

    The pool is ``actors`` actors (default ``pool_size``), each with up to
    ``ceil(max_in_flight / actors)`` runs at once; a run goes to the actor
    with the fewest.  ``ray_options`` go to each actor's ``.options()``.  An
    actor that dies is restarted by Ray; the runs it had in flight are
    submitted again, each up to ``max_retries`` times, and resume from their
    checkpoints (once the dead actor's leases have lapsed).  A dead actor gets
    no run until it answers again (however long its restart takes); its
    share waits for it or goes to the others.
    ``on_start`` and ``on_end`` are called as a run is submitted to an
    actor and as its task comes back (ended, back in line on another
    owner's lease, or lost with its actor and sent again, which calls
    ``on_start`` again), so a progress display counts the runs in flight as
    the pool holds them; ``on_end`` comes before the run's result is
    yielded.  ``on_worker(item, pid)`` is told which process ran each
    attempt; ``on_status`` a line saying how many workers start.
    ``make_deps`` is shipped to each actor, which calls it for each of its
    runs.

    On ``cancel`` (or leaving the loop, or Ctrl-C), no new run is submitted
    and each run in flight is told to stop at its next check; one still
    busy after ``GRACE`` seconds has its call cancelled, stays at its last
    checkpoint and is reported ``cancelled`` with that snapshot.  The next
    pass over the batch resumes them all.
    """
    if cancel is not None and cancel.cancelled:
        # Cancelled before it began: looked at before the first round is sent (``batch.submit`` below), so every
        # run ends unstarted, as on the local executor, and no pool is started.
        yield from unstarted(items, cancel.why)
        return
    ray = ray_module()
    size = actors or pool_size(max_in_flight, len(items))
    runs = math.ceil(max_in_flight / size)
    options = {
        "num_cpus": ACTOR_CPUS,
        **ray_options,
        "max_restarts": -1,  # each run's retries are counted here: a dead actor comes back for the others
        "max_task_retries": 0,
        "max_concurrency": runs + 2,
    }
    if on_status is not None:
        on_status(
            f"ray: starting {size} worker{'' if size == 1 else 's'}, {runs} run{'' if runs == 1 else 's'} at once each"
        )
    name = f"fsm_agent-switch-{uuid.uuid4().hex}"  # the pool's actors find it by name (see PoolWorker)
    switch = _remote("switch", Switch).options(num_cpus=0, name=name).remote()
    pool = [_remote("pool", PoolWorker).options(**options).remote(make_agent, spec, lease, runs, name, make_deps)
            for _ in range(size)]  # fmt: skip
    batch = _Pass(ray, Slots(ray, pool, runs), items, spec, make_agent, max_in_flight, max_retries,
                  on_start=on_start, on_end=on_end)  # fmt: skip
    try:
        batch.submit()
        while batch.going():
            yield from batch.orphaned()
            if cancel is not None and cancel.cancelled and not batch.why:
                batch.stop(cancel.why or "cancelled")
                switch.cancel.remote(batch.why)
            batch.force_after_grace()
            yield from batch.stopped()
            for ref in batch.ready():
                yield from batch.settle(ref, on_worker)
            if not batch.why:
                batch.submit()
        yield from batch.left()
    finally:
        try:
            if batch.pending:
                switch.cancel.remote("the batch was interrupted")
                _, late = ray.wait(list(batch.pending), num_returns=len(batch.pending), timeout=GRACE)
                for ref in late:
                    ray.cancel(ref)
                ray.wait(late, num_returns=len(late), timeout=_DRAIN)
        finally:
            batch.let_go()
        ray.wait([worker.close.remote() for worker in pool], num_returns=len(pool), timeout=_DRAIN)
        for worker in [*pool, switch]:
            ray.kill(worker)


class _Pass:
    """One pass over a batch's runs on the pool: what is in flight, what waits and why, and what a cancel stopped.

    ``iter_ray``'s loop asks it, in order, for the runs no worker is left
    for, the runs a cancel stopped, the answers that came back; each is
    yielded as ``(item, result)`` as it is settled.
    """

    def __init__(
        self,
        ray: Any,
        slots: Slots,
        items: list[BatchItem],
        spec: str,
        make_agent: AgentFactory,
        max_in_flight: int,
        max_retries: int,
        *,
        on_start: Callable[[BatchItem], None] | None = None,
        on_end: Callable[[BatchItem], None] | None = None,
    ) -> None:
        self._ray, self._slots, self._spec = ray, slots, spec
        # Told of each run as it is submitted to an actor (again after a lease lapsed or its actor died), and as
        # its task comes back or is let go, before its result is yielded: the runs in flight are those between.
        self._on_start, self._on_end = on_start, on_end
        self._max_in_flight, self._max_retries = max_in_flight, max_retries
        self._reader = functools.cache(make_agent)  # the agent cancelled runs are read back under: made once, if ever
        self.pending: dict[Any, tuple[BatchItem, int]] = {}
        """The tasks in flight: each one's item and the slot of the actor running it."""
        self._deaths: dict[int, int] = {}
        self._waiting = deque(items)
        # Runs another owner holds, put back until their leases lapse: (retry at, index, item, give up).
        self._later: list[tuple[float, int, BatchItem, Patience]] = []
        # Runs whose actor died, to submit again at once.
        self._again: list[BatchItem] = []
        self.why = ""
        """Why the batch was cancelled; empty while it goes on."""
        self._stopped_at, self._forced = 0.0, False

    def going(self) -> bool:
        """Whether a run is still in flight, put back, or waiting for a live worker."""
        return bool(
            self.pending or self._later or self._again or (self._waiting and not self.why and not self._slots.gone())
        )

    def submit(self) -> None:
        """Fill the free slots: first the runs whose actor died, then those whose lease lapsed, then new ones."""
        while len(self.pending) < self._max_in_flight and self._slots.up():
            if self._again:
                self._send(self._again.pop(), None)
            elif self._later and self._later[0][0] <= time.time():
                _, _, due, patience = heapq.heappop(self._later)
                self._send(due, patience)
            elif self._waiting:
                self._send(self._waiting.popleft(), None)
            else:
                return

    def _send(self, item: BatchItem, patience: Patience | None) -> None:
        if self._on_start is not None:
            self._on_start(item)
        ref, slot = self._slots.send(item, patience)
        self.pending[ref] = (item, slot)

    def _returned(self, ref: Any) -> tuple[BatchItem, int]:
        """The run whose task ``ref`` came back (or was let go), out of flight: ``on_end`` told before anything else."""
        item, slot = self.pending.pop(ref)
        if self._on_end is not None:
            self._on_end(item)
        return item, slot

    def let_go(self) -> None:
        """The batch was left: the tasks still pending are out of flight, stopped, cancelled or abandoned."""
        for ref in list(self.pending):
            self._returned(ref)

    def orphaned(self) -> Iterator[Finished]:
        """Every worker died for good: the runs put back end as errors saying so."""
        if not self.why and (self._again or self._later) and self._slots.gone():
            for item in [*self._again, *(entry[2] for entry in sorted(self._later))]:
                yield item, error_result(item, RuntimeError(_NO_WORKER))
            self._again.clear()
            self._later.clear()

    def stop(self, why: str) -> None:
        """The batch was cancelled (``why``): no new run is sent, and the grace period starts."""
        self.why, self._stopped_at = why, time.monotonic()

    def force_after_grace(self) -> None:
        """Once the grace period is over, cancel every task still in flight outright."""
        if self.why and not self._forced and time.monotonic() - self._stopped_at > GRACE:
            self._forced = True
            for ref in self.pending:
                self._ray.cancel(ref)

    def stopped(self) -> Iterator[Finished]:
        """After a cancel, the runs put back end: ``cancelled``, at their last checkpoint if they had one."""
        if self.why and (self._later or self._again):
            for _, _, item, _ in sorted(self._later):
                yield item, failed_result(item, "cancelled", why=self.why, leased=True)
            for item in self._again:
                yield _checkpoint(item, self._spec, self.why, self._reader)
            self._later.clear()
            self._again.clear()

    def ready(self) -> list[Any]:
        """The tasks and pings that came back, waiting up to ``_POLL`` seconds for the first."""
        ray, slots = self._ray, self._slots
        slots.ask()
        if self.pending or slots.pings:
            watched = [*self.pending, *slots.pings]
            ready, _ = ray.wait(watched, num_returns=1, timeout=_POLL)
            if ready:
                ready, _ = ray.wait(watched, num_returns=len(watched), timeout=0)
            return list(ready)
        if self._later and not self._again and slots.up():  # only runs on another owner's lease: until one lapses
            time.sleep(min(_POLL, max(self._later[0][0] - time.time(), 0.0)))
        else:  # runs waiting for a dead actor to come back, none being asked just now: ask again shortly
            time.sleep(_POLL)
        return []

    def settle(self, ref: Any, on_worker: Callable[[BatchItem, int], None] | None) -> Iterator[Finished]:
        """What came back for ``ref``: a ping, a result, a run to send again, or one put back until a lease lapses."""
        if ref in self._slots.pings:
            self._slots.answered(ref)
            return
        item, slot = self._returned(ref)
        self._slots.returned(slot)
        got = _collect(self._ray, ref, item, self._spec, self.why, on_worker, self._reader)
        if got is None:  # its actor died: again, unless that was its last retry
            self._slots.fell(slot)
            deaths = self._deaths[item.index] = self._deaths.get(item.index, 0) + 1
            if self.why:
                yield _checkpoint(item, self._spec, self.why, self._reader)
            elif deaths > self._max_retries:
                yield item, error_result(item, RuntimeError(f"its worker died {deaths} times"))
            else:
                self._again.append(item)
        elif isinstance(got, Later):
            if self.why:
                yield item, failed_result(item, "cancelled", why=self.why, leased=True)
            else:  # leased elsewhere: the slot goes to the next run, this one comes back when the lease lapses
                heapq.heappush(self._later, (got.at, item.index, item, got.patience))
        else:
            yield item, got

    def left(self) -> Iterator[Finished]:
        """The runs never sent: ``cancelled`` (not started) after a cancel, else errors: no worker was left."""
        for item in self._waiting:
            if self.why:
                yield item, failed_result(item, "cancelled", why=self.why, started=False)
            else:
                yield item, error_result(item, RuntimeError(_NO_WORKER))


def _collect(
    ray: Any,
    ref: Any,
    item: BatchItem,
    spec: str,
    why: str,
    on_worker: Callable[[BatchItem, int], None] | None,
    make_agent: AgentFactory,
) -> RunResult | Later | None:
    """The attempt's result (or ``Later``); ``None`` if its actor died; a cancelled one its stored checkpoint."""
    try:
        result, pid = ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        return _checkpoint(item, spec, why, make_agent)[1]
    except ray.exceptions.RayActorError:
        return None
    except ray.exceptions.RayError as exc:  # Ray itself failed: the run's result says so
        return error_result(item, exc)
    if on_worker is not None:
        on_worker(item, pid)
    got: RunResult | Later = result
    return got


def _checkpoint(item: BatchItem, spec: str, why: str, make_agent: AgentFactory) -> Finished:
    """A cancelled attempt's run as its last checkpoint says: reason ``cancelled`` if it was cut off, else its own.

    Read back under the batch's agent, made here by ``make_agent``, so the
    result keeps what a worker's would (the cost, the typed output).  A
    factory that fails in this process (a package only the workers have)
    never costs the batch or the report: the run is read under the default
    table (every table has the same states), its evidence saying why
    (``agent_error``); only a ``Done`` run's typed output is then missing.
    """
    store = open_store(spec)
    try:
        data = store.load(item.run_id)
    except KeyError:
        return item, failed_result(item, "cancelled", why=why, started=False)
    finally:
        store.close()
    agent: Agent | None = None
    facts: dict[str, str] = {}
    try:
        agent = agent_of(make_agent)
    except Exception as exc:  # noqa: BLE001 - a batch never raises for one run: the error is in that run's result
        facts["agent_error"] = f"{type(exc).__name__}: {exc}"
    if data["state"] in ("Done", "Failed") or data.get("paused"):
        return item, stored_result(agent, data, **facts)  # it ended before the cancel reached it: as it ended
    return item, stored_result(agent, data, "cancelled", why=why, state=data["state"], **facts)
