"""Leaving a local batch while one run waits on a call that does not return: after the grace, its task is cancelled.

The run is checkpointed ``Failed``/``cancelled`` with its lease given up,
on SQLite and PostgreSQL, and the next pass resumes it: only the call that
was in flight is made again; every completed call, once.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.batch_leases import lease_free

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.batch import batch_items, iter_batch, local, run_batch
from fsm_agent.persist import open_store
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

QUESTIONS = ["question 0", "stuck 1", "question 2"]
LONG_LEASE = 300.0


def _log(ledger: Path, line: str) -> None:
    fd = os.open(ledger / "calls.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _calls(ledger: Path) -> Counter[str]:
    path = ledger / "calls.log"
    return Counter(path.read_text().splitlines() if path.exists() else [])


class _Model:
    """Two calls of ``work``, then an answer; each call's id names its question and turn."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = next(m.content for m in messages if m.role == "user")
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn < 2:
            return tool_turn(tool_call("work", id=f"{question.split()[1]}-{turn}", topic=question, turn=turn))
        return reply(f"answer to {question}")


def stuck_agent(ledger: str) -> Agent:
    """``work`` for a ``stuck`` question's second call waits (asynchronously) until ``stuck.flag`` is gone."""
    where = Path(ledger)
    tools = ToolRegistry()

    @tools.register
    async def work(topic: str, turn: int, call_id: str) -> str:
        """Do some work."""
        _log(where, f"start {call_id}")
        while topic.startswith("stuck") and call_id.endswith("-1") and (where / "stuck.flag").exists():
            await asyncio.sleep(0.05)
        _log(where, f"end {call_id}")
        return f"did {call_id}"

    return Agent(_Model(), tools, max_steps=4, clock=ManualClock())


def test_a_run_stuck_in_a_call_when_the_batch_is_left_is_cancelled_checkpointed_and_resumed(
    store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The others end; the batch is left; the stuck run is Failed/cancelled and free; the rerun makes one call again."""
    monkeypatch.setattr(local, "GRACE", 0.5)  # the stuck call never reaches a check: cancelled after the grace
    (tmp_path / "stuck.flag").touch()
    make = functools.partial(stuck_agent, str(tmp_path))
    seen = {}
    batch = iter_batch(make, QUESTIONS, store=store_target, executor="local", max_in_flight=3, lease=LONG_LEASE)
    for item, result in batch:
        seen[item.index] = result
        if len(seen) == 2:
            break
    batch.close()
    assert sorted(seen) == [0, 2]
    assert all(r.reason == "done" for r in seen.values())
    stuck = batch_items(QUESTIONS)[1].run_id
    with open_store(store_target) as store:
        data = store.load(stuck)
    assert (data["state"], data.get("reason")) == ("Failed", "cancelled")
    assert lease_free(store_target, stuck), "the cancelled run's lease was kept"
    assert _calls(tmp_path)["start 1-1"] == 1
    assert _calls(tmp_path)["end 1-1"] == 0

    (tmp_path / "stuck.flag").unlink()
    again = run_batch(make, QUESTIONS, store=store_target, executor="local", lease=LONG_LEASE, progress=False)
    assert [r.final for r in again] == [f"answer to {q}" for q in QUESTIONS], [r.evidence for r in again]
    calls = _calls(tmp_path)
    assert calls["start 1-1"] == 2  # the call in flight, made again
    assert {line: n for line, n in calls.items() if line != "start 1-1"} == {
        f"{edge} {q}-{t}": 1
        for edge in ("start", "end")
        for q in (0, 1, 2)
        for t in (0, 1)
        if (q, t, edge) != (1, 1, "start")
    }
