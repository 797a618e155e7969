"""Processes that die or race: a killed run resumes elsewhere exactly, and only one owner advances a run at a time.

Each test runs against a SQLite file and a PostgreSQL database.  Children
are new processes that share nothing with the test (``support.store_cases.child_process``), killed with
``os._exit`` (no cleanup, no lease released), and the run is resumed in yet another process.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from support.store_cases import CHILDREN, child_process, dying_store, in_child, tick_agent

from fsm_agent import AgentLoopError, RunLeasedError, RunResult
from fsm_agent.persist import open_store

K = 30
LEASE = 0.5


def _killed_at(target: str, counter: str, kill_at: int, every: str = "call") -> None:
    """Run the long script; right after its ``kill_at``-th checkpoint the process dies without any cleanup."""
    tick_agent(K, counter).run("go", store=dying_store(target, LEASE, kill_at, every), run_id="long")


def _resume(target: str, counter: str, out: str, **limits: Any) -> None:
    """Take the run over as soon as the dead owner's lease lapses, finish it and write the result."""
    store = open_store(target, lease=LEASE)
    while True:
        try:
            run = tick_agent(K, counter).resume(store.load("long"), store=store, **limits)
            break
        except RunLeasedError:
            time.sleep(0.05)
    Path(out).write_text(run.finish().to_json(), encoding="utf-8")
    store.close()


@pytest.mark.subprocess
@pytest.mark.parametrize(("every", "seed"), [("transition", 1), ("transition", 2), ("call", 1), ("call", 2)])
def test_a_run_killed_at_a_random_checkpoint_resumes_in_a_new_process_as_if_never_stopped(
    store_target: str, tmp_path: Path, every: str, seed: int
) -> None:
    """The resumed result equals an uninterrupted run's, and no completed tool call ran twice."""
    whole = tick_agent(K).start("go", run_id="long").finish()
    # A write per transition, or (every="call") one per model call (K + 1), per tool call (K) and the end.
    checkpoints = len(whole.trace) if every == "transition" else 2 * K + 2
    kill_at = random.Random(seed).randint(2, checkpoints - 2)
    counter, out = str(tmp_path / "calls.txt"), str(tmp_path / "result.json")
    assert in_child(_killed_at, store_target, counter, kill_at, every) == 9
    done_before = Path(counter).read_text(encoding="utf-8").split() if Path(counter).exists() else []
    assert len(done_before) < K, f"killed at checkpoint {kill_at}, after every call"
    assert in_child(_resume, store_target, counter, out) == 0
    assert RunResult.from_json(Path(out).read_text(encoding="utf-8")) == whole
    calls = Path(counter).read_text(encoding="utf-8").split()
    assert sorted(calls) == sorted(f"t{i}" for i in range(K)), "a tool call ran twice or never"


def _racer(target: str, barrier: Any, out: str, name: str) -> None:
    """Try to take the stopped run over at the same moment as the other racer.

    The winner advances three transitions and dies holding the lease; the
    loser records who held it, waits for the lease to lapse, and finishes.
    """
    store = open_store(target, lease=LEASE)
    agent = tick_agent(K)
    barrier.wait()
    try:
        run = agent.resume(store.load("long"), store=store, max_steps=K + 1)
    except RunLeasedError as exc:
        Path(out, f"{name}.leased").write_text(exc.holder, encoding="utf-8")
        _resume(target, str(Path(out, "unused")), str(Path(out, f"{name}.json")), max_steps=K + 1)
        return
    Path(out, f"{name}.won").write_text(run._journal.owner, encoding="utf-8")  # type: ignore[union-attr]
    for _ in range(3):
        run.advance()
    os._exit(9)


@pytest.mark.subprocess
def test_two_processes_racing_for_one_run_let_exactly_one_proceed(store_target: str, tmp_path: Path) -> None:
    """One wins, the other gets RunLeasedError naming it; once the winner dies and its lease lapses, it resumes."""
    with open_store(store_target) as store, pytest.raises(AgentLoopError) as stopped:
        tick_agent(K, max_steps=1).run("go", store=store, run_id="long")
    expected = tick_agent(K).resume(stopped.value.result, max_steps=K + 1).finish()
    barrier = CHILDREN.Barrier(2)
    racers = [child_process(_racer, store_target, barrier, str(tmp_path), n) for n in ("a", "b")]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(120)
    won = sorted(p.stem for p in tmp_path.glob("*.won"))
    leased = sorted(p.stem for p in tmp_path.glob("*.leased"))
    assert len(won) == 1, (won, leased)
    assert len(leased) == 1, (won, leased)
    assert sorted(r.exitcode or 0 for r in racers) == [0, 9]
    holder = Path(tmp_path, f"{leased[0]}.leased").read_text(encoding="utf-8")
    assert holder == Path(tmp_path, f"{won[0]}.won").read_text(encoding="utf-8")
    result = RunResult.from_json(Path(tmp_path, f"{leased[0]}.json").read_text(encoding="utf-8"))
    assert result == expected
