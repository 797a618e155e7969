"""The Ray executor: each run a Ray task, retried by Ray when its worker dies, resumed from the store when retried.

Ray gives what a home-made pool would not: placement over a cluster,
retries of tasks whose worker process or node was lost (``max_retries``),
and cancellation.  The run's own durability comes from the store: the retry
reads the last checkpoint, so completed model and tool calls are not made
again.  A task never sleeps on another owner's lease (a dead worker's, a
crashed driver's): it returns at once, and the run is submitted again
once that lease has lapsed, while other runs use the slot.  ``ray`` is
imported only here, and only when a batch asks for it.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fsm_agent.batch.items import BatchItem
from fsm_agent.batch.worker import (
    AgentFactory,
    Later,
    error_result,
    failed_result,
    is_sqlite,
    open_store,
    store_at,
    stored_result,
    try_item,
)
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.records import RunResult

RUNS_PER_CPU = 4
"""Runs per CPU: a run mostly waits on its model, so each task asks Ray for a quarter of a CPU."""

_POLL = 0.2
"""Seconds between looks at the cancel token while every run in flight is still working."""

GRACE = 10.0
"""Seconds the runs in flight get, once the batch is cancelled, to reach their next check and stop there."""

_LISTEN = 1.0
"""Seconds between a task's looks at its batch's switch: how soon a run in flight hears of a cancel."""

_DRAIN = 10.0
"""Seconds to wait, after cancelling tasks outright, for them to end (each has its last checkpoint already)."""

Finished = tuple[BatchItem, RunResult]


def _ray() -> Any:
    try:
        import ray  # optional: only a batch on Ray needs it
    except ImportError as exc:
        msg = "executor='ray' needs Ray: pip install 'fsm-agent[ray]' (or use executor='local')"
        raise ImportError(msg) from exc
    return ray


def connect(address: str | None) -> bool:
    """Join Ray at ``address`` (``None``: start a local instance with this machine's cores); True if we started it.

    ``None`` always starts an instance of its own: ``ray.init()`` without an
    address would join whatever cluster the machine runs (``RAY_ADDRESS``,
    the last ``ray start``), which nobody asked for.  Joining one is asked
    for by name: ``"auto"`` (that same search, an error if it finds none) or
    ``HOST:PORT``, ``ray://HOST:PORT``.  A process already connected to Ray
    (``ray.init`` called by the user, or by a test session) is used as it
    is and left running.
    """
    ray = _ray()
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if address is None or address == "local":
        # Workers' own output would scroll the progress bar away; their logs stay in Ray's session directory.
        options["log_to_driver"] = False
    ray.init(address="local" if address is None else address, **options)
    return True


def describe(address: str | None, started: bool) -> str:
    """Which Ray the batch runs on, in words: the instance started for it or the cluster joined, and its CPUs."""
    ray = _ray()
    try:
        where = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - a client connection (ray://) may not know it: the address given says where
        where = address or "an unknown address"
    cpus = f"{int(ray.cluster_resources().get('CPU', 0))} CPUs"
    if started and address in (None, "local"):
        return f"started a local Ray instance at {where} ({cpus}); it stops when the batch ends"
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    joined = "joined the Ray cluster" if started else "using the Ray cluster this process is connected to"
    return f"{joined} at {where} ({nodes} node{'' if nodes == 1 else 's'}, {cpus})"


def disconnect() -> None:
    """Stop the Ray instance ``connect`` started."""
    _ray().shutdown()


def check_store_reach(spec: str, address: str | None) -> None:
    """Refuse a SQLite store on a cluster of several machines: the other machines cannot reach the file."""
    if not is_sqlite(spec):
        return
    ray = _ray()
    if address is not None and address.startswith("ray://"):
        msg = (
            f"store {spec!r} is a SQLite file, which workers on a Ray cluster reached through {address} cannot "
            "open; use a PostgreSQL store (postgresql://...) or executor='local'"
        )
        raise ValueError(msg)
    here = ray.util.get_node_ip_address()
    hosts = sorted({node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")})
    if any(host != here for host in hosts):
        msg = (
            f"store {spec!r} is a SQLite file on this machine, but the Ray cluster spans {', '.join(hosts)}; "
            "use a PostgreSQL store (postgresql://...) that every node can reach"
        )
        raise ValueError(msg)


def default_in_flight() -> int:
    """The cluster's CPUs times ``RUNS_PER_CPU``: as many runs as the cluster will place at once."""
    cpus = _ray().cluster_resources().get("CPU", 1)
    return max(int(cpus * RUNS_PER_CPU), 1)


class Switch:
    """One per batch, as a Ray actor: set once to stop the batch; every task of the batch listens to it."""

    def __init__(self) -> None:
        self.why: str | None = None

    def cancel(self, why: str) -> None:
        """Stop the batch: each run in flight stops at its next check."""
        self.why = why

    def state(self) -> str | None:
        """Why the batch was stopped, or ``None`` while it goes on."""
        return self.why


def run_task(
    make_agent: AgentFactory,
    spec: str,
    lease: float,
    item: BatchItem,
    switch: Any,
    give_up: float | None = None,
) -> RunResult | Later:
    """The body of one Ray task: the store opened once per worker process, the run stopped by the batch's switch.

    A run told to stop this way ends ``Failed``/``cancelled`` at its next
    check, checkpointed and with its lease given up, so the next pass over
    the batch resumes it at once.  A run another owner holds is ``Later``
    at once: the driver submits it again when that lease lapses.
    """
    ray = _ray()
    try:
        store = store_at(spec, lease)
    except Exception as exc:  # noqa: BLE001 - a store this worker cannot open is this run's result, not a crash
        return error_result(item, exc)
    token, finished = CancelToken(), threading.Event()

    def listen() -> None:
        while not finished.wait(_LISTEN):
            try:
                why = ray.get(switch.state.remote())
            except ray.exceptions.RayError:
                return  # the batch is over (its switch is gone): nothing left to listen for
            if why is not None:
                token.cancel(why)
                return

    threading.Thread(target=listen, name="fsm_agent-batch-switch", daemon=True).start()
    try:
        return try_item(make_agent, store, item, token, give_up)
    finally:
        finished.set()


_remotes: dict[str, Any] = {}


def _remote(name: str, what: Any) -> Any:
    """``ray.remote(what)``, built once per process: Ray exports a function or class to the workers once."""
    made = _remotes.get(name)
    if made is None:
        made = _remotes[name] = _ray().remote(what)
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
) -> Iterator[Finished]:
    """Yield ``(item, result)`` as tasks finish, keeping at most ``max_in_flight`` tasks submitted.

    On ``cancel`` (or leaving the loop, or Ctrl-C), no new task is submitted
    and each run in flight is told to stop at its next check; one still
    busy after ``GRACE`` seconds has its task cancelled, stays at its last
    checkpoint and is reported ``cancelled`` with that snapshot.  The next
    pass over the batch resumes them all.
    """
    ray = _ray()
    options = {"num_cpus": 1 / RUNS_PER_CPU, **ray_options, "max_retries": max_retries, "retry_exceptions": False}
    task = _remote("task", run_task).options(**options)
    switch = _remote("switch", Switch).options(num_cpus=0).remote()
    factory = ray.put(make_agent)
    pending: dict[Any, BatchItem] = {}
    waiting = iter(items)
    # Runs another owner holds, put back until their leases lapse: (retry at, index, item, give up).
    later: list[tuple[float, int, BatchItem, float]] = []
    why = ""
    stopped_at, forced = 0.0, False

    def submit() -> None:
        while len(pending) < max_in_flight:
            if later and later[0][0] <= time.time():
                _, _, again, give_up = heapq.heappop(later)  # due again: no on_start, it was counted once
                pending[task.remote(factory, spec, lease, again, switch, give_up)] = again
                continue
            item = next(waiting, None)
            if item is None:
                return
            if on_start is not None:
                on_start(item)
            pending[task.remote(factory, spec, lease, item, switch)] = item

    try:
        submit()
        while pending or later:
            if cancel is not None and cancel.cancelled and not why:
                why = cancel.why or "cancelled"
                switch.cancel.remote(why)
                stopped_at = time.monotonic()
            if why and not forced and time.monotonic() - stopped_at > GRACE:
                forced = True
                for ref in pending:
                    ray.cancel(ref)
            if why and later:
                for _, _, item, _ in sorted(later):
                    yield item, failed_result(item, "cancelled", why=why, leased=True)
                later.clear()
            if pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL)
                if ready:
                    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            else:
                ready = []
                if later:  # only runs waiting on another owner's lease: wait for the first to lapse
                    time.sleep(min(_POLL, max(later[0][0] - time.time(), 0.0)))
            for ref in ready:
                item = pending.pop(ref)
                got = _collect(ray, ref, item, spec, why)
                if isinstance(got, Later):
                    if why:
                        yield item, failed_result(item, "cancelled", why=why, leased=True)
                    else:  # leased elsewhere: the slot goes to the next run, this one comes back when the lease lapses
                        heapq.heappush(later, (got.at, item.index, item, got.give_up))
                else:
                    yield item, got
            if not why:
                submit()
        for item in waiting:
            yield item, failed_result(item, "cancelled", why=why, started=False)
    finally:
        if pending:
            switch.cancel.remote("the batch was interrupted")
            _, late = ray.wait(list(pending), num_returns=len(pending), timeout=GRACE)
            for ref in late:
                ray.cancel(ref)
            ray.wait(late, num_returns=len(late), timeout=_DRAIN)
        ray.kill(switch)


def _collect(ray: Any, ref: Any, item: BatchItem, spec: str, why: str) -> RunResult | Later:
    """The task's result (or ``Later``); a cancelled task becomes its stored checkpoint, a lost one an ``error``."""
    try:
        result: RunResult | Later = ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        return _checkpoint(item, spec, why)
    except ray.exceptions.RayError as exc:
        # Retries exhausted (the worker kept dying) or Ray itself failed: the run's result says so.
        return error_result(item, exc)
    return result


def _checkpoint(item: BatchItem, spec: str, why: str) -> RunResult:
    """A cancelled task's run as its last checkpoint says, with reason ``cancelled``."""
    store = open_store(spec)
    try:
        data = store.load(item.run_id)
    except KeyError:
        return failed_result(item, "cancelled", why=why, started=False)
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return stored_result(data, "cancelled", why=why, state=data["state"])
