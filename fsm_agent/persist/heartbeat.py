"""The heartbeat of a call in flight: a stored run's lease follows its owner, not the slowest call.

While a model or tool call is in flight the driver starts a heartbeat
(``beat``: a daemon thread; ``abeat``: a task) that renews the lease every
third of it until the call returns (``rest``), so a lease needs to outlast a
pause of the owner, not the slowest call, and a dead owner's run is free a
lease after its last beat.  Each renewal is fenced like every write
(``keep``: still this owner's, at the version it last wrote), so it can
never take back a run somebody else took over; a refused one is kept in
``lost`` and raised by the run's next write, which therefore never happens.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from fsm_agent.errors import RunLeasedError
from fsm_agent.persist.store import FullStore, JournaledStore, Store, Traits

logger = logging.getLogger("fsm_agent")


class Heartbeats:
    """The lease-keeping half of a ``Journal``: renewals while a call is in flight, and refusals kept for later."""

    store: Store
    journaled: JournaledStore | None
    traits: Traits
    run_id: str
    owner: str
    full: bool
    lease: float
    seq: int
    _renew_at: float
    _due: float  # when the async heartbeat is due to wake next (monotonic)
    _beat: CallInFlight | asyncio.Task[None] | None
    _beater: HeartbeatThread | None
    _beat_lock: threading.Lock
    lost: RunLeasedError | KeyError | None

    def beat(self) -> None:
        """A call is starting: renew the lease every third of a lease until ``rest`` (from this run's daemon thread).

        The thread is started at the run's first call and kept between calls
        (a call costs two flag changes, no thread start); it ends when the
        run gives its lease up, or once no call was in flight for a lease.
        """
        if self.full and self._beat is None:
            with self._beat_lock:
                self._beat = CallInFlight(self.seq)
                if self._beater is None:
                    self._beater = HeartbeatThread(self._beating, _beat_name(self.run_id))

    def abeat(self) -> None:
        """``beat`` for the async driver: a task on the running loop renews the lease until ``rest``."""
        if self.full and self._beat is None:
            self._due = max(self._renew_at, time.monotonic())
            self._beat = asyncio.get_running_loop().create_task(self._abeating(), name=_beat_name(self.run_id))

    def rest(self) -> None:
        """The call returned (or was abandoned): no renewal is made for it, nor a refusal of one kept, after this."""
        beat = self._beat
        if isinstance(beat, asyncio.Task):
            self._beat = None
            beat.cancel()
            _late(time.monotonic() - self._due, self.lease, self.run_id)  # a call that blocked the loop all along
        elif beat is not None:
            with self._beat_lock:
                self._beat = None

    def _settle(self) -> None:
        """Before any write: no call's heartbeat runs beside it, and a run whose renewal was refused writes nothing."""
        if self._beat is not None:
            self.rest()
        if self.lost is not None:
            raise self.lost

    def _keep(self, seq: int) -> None:
        """Renew the lease of the run this object holds at version ``seq`` (a store without ``keep``: ``renew``)."""
        store = self.journaled
        if store is None:
            return  # a store without leases: nothing to keep (beat() starts no heartbeat for it)
        if self.traits.keeps:
            cast("FullStore", store).keep(self.run_id, owner=self.owner, seq=seq)
        else:
            store.renew(self.run_id, owner=self.owner, seq=seq)

    async def _await(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Await the store's twin of method ``name`` if it has one (``traits.awaits``), else run it in a thread."""
        if name in self.traits.awaits:
            return await getattr(self.store, f"a{name}")(*args, **kwargs)
        return await asyncio.to_thread(getattr(self.store, name), *args, **kwargs)

    def _kept(self) -> float:
        """A renewal succeeded: seconds until the next one is due (a third of a lease)."""
        self._renew_at = time.monotonic() + self.lease / 3
        return self.lease / 3

    def _refused(self, exc: RunLeasedError | KeyError, beat: object) -> None:
        """A renewal was refused: the run is lost to this object, unless that call already returned (``rest``)."""
        with self._beat_lock:
            if self._beat is beat and self.lost is None:
                self.lost = exc

    def _retire(self, beater: HeartbeatThread | None) -> bool:
        """End the heartbeat thread (``beater``; None: whichever runs) unless a call is in flight; whether it ended."""
        with self._beat_lock:
            current = self._beater
            if current is None or (beater is not None and current is not beater):
                return True
            if beater is not None and self._beat is not None:
                return False
            self._beater = None
            current.stopped.set()
            return True

    def _beating(self, beater: HeartbeatThread) -> None:
        """The heartbeat thread: renew when a third of the lease is gone if a call is in flight; stop when idle."""
        idle = 0
        wait = max(self._renew_at - time.monotonic(), 0.0)
        while not beater.stopped.wait(wait):
            wait = self._renew_at - time.monotonic()
            if wait > 0:
                continue  # a checkpoint renewed the lease meanwhile
            wait = self.lease / 3
            call = self._beat
            if not isinstance(call, CallInFlight) or self.lost is not None:  # between calls the driver renews it itself
                idle += 1
                if idle >= _IDLE and self._retire(beater):
                    return
                continue
            idle = 0
            try:
                self._keep(call.seq)
            except (RunLeasedError, KeyError) as exc:
                self._refused(exc, call)
            except Exception:  # noqa: BLE001 - the database is unreachable for now: try again well within the lease
                wait = self.lease / _RETRIES
            else:
                wait = self._kept()

    async def _abeating(self) -> None:
        """The async heartbeat: renew at each third of a lease, retry a failed renewal soon, stop once refused."""
        seq, me = self.seq, asyncio.current_task()
        wait = max(self._renew_at - time.monotonic(), 0.0)
        while True:
            self._due = time.monotonic() + wait
            await asyncio.sleep(wait)
            _late(time.monotonic() - self._due, self.lease, self.run_id)
            self._due = float("inf")  # awake: renewing now, nothing for rest() to tell of
            try:
                name = "keep" if self.traits.keeps or "keep" in self.traits.awaits else "renew"
                await self._await(name, self.run_id, owner=self.owner, seq=seq)
            except (RunLeasedError, KeyError) as exc:
                self._refused(exc, me)
                return
            except Exception:  # noqa: BLE001 - the database is unreachable for now: try again well within the lease
                wait = self.lease / _RETRIES
            else:
                wait = self._kept()


def _late(late: float, lease: float, run_id: str) -> None:
    """Log a renewal the event loop held up until the lease had lapsed, or nearly: async code blocked the loop.

    The async heartbeat is a task on the run's loop, so an ``async def``
    tool, model, validator or processor that blocks the loop (a blocking
    call not handed to a thread) holds back the renewals of every run on
    it.  Past the lease, another owner may take such a run over and make its
    call in flight again; this owner's next write is then refused.  The
    warning names the cause, which nothing else would.
    """
    if late >= lease * 2 / 3:  # a renewal is due a third of a lease after the last: the lease was (nearly) gone
        logger.warning(
            "fsm_agent: the event loop was blocked for %.1f s, which held back the renewal of run %r's %g s lease:"
            " another owner may take the run over and make its call in flight again. Run blocking code in async"
            " tools, models and validators with asyncio.to_thread (or make the function a plain def, run on a thread)",
            late,
            run_id,
            lease,
        )


_RETRIES = 10
"""A renewal that failed for want of the database (not refused) is tried again after a tenth of a lease."""


def _beat_name(run_id: str) -> str:
    return f"fsm_agent lease {run_id}"


_IDLE = 3
"""A heartbeat thread that found no call in flight this many times running (about a lease) ends."""


class CallInFlight:
    """One sync call in flight, and the version its run was at when it began (what its renewals are fenced by)."""

    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        self.seq = seq


class HeartbeatThread:
    """A daemon thread running ``beating(self)`` for one run's calls until ``stopped`` is set."""

    def __init__(self, beating: Callable[[HeartbeatThread], None], name: str) -> None:
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=beating, args=(self,), name=name, daemon=True)
        self._thread.start()
