"""The workers of a batch on Ray: the pool's long-lived actors, and the switch that stops a batch.

Kept apart from the executor (``on_ray``) that places runs on them; ``ray``
is imported only when a batch asks for it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fsm_agent import persist
from fsm_agent.batch.items import BatchItem
from fsm_agent.batch.worker import (
    AgentFactory,
    DepsFactory,
    Later,
    Opened,
    Patience,
    atry_item,
    blocking_calls,
    error_result,
    is_sqlite,
    left_result,
)
from fsm_agent.core.cancellation import CancelToken
from fsm_agent.records import RunResult

_LISTEN = 1.0
"""Seconds between a task's looks at its batch's switch: how soon a run in flight hears of a cancel."""


def ray_module() -> Any:
    try:
        import ray  # optional: only a batch on Ray needs it
    except ImportError as exc:
        msg = "executor='ray' needs Ray: pip install 'fsm-agent[ray]' (or use executor='local')"
        raise ImportError(msg) from exc
    return ray


class Switch:
    """One per batch, as a Ray actor: set once to stop the batch; every actor of the pool listens to it."""

    def __init__(self) -> None:
        self.why: str | None = None

    def cancel(self, why: str) -> None:
        """Stop the batch: each run in flight stops at its next check."""
        self.why = why

    def state(self) -> str | None:
        """Why the batch was stopped, or ``None`` while it goes on."""
        return self.why


def pool_store(spec: str, lease: float, runs: int) -> Opened:
    """The store one actor opens, once: for PostgreSQL a pool of at most ``runs`` connections (``max_size``).

    An actor's runs share it.  PostgreSQL's ``max_size`` bounds each of the
    store's two pools: the async one the actor's runs checkpoint through
    (at most one connection per run in flight, so ``runs``), and the sync
    one that loads and claims a run as it starts, from the actor's one
    thread (one or two connections in practice).
    """
    if is_sqlite(spec):
        return persist.open_store(spec, lease=lease)
    return persist.open_store(spec, lease=lease, max_size=max(runs, 1))


class PoolWorker:
    """One long-lived worker of a batch's pool (an async Ray actor): one store, up to ``runs`` runs at once.

    The runs share the actor's event loop, its store and a cancel token the
    batch's ``Switch`` sets: a run told to stop this way ends
    ``Failed``/``cancelled`` at its next check, checkpointed and with its
    lease given up, so the next pass over the batch resumes it at once.
    """

    def __init__(
        self,
        make_agent: AgentFactory,
        spec: str,
        lease: float,
        runs: int,
        switch: str,
        make_deps: DepsFactory | None = None,
    ) -> None:
        self.make_agent = make_agent
        self.make_deps = make_deps  # called here for each run: deps are built where they are used, never pickled
        self.spec = spec
        self.lease = lease
        self.runs = runs
        # The switch by its actor name, looked up when first listened to: a handle passed to the constructor is
        # an object Ray cannot rebuild for a restart (ray-project/ray#53727), and it warns of it for each actor.
        self.switch = switch
        self.token = CancelToken()
        self.store: Opened | None = None
        self.listener: asyncio.Task[None] | None = None

    async def run(self, item: BatchItem, patience: Patience | None = None) -> tuple[RunResult | Later, int]:
        """One attempt at ``item`` here: its result (or ``Later``: leased elsewhere), and this process's id."""
        if self.listener is None:  # this actor's first run
            asyncio.get_running_loop().set_default_executor(blocking_calls(self.runs))
            self.listener = asyncio.ensure_future(self._listen())
        try:
            if self.store is None:
                self.store = pool_store(self.spec, self.lease, self.runs)
        except Exception as exc:  # noqa: BLE001 - a store this worker cannot open is this run's result, not a crash
            return error_result(item, exc), os.getpid()
        try:
            outcome = await atry_item(self.make_agent, self.store, item, self.token, patience, self.make_deps)
        except (KeyboardInterrupt, SystemExit) as exc:
            # Raised out of this task it would end the actor's event loop, and every run on it would hang.
            return left_result(item, exc), os.getpid()
        return outcome, os.getpid()

    async def ready(self) -> int:
        """This process's id: the pool asks a restarted actor, before it sends the actor runs again."""
        return os.getpid()

    async def _listen(self) -> None:
        ray = ray_module()
        try:
            switch = ray.get_actor(self.switch)
        except ValueError:
            return  # the batch is over (its switch is gone): nothing left to listen for
        while not self.token.cancelled:
            await asyncio.sleep(_LISTEN)
            try:
                why = await switch.state.remote()
            except ray.exceptions.RayError:
                return  # as above
            if why is not None:
                self.token.cancel(why)

    async def close(self) -> None:
        """Give up the store's connections before the actor is killed."""
        if self.listener is not None:
            self.listener.cancel()
        store, self.store = self.store, None
        if store is not None:
            await store.aclose()
            await asyncio.to_thread(store.close)
