"""A second Ctrl-C while a local batch is still stopping from the first: the calls in flight are cut, nothing else.

A Python process runs ``run_batch(executor="local")`` over three runs, two
at a time: ``hang`` (its second call, a sync tool, blocks while a flag file
exists) and ``busy`` (short calls while the flag exists), ``later`` waiting
for a worker.  The first SIGINT stops ``busy`` at its next check; ``hang``
cannot reach one, so the batch waits out its grace; the second SIGINT cuts
``hang``'s call.  Both runs are then ``Failed``/``cancelled`` and free, the
process dies of ``KeyboardInterrupt``, and the rerun finishes every run,
making only the call that was cut again (docs/tutorial/batch.md: "the call
may be made again when the run resumes").

Run as a script, this file is the child: ``python <this file> LEDGER STORE``.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.batch_leases import lease_free
from support.stuck_calls import calls, log

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.batch import batch_items, run_batch
from fsm_agent.persist import open_store
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

pytestmark = pytest.mark.subprocess

TESTS = Path(__file__).resolve().parent.parent
QUESTIONS = ["hang", "busy", "later"]
LONG_LEASE = 300.0
"""Far longer than the test: a lease the child kept would make the rerun wait (or fail the lease probe)."""

WAIT = 60.0
"""Bound on each wait for the child.  Measured on 2 cores, idle / beside two CPU hogs, SQLite and PostgreSQL: the
hanging call starts 0.18-0.35 / 0.18-0.88 s after the child does, ``busy`` is stored cancelled at most 0.05 / 0.06 s
after the first SIGINT, ``hang`` 0.02 / 0.05 s after the second, the child exits 0.08 / 0.22 s after its call
returns, and the rerun takes 0.13 / 0.22 s (its bound, a tenth of the lease, is 30 s).  60 s is over 60 times the
worst.  The old code never stores ``hang`` cancelled: that wait runs out."""


class _Model:
    """``hang``: two calls, then an answer; ``busy``: calls while the flag exists; ``later``: one call."""

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = next(m.content for m in messages if m.role == "user")
        turn = sum(1 for m in messages if m.role == "assistant")
        more = {"hang": turn < 2, "busy": (self.ledger / "hang.flag").exists(), "later": turn < 1}[question]
        if more:
            return tool_turn(tool_call("work", id=f"{question}-{turn}", question=question, turn=turn))
        return reply(f"answer to {question}")


def agent(ledger: str) -> Agent:
    """``work`` logs ``start ID`` and, once done, ``end ID`` (its side effect); ``hang-1`` blocks while flagged."""
    where = Path(ledger)
    tools = ToolRegistry()

    @tools.register
    def work(question: str, turn: int, call_id: str) -> str:
        """Do some work."""
        log(where, f"start {call_id}")
        if call_id == "hang-1":
            while (where / "hang.flag").exists():
                time.sleep(0.01)
        elif question == "busy":
            time.sleep(0.02)
        log(where, f"end {call_id}")
        return f"did {call_id}"

    return Agent(_Model(where), tools, max_steps=100_000, clock=ManualClock())


def _interruptible() -> None:
    """Ctrl-C's default action in the child: a suite started in the background ignores SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_id(question: str) -> str:
    return batch_items(QUESTIONS)[QUESTIONS.index(question)].run_id


def _stored(target: str, question: str) -> dict[str, Any] | None:
    """The stored run, None while it is not stored."""
    with open_store(target) as store:
        try:
            return store.load(_run_id(question))
        except KeyError:
            return None


def _cancelled(target: str, question: str) -> bool:
    data = _stored(target, question)
    return data is not None and (data["state"], data.get("reason")) == ("Failed", "cancelled")


def _until(condition: Callable[[], object], what: str) -> float:
    """Poll ``condition()`` every 10 ms for up to ``WAIT`` s; the seconds it took (the figures in ``WAIT``)."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > WAIT:
            raise AssertionError(f"{what}: not within {WAIT} s")
        time.sleep(0.01)
    return time.monotonic() - start


def test_a_second_ctrl_c_cuts_the_call_in_flight_leaves_every_run_cancelled_and_free_and_the_rerun_finishes(
    store_target: str, tmp_path: Path
) -> None:
    """Exit by KeyboardInterrupt; hang and busy Failed/cancelled and free; the rerun makes only the cut call again."""
    (tmp_path / "hang.flag").touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    child = subprocess.Popen([sys.executable, __file__, str(tmp_path), store_target], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_interruptible)  # fmt: skip
    try:
        _until(lambda: calls(tmp_path)["start hang-1"] and calls(tmp_path)["end busy-0"], "the calls began")
        child.send_signal(signal.SIGINT)
        # busy stored cancelled: the first Ctrl-C was handled, and the batch waits on hang's call.
        _until(lambda: _cancelled(store_target, "busy"), "busy stopped")
        child.send_signal(signal.SIGINT)
        _until(lambda: _cancelled(store_target, "hang"), "hang's call cut")
    finally:
        # The call cut in the loop goes on in its thread, and the child leaves once it returns: let it return.
        (tmp_path / "hang.flag").unlink()
        _, err = child.communicate(timeout=WAIT)
    assert child.returncode == -signal.SIGINT, err  # died of an uncaught KeyboardInterrupt
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert "RuntimeError" not in err, err
    assert _stored(store_target, "later") is None  # never begun, so never stored
    hang = _stored(store_target, "hang")
    assert hang is not None
    assert hang["evidence"]["unfinished"] == "hang-1", hang
    assert [q for q in ("hang", "busy") if not lease_free(store_target, _run_id(q))] == [], "a lease outlived it"
    made = calls(tmp_path)
    assert (made["start hang-1"], made["end hang-1"]) == (1, 1)  # cut in the loop, ended in its thread

    started = time.monotonic()
    again = run_batch(functools.partial(agent, str(tmp_path)), QUESTIONS, store=store_target, executor="local",
                      lease=LONG_LEASE, progress=False)  # fmt: skip
    assert time.monotonic() - started < LONG_LEASE / 10, "the rerun waited for a lease"
    assert [r.final for r in again] == [f"answer to {q}" for q in QUESTIONS], [r.evidence for r in again]
    made = calls(tmp_path)
    assert (made["start hang-1"], made["end hang-1"]) == (2, 2), "only the call that was cut is made again"
    assert {line: n for line, n in made.items() if not line.endswith(" hang-1")} == {
        f"{edge} {call}": 1
        for call in ["hang-0", *(line[4:] for line in made if line.startswith("end busy-")), "later-0"]
        for edge in ("start", "end")
    }, "a completed call was made again"


def _child(ledger: str, store: str) -> None:
    """The batch the test interrupts: two runs at a time, each its own lease, kept long."""
    run_batch(functools.partial(agent, ledger), QUESTIONS, store=store, executor="local", max_in_flight=2,
              lease=LONG_LEASE, progress=False)  # fmt: skip


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
