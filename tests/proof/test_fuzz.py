"""``check``'s bounds, reachable stops and dead rows against generated real runs, on both drivers.

Each example is an agent with generated limits, policies, typed answer, compaction, stop conditions, approvals,
strict hooks, a cancel token and a sub-agent, and a scripted model (replies with up to 3 calls, answers, cut-off
replies, refusals, errors, overflows, usage).  The run is driven to its end (decisions given when it pauses) and
held to the proof of that agent, with ``calls_per_reply`` the script's widest reply: model calls, transitions,
the ending reason, the rows taken, and no held call run undecided.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm_agent import (
    Agent,
    CancelToken,
    ContextOverflowError,
    Message,
    ModelResponse,
    Retry,
    StopCondition,
    ToolCall,
    ToolRegistry,
    Usage,
)
from fsm_agent.proof import check
from fsm_agent.records import RunResult
from fsm_agent.testing import FakeModel, ManualClock, edge_id, reply, tool_turn

FINALIZABLE = ["max_steps", "max_tool_calls", "timeout", "token_budget", "cycle", "repeated_action"]
RETURNABLE = ["max_steps", "tool_failures", "model_error", "max_tokens", "refusal", "repeated_action", "cycle"]
TOOLS = ["t", "t", "f", "slow", "cancel", "sub"]

_call = st.tuples(st.sampled_from(TOOLS), st.sampled_from("ab"))
_item = st.one_of(
    st.tuples(st.just("calls"), st.lists(_call, min_size=1, max_size=3)),
    st.tuples(st.just("calls"), st.lists(_call, min_size=1, max_size=3)),
    st.tuples(st.just("calls"), st.lists(_call, min_size=1, max_size=3)),
    st.tuples(st.just("answer"), st.sampled_from(["good", "retry", "broken"])),
    st.tuples(st.sampled_from(["trunc", "refusal", "error", "overflow"])),
)


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    """One generated agent and script."""
    return {
        "script": draw(st.lists(st.tuples(_item, st.integers(0, 40)), min_size=1, max_size=12)),
        "max_steps": draw(st.integers(1, 5)),
        "failures": draw(st.integers(1, 3)),
        "caps": draw(
            st.one_of(
                st.none(),
                st.integers(0, 6),
                st.dictionaries(st.sampled_from(["t", "f", "*"]), st.integers(0, 3), max_size=2),
            )
        ),
        "cycle_window": draw(st.sampled_from([0, 4, 6])),
        "token_budget": draw(st.one_of(st.none(), st.integers(1, 100))),
        "timeout": draw(st.one_of(st.none(), st.sampled_from([5.0, 25.0]))),
        "finalize": draw(st.lists(st.sampled_from(FINALIZABLE), unique=True)),
        "return": draw(st.lists(st.sampled_from(RETURNABLE), unique=True)),
        "typed": draw(st.booleans()),
        "retries": draw(st.integers(0, 2)),
        "compact": draw(st.booleans()),
        "stops": draw(
            st.lists(
                st.tuples(
                    st.sampled_from(["AwaitModel", "CheckTruncation", "Dispatch", "ExecuteTool", "input", "answer"]),
                    st.lists(st.sampled_from([False, False, False, True, "raise"]), min_size=1, max_size=5),
                ),
                max_size=2,
            )
        ),
        "approve": draw(st.sampled_from([None, "t", "all"])),
        "decisions": draw(st.lists(st.booleans(), min_size=1, max_size=4)),
        "hook_turn": draw(st.one_of(st.none(), st.integers(1, 4))),
        "child_stop": draw(st.sampled_from(["error", "raise"])),
    }


class Model:
    """Plays the script; past its end, raises (a model_error)."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls = 0

    def complete(self, messages: object, tools: object) -> ModelResponse:
        self.calls += 1
        if self.calls > len(self.script):
            msg = "script exhausted"
            raise RuntimeError(msg)
        (kind, *rest), tokens = self.script[self.calls - 1]
        usage = Usage(tokens, 0) if tokens else None
        if kind == "calls":
            calls = tuple(
                ToolCall(f"c{self.calls}_{i}", name, _args(name, arg)) for i, (name, arg) in enumerate(rest[0])
            )
            return ModelResponse(Message("assistant", "", calls), "tool_use", usage)
        if kind == "answer":
            return ModelResponse(Message("assistant", rest[0]), "end_turn", usage)
        if kind in ("trunc", "refusal"):
            return ModelResponse(Message("assistant", "cut"), "max_tokens" if kind == "trunc" else "refusal", usage)
        if kind == "error":
            msg = "the model call failed"
            raise RuntimeError(msg)
        msg = "too long"
        raise ContextOverflowError(msg)


def _args(name: str, arg: str) -> dict[str, str]:
    return {"input": arg} if name == "sub" else {"x": arg}


def _validator(value: str) -> str:
    if value == "retry":
        raise Retry("again")
    if value == "broken":
        msg = "the check broke"
        raise RuntimeError(msg)
    return value


class World:
    """The agent of a case, its clock, cancel token and counts of what ran."""

    def __init__(self, case: dict[str, Any]) -> None:
        self.case = case
        self.clock = ManualClock()
        self.token = CancelToken()
        self.runs: Counter[str] = Counter()
        self.decided: dict[str, bool] = {}
        self.undecided: list[str] = []
        self.model = Model(case["script"])
        self.agent = self._build()

    def _tool(self, name: str, call_id: str) -> None:
        self.runs[call_id] += 1
        held = self.case["approve"] == "all" or (self.case["approve"] == "t" and name == "t")
        if held and self.decided.get(call_id) is not True:
            self.undecided.append(call_id)

    def _build(self) -> Agent:
        case = self.case
        registry = ToolRegistry()

        def t(x: str, call_id: str) -> str:
            """Same result for the same argument."""
            self._tool("t", call_id)
            return "same " + x

        def f(x: str, call_id: str) -> str:
            """Always fails."""
            self._tool("f", call_id)
            msg = "it fails"
            raise RuntimeError(msg)

        def slow(x: str, call_id: str) -> str:
            """Takes ten seconds of the clock."""
            self._tool("slow", call_id)
            self.clock.advance(10)
            return "slow " + x

        def cancel(x: str, call_id: str) -> str:
            """Cancels the run's token."""
            self._tool("cancel", call_id)
            self.token.cancel("asked")
            return "cancelled"

        for tool in (t, f, slow, cancel):
            registry.register(tool)
        child = Agent(FakeModel(tool_turn(), reply("child answer")), ToolRegistry(), max_steps=1)
        registry.register(child.as_tool("sub", "a sub-agent", on_child_stop=case["child_stop"]))
        stops = []
        for n, (at, answers) in enumerate(case["stops"]):
            said = itertools.cycle(answers)

            def asked(view: object, said: itertools.cycle[Any] = said) -> bool:
                answer = next(said)
                if answer == "raise":
                    msg = "the check raised"
                    raise ValueError(msg)
                return bool(answer)

            asked.__name__ = f"asked_{n}"
            stops.append(StopCondition(f"user_{n}", at, asked))
        on_stop: dict[str, str] = dict.fromkeys(case["finalize"], "finalize")
        for reason in case["return"]:
            on_stop.setdefault(reason, "return")
        extra: dict[str, Any] = {}
        if case["typed"]:
            extra = {"output_type": str, "output_validators": [_validator], "output_retries": case["retries"]}
        if case["compact"]:
            on_stop["context_overflow"] = "compact"
            extra["compact"] = lambda messages: list(messages[-1:])
        approve = {"all": lambda call: True, "t": {"t"}, None: None}[case["approve"]]
        agent = Agent(
            self.model,
            registry,
            max_steps=case["max_steps"],
            max_consecutive_failures=case["failures"],
            max_tool_calls=case["caps"],
            cycle_window=case["cycle_window"],
            token_budget=case["token_budget"],
            timeout=case["timeout"],
            clock=self.clock,
            stop_conditions=stops,
            on_stop=on_stop,  # type: ignore[arg-type]
            approve=approve,  # type: ignore[arg-type]
            strict_hooks=case["hook_turn"] is not None,
            **extra,
        )
        if case["hook_turn"] is not None:

            def hook(event: Any) -> None:
                if event.turn == case["hook_turn"]:
                    msg = "the hook raised"
                    raise RuntimeError(msg)

            agent.on("after_model", hook)
        return agent

    def decide(self, run: Any, answers: itertools.cycle[bool]) -> None:
        waiting = {call.id: next(answers) for call in run.awaiting()}
        self.decided.update(waiting)
        run.decide(waiting)

    def drive(self, driver: str) -> RunResult:
        answers = itertools.cycle(self.case["decisions"])
        if driver == "sync":
            run = self.agent.start("q", cancel=self.token)
            while not run.done:
                if run.paused:
                    self.decide(run, answers)
                else:
                    run.advance()
            return run.result

        async def go() -> RunResult:
            arun = await self.agent.astart("q", cancel=self.token)
            while not arun.done:
                if arun.paused:
                    self.decide(arun, answers)
                else:
                    await arun.aadvance()
            return arun.result

        return asyncio.run(go())


def _widest(case: dict[str, Any]) -> int:
    return max([len(item[1]) for item, _ in case["script"] if item[0] == "calls"] or [1])


def _hold_to_the_proof(case: dict[str, Any], driver: str) -> None:
    world = World(case)
    proof = check(world.agent, calls_per_reply=_widest(case))
    result = world.drive(driver)
    trace = list(result.trace)
    shown = [edge_id(edge) for edge in trace]
    last = trace[-1]
    ending = "done" if last.dest == "Done" else last.reason
    assert proof.ok
    assert proof.model_calls is not None
    assert world.model.calls <= proof.model_calls, shown
    if proof.bound is not None:
        assert len(trace) <= proof.bound, shown
    assert ending in proof.reachable, shown
    dead = {row.entry for row in proof.dead_rows}
    assert not dead & set(trace), shown
    assert proof.approval_safe
    assert world.undecided == []
    assert all(n == 1 for n in world.runs.values())  # no call runs twice in one process


PROFILE = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


@PROFILE
@given(cases())
def test_generated_sync_runs_stay_within_their_proof(case: dict[str, Any]) -> None:
    """``agent.run``'s driver, stepped: within the proof's bounds, on its reachable endings, off its dead rows."""
    _hold_to_the_proof(case, "sync")


@PROFILE
@given(cases())
def test_generated_async_runs_stay_within_their_proof(case: dict[str, Any]) -> None:
    """``agent.arun``'s driver (parallel batches), stepped: the same."""
    _hold_to_the_proof(case, "async")
