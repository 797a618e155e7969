"""``Proof.crash_safe`` against a real SQLite store: cut after every transition, resumed, every call counted."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, SqliteStore, ToolRegistry
from fsm_agent.proof import check
from fsm_agent.records import Message, ModelResponse
from fsm_agent.testing import reply, tool_call, tool_turn

TURNS = 3


def _agent(runs: Counter[str], per_reply: int, interrupt: str | None = None) -> Agent:
    """``TURNS`` turns of ``per_reply`` calls each, then an answer; the model goes by the conversation it is sent.

    ``runs`` counts each tool call by its id and each model call as ``m<turn>``: a model call is a call too.
    """
    registry = ToolRegistry()

    def act(what: str, call_id: str) -> str:
        """Counts each run of a call; the armed call dies in flight once (a Ctrl-C)."""
        runs[call_id] += 1
        nonlocal interrupt
        if call_id == interrupt:
            interrupt = None
            raise KeyboardInterrupt
        return what

    registry.register(act)

    class Model:
        def complete(self, messages: Sequence[Message], tools: object) -> ModelResponse:
            n = sum(1 for m in messages if m.role == "assistant")
            runs[f"m{n}"] += 1
            if n >= TURNS:
                return reply("done")
            return tool_turn(*[tool_call("act", id=f"t{n}c{i}", what=f"{n}.{i}") for i in range(per_reply)])

    return Agent(Model(), registry)


def _cut(path: Path, every: str, per_reply: int, driver: str, cut: int, runs: Counter[str]) -> dict[str, Any] | None:
    """The stored run after ``cut`` transitions (what a process killed then leaves), or None past the end."""
    with SqliteStore(path, every=every) as store:
        if driver == "sync":
            run = _agent(runs, per_reply).start("q", store=store, run_id="r")
            for _ in range(cut):
                if run.done:
                    return None
                run.advance()
            return store.load("r")

        async def drive() -> bool:
            arun = await _agent(runs, per_reply).astart("q", store=store, run_id="r")
            for _ in range(cut):
                if arun.done:
                    return False
                await arun.aadvance()
            return True

        return store.load("r") if asyncio.run(drive()) else None


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("per_reply", [1, 2])
@pytest.mark.parametrize("every", ["call", "transition", "turn"])
def test_crash_safe_iff_no_cut_between_transitions_runs_a_call_twice(
    tmp_path: Path, every: str, per_reply: int, driver: str
) -> None:
    """Cut after each transition, resume the stored run in a fresh agent: every call runs once iff the proof says
    crash safe; when refuted (every="turn": a reply is not written before the turn's tool calls), some cut does run
    a completed call twice."""
    proof = check(_agent(Counter(), per_reply), every=every, calls_per_reply=per_reply)
    again: list[tuple[int, dict[str, int]]] = []
    cut = 0
    while True:
        cut += 1
        runs: Counter[str] = Counter()
        stored = _cut(tmp_path / f"{cut}.db", every, per_reply, driver, cut, runs)
        if stored is None or stored["state"] in ("Done", "Failed"):
            break
        result = _agent(runs, per_reply).resume(stored).finish()
        assert result.final == "done"
        tools = {f"t{n}c{i}" for n in range(TURNS) for i in range(per_reply)}
        assert set(runs) == tools | {f"m{n}" for n in range(TURNS + 1)}  # none lost
        if any(n != 1 for n in runs.values()):
            again.append((cut, dict(runs)))
    assert cut > 6 * TURNS * per_reply // 2
    if proof.crash_safe:
        assert again == []
    else:
        assert again, "the proof's crash counterexample never happens in a real run"
        assert len(proof.crash_counterexample) - 1 in {c for c, _ in again}  # killed where the counterexample says


@pytest.mark.parametrize("every", ["call", "transition"])
def test_a_call_killed_in_flight_is_the_only_one_made_again(tmp_path: Path, every: str) -> None:
    """A Ctrl-C inside the 2nd call of the 2nd turn (sync driver): resumed from the store, that call runs twice and
    every other call once, as crash_safe promises."""
    assert check(_agent(Counter(), 3), every=every, calls_per_reply=3).crash_safe
    runs: Counter[str] = Counter()
    with SqliteStore(tmp_path / "runs.db", every=every) as store:
        with pytest.raises(KeyboardInterrupt):
            _agent(runs, 3, interrupt="t1c1").run("q", store=store, run_id="r")
        stored = store.load("r")
    result = _agent(runs, 3).resume(stored).finish()
    assert result.final == "done"
    tools = {f"t{n}c{i}": 2 if (n, i) == (1, 1) else 1 for n in range(TURNS) for i in range(3)}
    assert runs == tools | {f"m{n}": 1 for n in range(TURNS + 1)}
