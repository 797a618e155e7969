"""``GroupWriter``: the awaited plans of one ``SqliteStore``, run by one thread, many in one transaction.

Why: each awaited write used to hop to a worker thread of its own, queue on
the store's lock and commit alone, so a hundred runs in flight paid a thread
hop, a lock hand-off and a commit per write.  Here the writes queue for one
thread, which takes what has gathered (up to ``BATCH`` plans) and runs it in
one transaction, each plan inside its own savepoint: a plan that raises
(a version conflict, a lost lease, a run id taken) rolls back only its own
statements and its caller gets that exception, while the rest of the batch
commits.  A caller hears of success only after the ``COMMIT`` holding its
write; a ``COMMIT`` that fails fails every plan it held.  Each transaction
takes the store's lock, so the store's sync writes (and, through SQLite's
write lock, other processes) interleave with the batches, never inside one.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from fsm_agent.persist import plans
from fsm_agent.persist.store import StoreError

T = TypeVar("T")

BATCH = 64
"""The most plans one transaction holds, so a transaction (and the file's write lock) stays short."""

IDLE = 2.0
"""Seconds the writer thread waits for a plan before it ends (the next plan starts another one)."""

_Job = tuple[plans.Plan[Any], bool, "asyncio.Future[Any]"]
_Outcome = tuple["asyncio.Future[Any]", bool, Any]
"""A plan's future, whether it succeeded, and its value or exception."""
_STOP = None
"""Queued by ``close`` and ``aclose``: the thread ends after the batch in hand."""


class GroupWriter:
    """The writer thread of one store and its queue: started by an awaited plan, ended by ``close`` or when idle.

    ``connection`` returns the store's connection (called at every batch,
    under ``lock``, so the store may wrap it or open it again), ``lock`` is
    the store's lock around it, and ``where`` names the file in errors.
    """

    def __init__(self, connection: Callable[[], Any], lock: threading.Lock, where: str) -> None:
        self._connection = connection
        self._lock = lock
        self._where = where
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._state = threading.Lock()  # guards starting, stopping and every submission against ``close``
        self._thread: threading.Thread | None = None
        self._closed = False

    async def run(self, plan: plans.Plan[T], write: bool) -> T:
        """Run ``plan`` in the writer's next transaction and return its value once that transaction committed.

        The event loop never waits on the file.  A caller cancelled while
        its plan waits in the queue withdraws it; once the writer has taken
        it, the plan runs and may commit though nobody awaits it any more
        (as a write handed to a worker thread would).
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._state:
            if self._closed:
                raise self._closed_error()
            if self._thread is None or not self._thread.is_alive():  # none yet, or it ended
                self._thread = threading.Thread(target=self._serve, name=f"fsm_agent writer {self._where}", daemon=True)
                self._thread.start()
            self._jobs.put((plan, write, future))
        return await future

    def close(self) -> None:
        """Stop the thread: the batch it holds commits, every plan still queued fails with a ``StoreError``."""
        thread = self._stop()
        if thread is not None:
            thread.join()

    async def aclose(self) -> None:
        """``close``, awaited: the thread is joined from a worker thread, so the event loop goes on meanwhile."""
        thread = self._stop()
        if thread is not None:
            await asyncio.to_thread(thread.join)

    def _stop(self) -> threading.Thread | None:
        """Refuse new plans, fail the queued ones, and tell the thread to end; the thread to wait for, if any."""
        with self._state:
            self._closed = True
            thread, self._thread = self._thread, None
            queued: list[_Outcome] = []
            while not self._jobs.empty():
                job = self._jobs.get()
                if job is not None:
                    queued.append((job[2], False, self._closed_error()))
            _deliver(queued)
            self._jobs.put(_STOP)
        return thread

    def _closed_error(self) -> StoreError:
        return StoreError(self._where, "it was closed before this write ran")

    def _serve(self) -> None:
        """The thread: wait for a plan, take whatever else has gathered (up to ``BATCH``), run them together."""
        while True:
            try:
                job = self._jobs.get(timeout=IDLE)
            except queue.Empty:
                with self._state:  # no plan can be queued meanwhile, so none is left behind
                    if self._jobs.empty():
                        if self._thread is threading.current_thread():
                            self._thread = None
                        return
                continue
            batch: list[_Job] = []
            while job is not None:
                if not job[2].cancelled():  # its caller was cancelled while it waited: withdrawn
                    batch.append(job)
                if len(batch) >= BATCH or self._jobs.empty():
                    break
                job = self._jobs.get()
            outcomes: list[_Outcome] = []
            try:
                with self._lock:
                    left = batch
                    while left:
                        left = self._transaction(self._connection(), left, outcomes)
            except BaseException as exc:  # noqa: BLE001 - a caller left waiting forever would be worse
                # Told after ``outcomes``, so only the plans not told yet take this error.
                outcomes.extend((future, False, exc) for _, _, future in batch)
            _deliver(outcomes)
            if job is None:
                return

    def _transaction(self, db: Any, batch: list[_Job], outcomes: list[_Outcome]) -> list[_Job]:
        """Run ``batch`` in one transaction, each plan in a savepoint; the plans left over if SQLite ended it early.

        Each plan's outcome is added to ``outcomes``, to be told once the
        transaction ended.  A plan that raises rolls back to its savepoint
        and fails alone.  An error that ends the whole transaction (SQLite
        rolled it back: a full disk, an I/O error) fails that plan and the
        ones before it, whose writes are gone; the rest are returned to run
        in a new transaction.
        """
        try:
            db.execute("BEGIN IMMEDIATE" if any(write for _, write, _ in batch) else "BEGIN")
        except BaseException as exc:  # noqa: BLE001 - handed to every caller instead
            outcomes.extend((future, False, exc) for _, _, future in batch)
            return []
        done: list[_Outcome] = []

        def execute(sql: str, params: tuple[Any, ...]) -> plans.Reply:
            cursor = db.execute(sql, params)
            return cursor.rowcount, cursor.fetchall()

        for index, (plan, _, future) in enumerate(batch):
            try:
                db.execute("SAVEPOINT plan")
                value = plans.drive(plan, execute)
                db.execute("RELEASE plan")
            except BaseException as exc:  # noqa: BLE001 - its caller's exception
                if _rolled_back_to_savepoint(db):
                    outcomes.append((future, False, exc))
                    continue
                lost = [earlier for earlier, _, _ in done] + [future]
                outcomes.extend((each, False, exc) for each in lost)
                return batch[index + 1 :]
            done.append((future, True, value))
        try:
            db.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001 - handed to every caller instead
            _rollback(db)
            outcomes.extend((future, False, exc) for future, _, _ in done)
            return []
        outcomes.extend(done)
        return []


def _rolled_back_to_savepoint(db: Any) -> bool:
    """Undo the failed plan's statements, keeping the transaction; False if the transaction itself is gone."""
    if not db.in_transaction:
        return False
    try:
        db.execute("ROLLBACK TO plan")
        db.execute("RELEASE plan")
    except sqlite3.Error:
        _rollback(db)
        return False
    return True


def _rollback(db: Any) -> None:
    """End the transaction if SQLite has not already; a failure to do so leaves SQLite to end it."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def _deliver(outcomes: list[_Outcome]) -> None:
    """Tell each plan's caller its outcome: one callback per event loop, not a wake-up per plan."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
    for loop, told in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop was closed: nobody is left to tell
            loop.call_soon_threadsafe(_settle, told)


def _settle(outcomes: list[_Outcome]) -> None:
    """On the callers' loop: set each future not cancelled meanwhile."""
    for future, ok, value in outcomes:
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
