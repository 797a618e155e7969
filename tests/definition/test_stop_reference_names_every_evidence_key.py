"""The stop reference (docs/concepts/stops.md, rendered from the catalogue) names every key a stop's evidence holds.

A key the evidence holds and the reference leaves out is data a reader cannot
know is there, so each built-in stop is run once and its evidence's keys are
looked for, in backquotes, in the row the reference renders for it.  Only
``step`` and ``counters``, which every stop's evidence holds, are said once
for all, below the table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from support.scenarios import OVERFLOW, POINT

from fsm_agent import TABLE, Agent, AgentLoopError, CancelToken, RunResult, Usage
from fsm_agent.render.markdown import reasons_table
from fsm_agent.testing import (
    CounterModel,
    FakeModel,
    LoopingModel,
    ManualClock,
    demo_registry,
    reply,
    tool_call,
    tool_turn,
)

EVERY_STOP = {"step", "counters"}
"""The keys every stop's evidence holds, which the page says once, under the table."""


def _cancelled() -> Any:
    token = CancelToken()
    token.cancel("not needed")
    return Agent(FakeModel([reply("x")]), demo_registry()).run("q", cancel=token)


def _timeout() -> Any:
    clock = ManualClock()
    registry = demo_registry()
    registry.register(lambda: clock.advance(10), name="wait")
    return Agent(FakeModel([tool_turn(tool_call("wait")), reply("x")]), registry, timeout=5, clock=clock).run("q")


RUNS: dict[str, Callable[[], Any]] = {
    "max_tokens": lambda: Agent(FakeModel([reply("cut", stop_reason="max_tokens")]), demo_registry()).run("q"),
    "refusal": lambda: Agent(FakeModel([reply("no", stop_reason="refusal")]), demo_registry()).run("q"),
    "model_error": lambda: Agent(FakeModel([ConnectionError("down")]), demo_registry()).run("q"),
    "context_overflow": lambda: Agent(FakeModel([OVERFLOW]), demo_registry()).run("q"),
    "output_invalid": lambda: Agent(FakeModel([reply("{}"), reply("[]")]), demo_registry(), output_type=POINT).run("q"),
    "max_steps": lambda: Agent(CounterModel(), demo_registry(), max_steps=2).run("q"),
    "repeated_action": lambda: Agent(LoopingModel(tool_call("echo", text="ping")), demo_registry()).run("q"),
    "max_tool_calls": lambda: Agent(
        FakeModel([tool_turn(tool_call("echo", text="1"), tool_call("echo", text="2"))]),
        demo_registry(),
        max_tool_calls=1,
    ).run("q"),
    "tool_failures": lambda: Agent(
        FakeModel([tool_turn(tool_call("fail", reason=str(i))) for i in range(3)]), demo_registry()
    ).run("q"),
    "cycle": lambda: Agent(FakeModel([tool_turn(*(tool_call("echo", text=t) for t in "abab"))]), demo_registry()).run(
        "q"
    ),
    "token_budget": lambda: Agent(
        FakeModel([tool_turn(tool_call("echo", text="1"), usage=Usage(5, 5))]), demo_registry(), token_budget=10
    ).run("q"),
    "cancelled": _cancelled,
    "timeout": _timeout,
}


def _named(reason: str) -> set[str]:
    """The words in backquotes in the reference's evidence cell for ``reason``."""
    row = next(line for line in reasons_table(TABLE).splitlines() if line.startswith(f"| `{reason}` |"))
    evidence = row.split(" | ")[3]
    return set(re.findall(r"`([^`]+)`", evidence))


@pytest.mark.parametrize("reason", RUNS)
def test_every_key_of_a_stop_s_evidence_is_named_in_the_stop_reference(reason: str) -> None:
    """Run the stop: each key of its evidence is in the reference's row for it (nothing it hands over is hidden)."""
    try:
        result: RunResult = RUNS[reason]()
    except AgentLoopError as stop:
        result = stop.result
    assert result.reason == reason
    unnamed = set(result.evidence) - EVERY_STOP - _named(reason)
    assert not unnamed, f"{reason}'s evidence holds {sorted(unnamed)}, which the stop reference does not name"


def test_the_evidence_a_stop_keeps_of_its_reply_names_its_stop_reason() -> None:
    """``max_tokens`` and ``refusal`` keep the reply's ``stop_reason`` in their evidence, and the reference says so."""
    for reason in ("max_tokens", "refusal"):
        stop = RUNS[reason]
        with pytest.raises(AgentLoopError) as info:
            stop()
        assert info.value.evidence["stop_reason"] == reason
        assert "stop_reason" in _named(reason)
