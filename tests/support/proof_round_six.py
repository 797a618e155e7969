"""Helpers for the sixth audit of ``check``'s claims: generated agents (limits, budgets, policies, typed answers,
compaction, strict hooks, sub-agents), their scripted models, runs driven and resumed on either driver, and each
attempt held to the proof of the limits it ran under."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from fsm_agent import Agent, ContextOverflowError, Message, ModelResponse, Retry, ToolCall, ToolRegistry, Usage
from fsm_agent.core.pricing import Price
from fsm_agent.proof import Proof
from fsm_agent.records import RunResult, Transition
from fsm_agent.testing import ManualClock, edge_id

FINALIZABLE = ("max_steps", "max_tool_calls", "timeout", "token_budget", "cost_budget", "cycle", "repeated_action")
HOOKS = ("before_model", "after_model", "before_tool", "after_tool", "transition")
PRICE = Price(input_per_mtok=1000, output_per_mtok=1000)
"""A thousand dollars a million tokens: ten tokens cost a cent."""

Item = tuple[tuple[Any, ...], int, float | None]
"""One scripted reply: ``(kind, *what)``, its input tokens, its own cost (None: priced by the agent)."""


def response(item: Item, turn: int) -> ModelResponse:
    """The reply ``item`` scripts for the model call ``turn`` (from 1); errors and overflows are raised."""
    (kind, *rest), tokens, cost = item
    usage = Usage(tokens, 0, cost=cost) if tokens or cost is not None else None
    if kind == "calls":
        calls = tuple(ToolCall(f"c{turn}_{i}", name, {"x": arg}) for i, (name, arg) in enumerate(rest[0]))
        return ModelResponse(Message("assistant", "", calls), "tool_use", usage)
    if kind == "answer":
        return ModelResponse(Message("assistant", rest[0]), "end_turn", usage)
    if kind in ("trunc", "refusal"):
        return ModelResponse(Message("assistant", "cut"), "max_tokens" if kind == "trunc" else "refusal", usage)
    if kind == "unknown_stop":  # an unusable reply whose call stays pending
        calls = (ToolCall(f"u{turn}", "t", {"x": "u"}),)
        return ModelResponse(Message("assistant", "", calls), "weird", usage)
    if kind == "bad_usage":
        return ModelResponse(Message("assistant", "x"), "end_turn", Usage(-1, 0))
    if kind == "error":
        msg = "the model call failed"
        raise RuntimeError(msg)
    msg = "too long"
    raise ContextOverflowError(msg)


class Scripted:
    """Plays its script call by call across the run and its resumes; past its end it answers ``good``."""

    def __init__(self, script: Sequence[Item]) -> None:
        self.script = list(script)
        self.calls = 0

    def complete(self, messages: object, tools: object) -> ModelResponse:
        """The next scripted reply."""
        self.calls += 1
        if self.calls > len(self.script):
            return ModelResponse(Message("assistant", "good"), "end_turn", None)
        return response(self.script[self.calls - 1], self.calls)


class ByTurnScripted:
    """Plays its script by the turn the conversation is at, so one object serves every sub-agent run."""

    def __init__(self, script: Sequence[Item]) -> None:
        self.script = list(script)

    def complete(self, messages: Sequence[Message], tools: object) -> ModelResponse:
        """The reply scripted for the number of assistant messages so far."""
        n = sum(1 for message in messages if message.role == "assistant")
        if n >= len(self.script):
            return ModelResponse(Message("assistant", "good"), "end_turn", None)
        return response(self.script[n], n + 1)


class WithSubAgents(Scripted):
    """``Scripted``, with ``subs`` calls of the ``sub`` tool put first in each reply that asks for tools."""

    def __init__(self, script: Sequence[Item], subs: int) -> None:
        super().__init__(script)
        self.subs = subs

    def complete(self, messages: object, tools: object) -> ModelResponse:
        """The scripted reply, with the sub-agent calls added."""
        answer = super().complete(messages, tools)
        if not answer.message.tool_calls:
            return answer
        subs = tuple(ToolCall(f"s{self.calls}_{i}", "sub", {"input": f"go {i}"}) for i in range(self.subs))
        message = Message("assistant", "", subs + answer.message.tool_calls)
        return ModelResponse(message, answer.stop_reason, answer.usage)


def validator(value: str) -> str:
    """``retry`` is sent back, ``broken`` breaks the check, anything else passes."""
    if value == "retry":
        raise Retry("again")
    if value == "broken":
        msg = "the check broke"
        raise RuntimeError(msg)
    return value


def registry(clock: ManualClock) -> ToolRegistry:
    """``t`` (the same result for the same argument), ``f`` (always fails), ``slow`` (ten seconds of the clock)."""
    tools = ToolRegistry()

    def t(x: str) -> str:
        """Same result for the same argument."""
        return "same " + x

    def f(x: str) -> str:
        """Always fails."""
        msg = "it fails"
        raise RuntimeError(msg)

    def slow(x: str) -> str:
        """Takes ten seconds of the clock."""
        clock.advance(10)
        return "slow " + x

    for tool in (t, f, slow):
        tools.register(tool)
    return tools


def agent_of(case: dict[str, Any], model: object, tools: ToolRegistry, clock: ManualClock) -> Agent:
    """The agent a generated ``case`` describes (limits, policies, typed answer, compaction, a strict hook)."""
    on_stop: dict[str, str] = dict.fromkeys(case.get("finalize", ()), "finalize")
    extra: dict[str, Any] = {}
    if case.get("typed"):
        extra = {"output_type": str, "output_validators": [validator], "output_retries": case.get("retries", 1)}
    if case.get("compact"):
        on_stop["context_overflow"] = "compact"
        works = case["compact"] == "ok"
        extra["compact"] = (lambda messages: list(messages[-1:])) if works else (lambda messages: 3)
    hook = case.get("hook")
    agent = Agent(
        model,  # type: ignore[arg-type]
        tools,
        max_steps=case["max_steps"],
        max_consecutive_failures=case.get("failures", 3),
        max_tool_calls=case.get("caps"),
        cycle_window=case.get("cycle_window", 6),
        token_budget=case.get("token_budget"),
        cost_budget=case.get("cost_budget"),
        timeout=case.get("timeout"),
        clock=clock,
        on_stop=on_stop,  # type: ignore[arg-type]
        strict_hooks=hook is not None,
        prices=PRICE,
        **extra,
    )
    if hook is not None:
        name, nth = hook
        heard = [0]

        def raising(event: object) -> None:
            heard[0] += 1
            if heard[0] == nth:
                msg = "the hook raised"
                raise RuntimeError(msg)

        agent.on(name, raising)
    return agent


def widest(script: Sequence[Item], extra: int = 0) -> int:
    """The most tool calls one scripted reply asks for (``extra`` added to each that asks for some)."""
    return max([len(item[1]) + extra for item, _, _ in script if item[0] == "calls"] or [1])


def driven(agent: Agent, driver: str, resumed: RunResult | None = None, **resume: Any) -> RunResult:
    """A run of ``agent`` (or ``resumed`` resumed with ``resume``'s arguments) stepped to its end on ``driver``."""
    if driver == "sync":
        run = agent.start("q") if resumed is None else agent.resume(resumed, **resume)
        while not run.done:
            run.advance()
        return run.result

    async def go() -> RunResult:
        arun = await (agent.astart("q") if resumed is None else agent.aresume(resumed, **resume))
        while not arun.done:
            await arun.aadvance()
        return arun.result

    return asyncio.run(go())


def model_calls_in(trace: Sequence[Transition]) -> int:
    """The model calls a trace records: the edges out of ``AwaitModel`` on a reply or a failed call."""
    return sum(1 for edge in trace if edge.source == "AwaitModel" and edge.trigger in ("replied", "model_failed"))


def hold_attempt(
    proof: Proof, attempt: Sequence[Transition], model_calls: int, said: object, *, resumed: bool = False
) -> None:
    """One attempt (its edges after any ``resume`` edge) within ``proof``: bound, model calls, ending, live rows.

    A ``resumed`` attempt is held to its bound, its own model calls (those its trace records; ``model_calls``,
    the run's count, adds up over attempts) and live rows: it starts where the last one stopped, its counters
    carried over, so it may end on a stop no first attempt reaches, by a row dead to a first attempt (proof.md,
    "What it does not prove"), which the generated resumes have not met.
    """
    shown = (said, [edge_id(edge) for edge in attempt])
    assert proof.ok, shown
    assert proof.model_calls is not None
    if proof.bound is not None:
        assert len(attempt) <= proof.bound, (len(attempt), proof.bound, shown)
    dead = {row.entry for row in proof.dead_rows}
    assert not dead & set(attempt), ([edge_id(edge) for edge in dead & set(attempt)], shown)
    if resumed:
        made = model_calls_in(attempt)
        assert made <= proof.model_calls, (made, proof.model_calls, shown)
        return
    assert model_calls <= proof.model_calls, (model_calls, proof.model_calls, shown)
    last = attempt[-1]
    ending = "done" if last.dest == "Done" else str(last.reason)
    assert ending in proof.reachable, (ending, proof.reachable, shown)
    assert ending not in proof.unreachable, shown
