"""Helpers for the audit of ``check``'s claims: models that answer by the conversation, runs driven to their end,
a run held to its proof, and the ``check`` command run in this process."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from fsm_agent import Agent, AgentLoopError
from fsm_agent.proof import Proof
from fsm_agent.records import Message, ModelResponse, RunResult
from fsm_agent.testing import edge_id


class ByTurn:
    """A model whose reply depends only on the turn of the run it is asked in (so one object serves many runs).

    ``turns(n)`` is the reply to the n-th model call of a run (n from 0, counted by the assistant messages sent);
    ``calls`` counts every call made, across runs.
    """

    def __init__(self, turns: Callable[[int], ModelResponse]) -> None:
        self.turns = turns
        self.calls = 0

    def complete(self, messages: Sequence[Message], tools: object) -> ModelResponse:
        """The reply for the turn the conversation is at."""
        self.calls += 1
        return self.turns(sum(1 for message in messages if message.role == "assistant"))


def ended(agent: Agent, driver: str, text: str = "q") -> RunResult:
    """Run ``agent`` to its end on the ``sync`` or ``async`` driver; a stop's result is returned, not raised."""
    try:
        return agent.run(text) if driver == "sync" else asyncio.run(agent.arun(text))
    except AgentLoopError as stop:
        return stop.result


def ending(result: RunResult) -> str:
    """The label of the edge the run ended on: ``done`` for Done (a finalized run's too), else the stop reason."""
    last = result.trace[-1]
    return "done" if last.dest == "Done" else str(last.reason)


def hold_to(proof: Proof, result: RunResult, model_calls: int) -> None:
    """Assert each claim the proof makes of one real run: bounds, its ending reachable, no dead row taken."""
    shown = [edge_id(edge) for edge in result.trace]
    assert proof.ok
    assert proof.model_calls is not None
    assert model_calls <= proof.model_calls, shown
    if proof.bound is not None:
        assert len(result.trace) <= proof.bound, shown
    assert ending(result) in proof.reachable, shown
    assert ending(result) not in proof.unreachable, shown
    dead = {row.entry for row in proof.dead_rows}
    assert not dead & set(result.trace), [edge_id(edge) for edge in dead & set(result.trace)]


def command(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    module: str,
    source: str,
    *args: str,
) -> tuple[int, str, str]:
    """``python -m fsm_agent check`` run in this process on ``module`` (written with ``source`` into ``tmp_path``).

    Returns the exit code, stdout and stderr; the module and the path the command adds are taken back after.
    """
    from fsm_agent.cli.main import main

    (tmp_path / f"{module}.py").write_text(source, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command puts the current directory first
    try:
        code = main(["check", *args])
    finally:
        sys.modules.pop(module, None)
    out, err = capsys.readouterr()
    return code, out, err
