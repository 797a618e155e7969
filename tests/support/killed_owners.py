"""What the tests of an owner process SIGKILLed mid-run share: the run, the kill, the counts after the take-over.

The owner is a real child process (``support.store_cases.child_process``)
running the stored run ``RUN``.  At the point under test it writes a marker
file and holds there (``hold``/``ahold``), so that nothing but the test's
SIGKILL ends it; the test kills it as soon as the marker exists
(``kill_when``), with no cleanup and its lease not given up, then takes the
run over in its own process on the other driver (``other_driver``) once the
lease lapsed.  Each model asks first for a parallel batch (``work`` a and b)
and then answers with both results (``FINAL``); which of the two calls a
history is for is read from it (``phase``), so an owner in either process
goes on with the run.

Timing, measured rather than guessed.  The lease is
``support.exactly_once.LEASE`` (0.5 s); every wait (the marker, the kill,
the take-over) and every hold is bounded by its ``WAIT`` (60 s).  Measured
over the 44 tests of ``tests/drivers/test_owner_killed_*.py`` on two cores
(``-n 2``): a child's start to its marker took at most 0.16 s idle and
0.45 s with two CPU hogs beside it; the SIGKILL to the new owner's claim
(the lease left to lapse, polled every 50 ms) at most 0.54 s, idle or
under the hogs.  So ``WAIT`` is more than 100 times the slowest step, and
a held child is killed long before its hold could end.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess

from fsm_agent import Message
from support.exactly_once import WAIT
from support.exactly_once_audit import Tally
from support.polling import held_within

RUN = "r"
"""The run's id in the store, in the killed owner and the new one."""
FINAL = "done: a ok, b ok"
"""The model's answer once both results are in."""
DRIVERS = ["sync", "async"]
EACH_TOOL_ONCE = {"try a": 1, "done a": 1, "try b": 1, "done b": 1}
"""``tool_counts`` when each of the batch's calls ran once: started once, its side effect made once."""


def phase(messages: Sequence[Message]) -> str:
    """Which call a history is for: the batch's (``ask``) or the answer's, by the results it holds."""
    return "answer" if any("a ok" in m.content for m in messages) else "ask"


def other_driver(driver: str) -> str:
    """The driver the new owner takes the run over on: the one the killed owner did not use."""
    return "async" if driver == "sync" else "sync"


def tool_counts(tally: Tally) -> dict[str, int]:
    """How often each ``work`` call started (``try <label>``) and made its side effect (``done <label>``)."""
    return {f"{kind} {label}": n for kind in ("try", "done") for label, n in tally.counts(kind).items()}


def hold() -> None:
    """In the child: wait here until the test's SIGKILL ends the process (bounded by ``WAIT``, far past the kill)."""
    time.sleep(WAIT)


async def ahold() -> None:
    """``hold`` on an event loop: the loop's other tasks (the lease's heartbeat) go on until the kill."""
    await asyncio.sleep(WAIT)


def kill_when(child: BaseProcess, ready: Callable[[], bool], what: str) -> None:
    """Start ``child`` and SIGKILL it once ``ready()`` holds (``what`` names the point, for a failure): no cleanup,
    its lease not given up.  Fails if the child ended by itself first."""
    child.start()
    try:
        assert held_within(lambda: ready() or not child.is_alive(), WAIT), f"the owner never got {what}"
        assert child.is_alive(), f"the owner ended (exit code {child.exitcode}) before {what}"
    finally:
        child.kill()
        child.join(WAIT)
    assert child.exitcode == -signal.SIGKILL
