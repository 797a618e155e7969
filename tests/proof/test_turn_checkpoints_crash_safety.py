"""Crash safety counts model calls as calls: a model's reply unwritten when a tool call begins is a crash window.

With ``every="turn"`` a store writes before each model call, at the end and
when paused, so the reply of a turn is not written before the turn's first
tool call: a process killed after the reply came back (or while that tool
call is in flight) resumes before the model call and makes it again.  The
checker once marked only tool calls unwritten and called ``every="turn"``
with one call per reply crash safe; cut after each transition and resumed,
the store shows which it is, on both drivers.
"""

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

TURNS = 2


def _counted_agent(model_calls: Counter[int], tool_runs: Counter[str]) -> Agent:
    """``TURNS`` turns of one tool call each, then an answer; the model goes by the conversation, and counts calls."""
    registry = ToolRegistry()

    def act(what: str) -> str:
        """Counts each run."""
        tool_runs[what] += 1
        return what

    registry.register(act)

    class Model:
        def complete(self, messages: Sequence[Message], tools: object) -> ModelResponse:
            n = sum(1 for m in messages if m.role == "assistant")
            model_calls[n] += 1
            return tool_turn(tool_call("act", id=f"t{n}", what=f"w{n}")) if n < TURNS else reply("done")

    return Agent(Model(), registry)


def _stored_after(
    path: Path, every: str, cut: int, driver: str, model_calls: Counter[int], tool_runs: Counter[str]
) -> dict[str, Any] | None:
    """What a process killed after ``cut`` transitions leaves in the store (None once the run ended before it)."""
    with SqliteStore(path, every=every) as store:  # type: ignore[arg-type]  # one of EVERY, as parametrized
        if driver == "sync":
            run = _counted_agent(model_calls, tool_runs).start("q", store=store, run_id="r")
            for _ in range(cut):
                if run.done:
                    return None
                run.advance()
            return None if run.done else store.load("r")

        async def drive() -> bool:
            arun = await _counted_agent(model_calls, tool_runs).astart("q", store=store, run_id="r")
            for _ in range(cut):
                if arun.done:
                    return False
                await arun.aadvance()
            return not arun.done

        return store.load("r") if asyncio.run(drive()) else None


def _repeats(tmp_path: Path, every: str, driver: str) -> list[tuple[int, dict[int, int], dict[str, int]]]:
    """Every cut whose resume made a model or tool call that had already completed before the cut, made again.

    A cut after ``k`` transitions is a process killed with nothing in flight, or with the next call in flight;
    the next call is the only one a resume may make again.
    """
    again: list[tuple[int, dict[int, int], dict[str, int]]] = []
    for cut in range(1, 40):
        model_calls: Counter[int] = Counter()
        tool_runs: Counter[str] = Counter()
        stored = _stored_after(tmp_path / f"{every}-{driver}-{cut}.db", every, cut, driver, model_calls, tool_runs)
        if stored is None:
            return again
        before = (Counter(model_calls), Counter(tool_runs))
        result = _counted_agent(model_calls, tool_runs).resume(stored).finish()
        assert result.final == "done"
        # _stored_after stops between transitions, so every call counted in `before` had completed.
        made_again = [n for n in before[0] if model_calls[n] > 1] + [w for w in before[1] if tool_runs[w] > 1]
        if made_again:
            again.append((cut, dict(model_calls), dict(tool_runs)))
    return again


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("every", ["call", "transition"])
def test_no_completed_model_or_tool_call_is_made_again_after_a_cut_under_call_or_transition(
    tmp_path: Path, every: str, driver: str
) -> None:
    """crash_safe under every="call"/"transition" holds for model calls as well as tool calls: cut after each
    transition and resumed, every model call and tool call is made once."""
    assert check(_counted_agent(Counter(), Counter()), every=every, calls_per_reply=1).crash_safe
    assert _repeats(tmp_path, every, driver) == []


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_turn_checkpoints_are_not_crash_safe_with_one_call_per_reply_and_a_cut_makes_the_model_call_again(
    tmp_path: Path, driver: str
) -> None:
    """check(every="turn", calls_per_reply=1) is refuted, its counterexample the reply then the turn's first tool
    call; killed at the counterexample's last edge, the resume makes the completed model call again."""
    proof = check(_counted_agent(Counter(), Counter()), every="turn", calls_per_reply=1)
    assert not proof.crash_safe
    edges = [(edge.source, edge.dest) for edge in proof.crash_counterexample]
    assert edges[0] == ("AwaitModel", "CheckTruncation")
    assert ("Dispatch", "ExecuteTool") in edges
    assert edges[-1][0] == "ExecuteTool"
    assert "NO, a completed call may run again" in proof.report()
    again = _repeats(tmp_path, "turn", driver)
    cut = len(proof.crash_counterexample) - 1  # the turn's tool call is next, the reply unwritten
    assert cut in {c for c, _, _ in again}
    assert all(max(model_calls.values()) == 2 for _, model_calls, _ in again)
