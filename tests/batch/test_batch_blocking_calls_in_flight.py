"""Every run a batch has in flight can be in a blocking call at once: sync tools and sync models wait for no thread.

The async driver hands a sync tool or a sync model's ``complete`` to its
loop's executor.  asyncio's default one has ``min(32, CPUs + 4)`` threads:
six on two cores, so a batch of 64 runs in flight with sync tools made six
calls at a time, the other runs waiting for a thread (the runs with a
deadline, whose calls go to daemon workers, did not).  Here every run's call
waits until the calls of all the runs have arrived, counted in files shared
across processes: with too few threads they never all arrive.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.batch_agents import tag

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.batch import run_batch
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

RUNS = 16
"""Runs in flight at once: more than the six threads asyncio gives a loop on two cores, and than two actors' 12."""

HANG = 10.0
"""Only a bound on a hang: all 16 calls arrived within 20 ms (worst of ten batches, beside the suite and two hogs)."""

QUESTIONS = [f"question {i}" for i in range(RUNS)]
MET = "met"
CALLS = "calls.log"


def _meet(ledger: Path, who: str) -> int:
    """Arrive (one file per caller) and wait until every run's caller has: how many had, the last time looked."""
    (ledger / MET / who).touch()
    deadline = time.monotonic() + HANG
    while (arrived := len(list((ledger / MET).iterdir()))) < RUNS and time.monotonic() < deadline:
        time.sleep(0.01)
    return arrived


def _log(ledger: Path, line: str) -> None:
    with (ledger / CALLS).open("a", encoding="utf-8") as log:
        log.write(line + "\n")


class _Meeting:
    """A sync model: one call of ``work`` then the tool's answer; or (``itself``) it meets the others in the call."""

    def __init__(self, ledger: str, itself: bool) -> None:
        self.ledger = Path(ledger)
        self.itself = itself

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = next(m.content for m in messages if m.role == "user")
        if self.itself:
            arrived = _meet(self.ledger, tag(question))
            _log(self.ledger, f"model {tag(question)}")
            return reply(f"{arrived} met")
        if not any(m.role == "tool" for m in messages):
            return tool_turn(tool_call("work", id=f"{tag(question)}-0", who=tag(question)))
        return reply(f"{messages[-1].content} met")


def meeting_agent(ledger: str, itself: bool = False) -> Agent:
    """The ``_Meeting`` model with ``work``, a sync tool that meets the others' calls and counts itself once made."""
    where = Path(ledger)
    tools = ToolRegistry()

    @tools.register
    def work(who: str) -> int:
        """Meet the other runs' calls."""
        arrived = _meet(where, who)
        _log(where, f"tool {who}")
        return arrived

    return Agent(_Meeting(ledger, itself), tools, max_steps=3, clock=ManualClock())


def _made(ledger: Path, kind: str) -> list[str]:
    return sorted(line.split()[1] for line in (ledger / CALLS).read_text(encoding="utf-8").splitlines()
                  if line.startswith(kind))  # fmt: skip


@pytest.mark.parametrize("blocking", ["tool", "model"])
def test_a_local_batch_has_every_run_in_flight_in_its_sync_call_at_once(
    store_target: str, tmp_path: Path, blocking: str
) -> None:
    """16 runs, 16 in flight: each run's sync call (a tool's, or the model's) meets all 16, each made once."""
    (tmp_path / MET).mkdir()
    make = functools.partial(meeting_agent, str(tmp_path), blocking == "model")
    results = run_batch(make, QUESTIONS, store=store_target, executor="local", max_in_flight=RUNS, progress=False)
    assert [r.final for r in results] == [f"{RUNS} met"] * RUNS, [r.final for r in results]
    assert _made(tmp_path, blocking) == sorted(tag(q) for q in QUESTIONS)


@pytest.mark.ray
@pytest.mark.usefixtures("cluster")
def test_a_ray_batch_has_every_run_in_flight_in_its_sync_tool_call_at_once(tmp_path: Path) -> None:
    """16 in flight over two actors, eight runs each: all 16 sync calls wait at once, each made once."""
    (tmp_path / MET).mkdir()
    make = functools.partial(meeting_agent, str(tmp_path))
    results = run_batch(make, QUESTIONS, store=tmp_path / "runs.db", max_in_flight=RUNS, progress=False)
    assert [r.final for r in results] == [f"{RUNS} met"] * RUNS, [r.evidence for r in results]
    assert _made(tmp_path, "tool") == sorted(tag(q) for q in QUESTIONS)
