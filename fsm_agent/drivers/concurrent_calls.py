"""A turn's tool calls awaited: one directly, several at once (each in a task), cut together, each kept as it returns.

The async driver's half that has no sync twin: the sync driver makes a
turn's calls one at a time (``SyncDriver._call_tool``), the async one plans
them as one batch.  Each call's outcome is handed to the stepper the moment
it exists and, with a store, written as it returns, one write at a time, so
whatever cuts the rest of the batch (its deadline, a cancel, a call's
``KeyboardInterrupt`` or ``SystemExit``) that call never runs again.  A
call's interrupt does not leave the event loop from its task: the batch's
other calls are cut and the run's own task raises it (``drivers.leaving``).
"""

from __future__ import annotations

from fsm_agent.drivers.base import RunBase
from fsm_agent.drivers.child_runs import arun_child
from fsm_agent.drivers.leaving import LEAVING
from fsm_agent.records import ToolCall


class ConcurrentCalls(RunBase):
    """``_run_batch``: a turn's calls awaited, concurrently when there are several, under ``max_concurrency``."""

    async def _acall_tool(self, call: ToolCall) -> None:
        try:
            child = self._children.get(call.name) if self._children else None
            if child is not None:
                outcome = await arun_child(self, child, call)
            elif self._settings.tool_timeout is None:
                outcome = await self._registry.aexecute(call)
            else:
                outcome = await self._registry.aexecute(call, timeout=self._settings.tool_timeout)
        except BaseException as exc:
            self._cut_in_call(exc)
            raise
        # Kept the moment it exists: whatever happens to the rest of the batch, this call never runs again.
        self._accept_tool(call, outcome)

    def _may_start(self, call: ToolCall) -> bool:
        """Whether a call of a parallel batch may start: its hooks (heard first) took neither the time left nor a
        cancel, and none came while it waited for its turn (``max_concurrency``), as the sync driver reads both
        before each call."""
        if self._observed and not self._heard_in_time(call):
            return False
        token = self._cancel
        return token is None or not token.cancelled

    async def _run_batch(self, batch: tuple[ToolCall, ...], unmade: list[str]) -> None:
        journal = self._journal
        if len(batch) == 1:
            # One call needs no tasks: awaiting it directly keeps the common case cheap (its outcome is written
            # with the transition that records it, right after, or before its after_tool hooks run if it has any:
            # a crash in one must not make it again, as on the sync driver).
            await self._acall_tool(batch[0])
            if journal is not None and self._hooks.get("after_tool"):
                await journal.akeep_outcome(self.position, in_flight=False)
            return
        import asyncio

        limit = asyncio.Semaphore(self._settings.max_concurrency or len(batch))
        # A batch's transitions come after its last call, so each call's outcome is written as it returns, one
        # write at a time; a write runs to its end even if the batch is cut meanwhile (the run's next write
        # starts from it).
        writing = asyncio.Lock()
        writes: list[asyncio.Task[None]] = []
        interrupted: list[BaseException] = []  # a call's KeyboardInterrupt or SystemExit, raised here once all is cut
        # A call's or an outcome write's error (a store's: this run's write, or a sub-agent's run's): the calls in
        # flight still come back and their outcomes are kept (the run owes their write: persist.cut_writes), none
        # starts after it, and it is raised once all are back.  Driven again, the run writes first, then makes the
        # calls that did not start.
        failed: list[Exception] = []
        leaving = LEAVING.get(None)
        outermost = None
        if leaving is None:  # the outermost batch: its tasks, and every batch under them, share this list
            leaving = []
            outermost = LEAVING.set(leaving)

        async def kept() -> None:
            assert journal is not None
            async with writing:
                await journal.akeep_outcome(self.position)

        async def one(call: ToolCall) -> None:
            try:
                async with limit:
                    # Unmade, neither heard of, once a call's hooks took the time left or a cancel came; else
                    # unmade if its own did.
                    if failed:
                        return  # not started: a write failed, and no call is made before the run is written
                    if unmade or not self._may_start(call):
                        unmade.append(call.id)  # never started: the stop names it as no call in flight
                        return
                    await self._acall_tool(call)
            except (KeyboardInterrupt, SystemExit) as exc:
                # Raised out of this task it would leave the event loop at once, ending every run on it (a Ray
                # worker's loop, which serves other runs, among them). So the batch's other calls are cut (its
                # sub-agents' runs read the cancel as the interrupt's: leaving.left_above) and the run's own task
                # raises it, as it does a single call's.
                leaving.append(exc)
                interrupted.append(exc)
                this = asyncio.current_task()
                for task in tasks:
                    if task is not this:
                        task.cancel()
                return
            except Exception as exc:  # noqa: BLE001 - raised below, once every call in flight is back
                failed.append(exc)  # a sub-agent's run that could not write (a tool's own error is its outcome)
                return
            if journal is not None:
                write = asyncio.ensure_future(kept())
                writes.append(write)
                try:
                    await asyncio.shield(write)
                except Exception as exc:  # noqa: BLE001 - raised below, once every call in flight is back
                    failed.append(exc)

        try:
            tasks = [asyncio.ensure_future(one(call)) for call in batch]
        finally:
            if outermost is not None:
                LEAVING.reset(outermost)  # the task running the batch is under none: its next batch starts afresh
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            # The writes of calls that finished are waited for: the stop recorded next is written after them.
            await asyncio.gather(*writes, return_exceptions=True)
            if not interrupted:
                raise
        if interrupted:
            # The cut calls' sub-agent runs are left as the interrupt leaves them (written unfinished) first.
            await asyncio.gather(*tasks, *writes, return_exceptions=True)
            raise interrupted[0]
        if failed:
            raise failed[0]
