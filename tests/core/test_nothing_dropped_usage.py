"""A run's usage totals every part of its calls' usage: the cached and reasoning tokens as well as the totals."""

from __future__ import annotations

from fsm_agent import Agent, RunResult, Usage
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn


def _run() -> RunResult:
    model = FakeModel(
        tool_turn(tool_call("add", a=1, b=2), usage=Usage(100, 40, cache_read_tokens=60, reasoning_tokens=30)),
        reply("3", usage=Usage(120, 5, cache_read_tokens=90, cache_write_tokens=10, reasoning_tokens=2)),
    )
    return Agent(model, demo_registry()).run("1+2?")


def test_a_runs_usage_totals_its_calls_input_and_output_tokens() -> None:
    """The totals the engine counts: input and output tokens of every call."""
    usage = _run().usage
    assert (usage.input_tokens, usage.output_tokens) == (220, 45)


def test_a_runs_usage_totals_its_calls_cached_and_reasoning_tokens() -> None:
    """Usage's docstring: RunResult.usage totals the tokens of its calls; the parts of them are tokens too."""
    usage = _run().usage
    assert (usage.cache_read_tokens, usage.cache_write_tokens, usage.reasoning_tokens) == (150, 10, 32)
