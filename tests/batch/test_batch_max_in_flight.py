"""``max_in_flight`` bounds the runs going at once, counted by the runs themselves, across processes.

A run is in flight from its first model call to its answer: the model
counts it up and down in a counter file under an exclusive ``flock``, which
Ray's worker processes share with this one, and keeps the peak.
"""

from __future__ import annotations

import fcntl
import functools
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.batch import run_batch
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
LATENCY = 0.05
"""Seconds per model call: long enough that the runs of a batch overlap."""


def _bump(ledger: Path, delta: int) -> None:
    """Add ``delta`` to the runs in flight, keeping the peak: ``live peak`` in one file, under an exclusive lock."""
    with (ledger / "live").open("a+", encoding="utf-8") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)
        counter.seek(0)
        live, peak = (int(n) for n in (counter.read() or "0 0").split())
        live += delta
        counter.seek(0)
        counter.truncate()
        counter.write(f"{live} {max(peak, live)}")


def _counted(ledger: Path) -> tuple[int, int]:
    live, peak = (ledger / "live").read_text(encoding="utf-8").split()
    return int(live), int(peak)


class _Counting:
    """Two tool calls, then an answer; in flight from the first model call to the answer."""

    def __init__(self, ledger: str) -> None:
        self.ledger = Path(ledger)

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn == 0:
            _bump(self.ledger, 1)
        time.sleep(LATENCY)
        if turn < 2:
            return tool_turn(tool_call("work", id=f"c{turn}", step=turn))
        _bump(self.ledger, -1)
        return reply("finished")


def counting_agent(ledger: str) -> Agent:
    tools = ToolRegistry()

    @tools.register
    def work(step: int) -> str:
        """Do one step."""
        return f"step {step}"

    return Agent(_Counting(ledger), tools, max_steps=4, clock=ManualClock())


QUESTIONS = [f"question {i}" for i in range(12)]


@pytest.mark.slow
@pytest.mark.parametrize("limit", [1, 3])
def test_a_local_batch_never_runs_more_than_max_in_flight_at_once(
    store_target: str, tmp_path: Path, limit: int
) -> None:
    """Twelve runs, ``limit`` at once: every run done, and the runs counted in flight never exceed it."""
    results = run_batch(functools.partial(counting_agent, str(tmp_path)), QUESTIONS, store=store_target,
                        executor="local", max_in_flight=limit, progress=False)  # fmt: skip
    assert [r.final for r in results] == ["finished"] * len(QUESTIONS)
    live, peak = _counted(tmp_path)
    assert live == 0
    assert 1 <= peak <= limit


@pytest.mark.ray
@pytest.mark.usefixtures("cluster")
def test_a_ray_batch_never_runs_more_than_max_in_flight_at_once(tmp_path: Path) -> None:
    """Three at once over two actors (two slots each): the runs in flight, counted in the workers, never exceed 3."""
    results = run_batch(functools.partial(counting_agent, str(tmp_path)), QUESTIONS, store=tmp_path / "runs.db",
                        max_in_flight=3, progress=False)  # fmt: skip
    assert [r.final for r in results] == ["finished"] * len(QUESTIONS), [r.evidence for r in results]
    live, peak = _counted(tmp_path)
    assert live == 0
    assert 1 <= peak <= 3
