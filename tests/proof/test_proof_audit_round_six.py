"""``check``'s claims held to real runs, sixth round: resumes after a finalize call, and generated agents the
earlier fuzz does not make (cost budgets, compaction that fails, unusable replies, a strict hook on any event,
replies wider than the cap left to the default ``calls_per_reply``, resumes under lifted limits, and sub-agent
runs held to ``Proof.children``), on both drivers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.hypothesis_profiles import examples
from support.proof_round_six import (
    FINALIZABLE,
    HOOKS,
    ByTurnScripted,
    Scripted,
    WithSubAgents,
    agent_of,
    driven,
    hold_attempt,
    model_calls_in,
    registry,
    widest,
)

from fsm_agent import Agent, AgentLoopError, ToolRegistry
from fsm_agent.proof import check
from fsm_agent.records import RunResult
from fsm_agent.testing import ManualClock, edge_id, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
_PROOF_PAGE = (Path(__file__).parents[2] / "docs" / "concepts" / "proof.md").read_text(encoding="utf-8")


class _Turns:
    """Replies by the number of model calls made so far, across the run and its resumes; counts them."""

    def __init__(self, *replies: Any) -> None:
        self.replies = replies
        self.calls = 0

    def complete(self, messages: object, tools: object) -> Any:
        self.calls += 1
        said = self.replies[min(self.calls, len(self.replies)) - 1]
        if isinstance(said, Exception):
            raise said
        return said


def _echoing() -> ToolRegistry:
    tools = ToolRegistry()

    def echo(text: str) -> str:
        """Returns its text."""
        return text

    tools.register(echo)
    return tools


def _ended(agent: Agent, driver: str, resumed: RunResult | None = None, **resume: Any) -> RunResult:
    try:
        return driven(agent, driver, resumed, **resume)
    except AgentLoopError as stop:
        return stop.result


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_resumed_after_a_failed_finalize_may_finalize_again_within_the_model_calls_of_each_attempt(
    driver: str,
) -> None:
    """``max_steps=1``, ``max_tool_calls=0``, both finalized.  The first reply's call meets the cap: a finalize call
    (the second model call) asks for a tool anyway (``finalize_failed``; the reason stays ``max_tool_calls``).
    Resumed with ``max_tool_calls=3``, which lifts that stop: the finalize reply's call runs, ``max_steps`` is met
    and finalized with a third model call.  Each attempt stays within ``check``'s ``model_calls`` under its limits
    (2); over both the run makes 3, as proof.md says attempts add up."""
    model = _Turns(tool_turn(tool_call("echo", text="a")), tool_turn(tool_call("echo", text="b")), reply("what I have"))
    on_stop: Any = {"max_tool_calls": "finalize", "max_steps": "finalize"}
    agent = Agent(model, _echoing(), max_steps=1, max_tool_calls=0, on_stop=on_stop)
    first = _ended(agent, driver)
    assert first.reason == "max_tool_calls"
    assert edge_id(first.trace[-1]) == "Dispatch->Failed[finalize_failed]"
    hold_attempt(check(agent), first.trace, model.calls, "first")
    again = _ended(agent, driver, first, max_tool_calls=3)
    attempt = list(again.trace[len(first.trace) :])
    assert edge_id(attempt[0]) == "Failed->Dispatch[resumes_before_tool]"
    proof = check(agent, max_tool_calls=3)
    assert proof.model_calls == 2  # max_steps, and one finalize call
    assert again.reason == "max_steps"  # answered by a finalize call of its own
    hold_attempt(proof, attempt[1:], model.calls, "resumed", resumed=True)
    assert model.calls == 3 > proof.model_calls
    assert "Across attempts they add up" in _PROOF_PAGE


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_retried_after_a_model_error_makes_the_model_calls_of_each_attempt(driver: str) -> None:
    """``max_steps=2``, ``max_tool_calls=0``: ``check`` proves at most 1 model call (a reply asking for a tool stops
    on the cap, one without ends the run).  The first call raises (``model_error``); resumed with ``retry=True``
    and the same limits, the second call answers: 1 call an attempt, 2 over the run."""
    model = _Turns(RuntimeError("the provider is down"), reply("the answer"))
    agent = Agent(model, _echoing(), max_steps=2, max_tool_calls=0)
    proof = check(agent)
    assert proof.model_calls == 1
    first = _ended(agent, driver)
    assert first.reason == "model_error"
    hold_attempt(proof, first.trace, model.calls, "first")
    again = _ended(agent, driver, first, retry=True)
    assert again.ok
    assert again.final == "the answer"
    attempt = list(again.trace[len(first.trace) :])
    assert edge_id(attempt[0]) == "Failed->AwaitModel[retries_model_call]"
    hold_attempt(proof, attempt[1:], model.calls, "retried", resumed=True)
    assert model.calls == 2


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_retried_under_the_same_limits_may_end_on_a_stop_no_first_attempt_reaches(driver: str) -> None:
    """``max_steps=2``, ``max_tool_calls=1``: ``check`` calls ``max_steps`` unreachable (a second turn that asks
    for a tool meets the cap first).  The first call raises; resumed with ``retry=True`` (no limit changed), the
    second call asks for one tool, which runs, and the run stops on ``max_steps`` with turns 2 of 2: its turns
    carried over.  proof.md bounds ``unreachable`` to a run's first attempt, with this very case."""
    model = _Turns(RuntimeError("the provider is down"), tool_turn(tool_call("echo", text="a")), reply("done"))
    agent = Agent(model, _echoing(), max_steps=2, max_tool_calls=1)
    proof = check(agent)
    assert "max_steps" in proof.unreachable
    first = _ended(agent, driver)
    assert first.reason == "model_error"
    hold_attempt(proof, first.trace, model.calls, "first")
    again = _ended(agent, driver, first, retry=True)
    attempt = list(again.trace[len(first.trace) :])
    assert edge_id(again.trace[-1]) == "ExecuteTool->Failed[max_steps]"
    assert len(attempt) - 1 <= (proof.bound or 0)
    assert model_calls_in(attempt) <= (proof.model_calls or 0)
    assert again.trace[-1] in {row.entry for row in proof.dead_rows}  # dead for a first attempt only
    page = " ".join(_PROOF_PAGE.split())
    assert "unreachable is unreachable and a dead row is never taken, from a run's start to its first stop" in page
    assert "retried after a failed first model call, a run can use up `max_steps`" in page


# --- generated agents, resumed under lifted limits -----------------------------------------------------------------

_call = st.tuples(st.sampled_from(["t", "t", "f", "slow"]), st.sampled_from("abc"))
_item = st.one_of(
    st.tuples(st.just("calls"), st.lists(_call, min_size=1, max_size=5)),
    st.tuples(st.just("calls"), st.lists(_call, min_size=1, max_size=2)),
    st.tuples(st.just("answer"), st.sampled_from(["good", "retry", "broken"])),
    st.tuples(st.sampled_from(["trunc", "refusal", "error", "overflow", "unknown_stop", "bad_usage"])),
)
_replies = st.lists(st.tuples(_item, st.integers(0, 40), st.sampled_from([None, 0.0, 0.01, 0.05])), max_size=10)


@st.composite
def _cases(draw: st.DrawFn) -> dict[str, Any]:
    """One generated agent, its script, and how often a stopped run of it is resumed (lifting its stop)."""
    return {
        "script": draw(_replies.filter(bool)),
        "max_steps": draw(st.integers(1, 4)),
        "failures": draw(st.integers(1, 3)),
        "caps": draw(
            st.one_of(
                st.none(),
                st.integers(0, 5),
                st.dictionaries(st.sampled_from(["t", "f", "slow", "*"]), st.integers(0, 3), max_size=3),
            )
        ),
        "cycle_window": draw(st.sampled_from([0, 4, 6])),
        "token_budget": draw(st.one_of(st.none(), st.integers(1, 100))),
        "cost_budget": draw(st.one_of(st.none(), st.sampled_from([0.02, 0.1]))),
        "timeout": draw(st.one_of(st.none(), st.sampled_from([5.0, 25.0]))),
        "finalize": draw(st.lists(st.sampled_from(FINALIZABLE), unique=True)),
        "typed": draw(st.booleans()),
        "retries": draw(st.integers(0, 2)),
        "compact": draw(st.sampled_from([None, "ok", "fails"])),
        "hook": draw(st.one_of(st.none(), st.tuples(st.sampled_from(HOOKS), st.integers(1, 6)))),
        "resumes": draw(st.integers(0, 3)),
    }


LIFTS = {"max_steps", "token_budget", "cost_budget", "timeout", "max_tool_calls"}


def _lifted(agent: Agent, reason: str, limits: dict[str, Any]) -> dict[str, Any]:
    """``limits`` with the limit that stopped the run (``reason``) raised past what it was; as they were else."""
    own = agent.limits
    if reason == "max_steps":
        return {**limits, reason: limits.get(reason, own.max_steps) + 2}
    if reason in ("token_budget", "cost_budget", "timeout"):
        return {**limits, reason: limits.get(reason, getattr(own, reason)) * 3}
    caps = limits.get("max_tool_calls", own.max_tool_calls)
    if reason != "max_tool_calls":
        return limits
    if isinstance(caps, int):
        return {**limits, "max_tool_calls": caps + 3}
    # A per-tool cap met: every cap raised.
    return {**limits, "max_tool_calls": {name: cap + 3 for name, cap in caps.items()}}


def _hold_generated(case: dict[str, Any], driver: str) -> None:
    clock = ManualClock()
    model = Scripted(case["script"])
    agent = agent_of(case, model, registry(clock), clock)
    # The default calls_per_reply where a total cap bounds the replies (which may be wider than it), else the widest.
    wide = None if agent.limits.total_tool_calls is not None else widest(case["script"])
    result = _ended(agent, driver)
    hold_attempt(check(agent, calls_per_reply=wide), result.trace, model.calls, "first attempt")
    limits: dict[str, Any] = {}
    for _ in range(case["resumes"]):
        if result.trace[-1].dest != "Failed":
            break
        retry = result.reason in ("model_error", "context_overflow")
        if not retry and result.reason not in LIFTS | {"cancelled"}:
            break  # a stop no resume continues
        limits = _lifted(agent, str(result.reason), limits)
        try:
            again = _ended(agent, driver, result, retry=retry, **limits)
        except ValueError:
            break  # another limit still forbids the next call
        attempt = list(again.trace[len(result.trace) :])
        assert attempt[0].trigger == "resume"
        proof = check(agent, calls_per_reply=wide, **limits)
        hold_attempt(proof, attempt[1:], model.calls, ("resumed", limits), resumed=True)
        result = again


PROFILE = settings(
    max_examples=examples(150), deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


@PROFILE
@given(_cases())
def test_generated_runs_and_their_resumes_stay_within_the_proof_of_their_limits_sync(case: dict[str, Any]) -> None:
    """``agent.run``'s driver: each attempt within the proof of the limits it ran under (model calls counted over
    the run, as its counters carry over), on a reachable ending, off the dead rows."""
    _hold_generated(case, "sync")


@PROFILE
@given(_cases())
def test_generated_runs_and_their_resumes_stay_within_the_proof_of_their_limits_async(case: dict[str, Any]) -> None:
    """``agent.arun``'s driver (parallel batches): the same."""
    _hold_generated(case, "async")


# --- sub-agent runs held to Proof.children -------------------------------------------------------------------------

_child_item = st.one_of(
    st.tuples(
        st.just("calls"),
        st.lists(st.tuples(st.sampled_from(["t", "f", "slow"]), st.sampled_from("ab")), max_size=3).filter(bool),
    ),
    st.tuples(st.just("answer"), st.sampled_from(["good", "retry"])),
    st.tuples(st.sampled_from(["trunc", "error", "overflow"])),
)


def _limits(draw: st.DrawFn, keys: list[str]) -> dict[str, Any]:
    return {
        "max_steps": draw(st.integers(1, 3)),
        "caps": draw(
            st.one_of(
                st.none(), st.integers(0, 5), st.dictionaries(st.sampled_from(keys), st.integers(0, 4), max_size=2)
            )
        ),
        "token_budget": draw(st.one_of(st.none(), st.integers(1, 80))),
        "cost_budget": draw(st.one_of(st.none(), st.sampled_from([0.02, 0.1]))),
        "timeout": draw(st.one_of(st.none(), st.sampled_from([5.0, 25.0]))),
        "finalize": draw(st.lists(st.sampled_from(FINALIZABLE), unique=True)),
        "typed": draw(st.booleans()),
        "script": draw(
            st.lists(st.tuples(_child_item, st.integers(0, 40), st.sampled_from([None, 0.01])), min_size=1, max_size=6)
        ),
    }


@st.composite
def _families(draw: st.DrawFn) -> dict[str, Any]:
    """A parent and its sub-agent, each with generated limits and policies, and how many sub-agent calls a reply has."""
    return {
        "parent": _limits(draw, ["t", "sub", "*"]),
        "child": _limits(draw, ["t", "*"]),
        "passes": draw(st.sampled_from(["error", "raise"])),
        "subs": draw(st.integers(1, 3)),
    }


def _hold_family(case: dict[str, Any], driver: str) -> None:
    clock = ManualClock()
    child = agent_of(case["child"], ByTurnScripted(case["child"]["script"]), registry(clock), clock)
    ended: list[RunResult] = []
    child.on("transition", lambda event: ended.append(event.result) if event.result is not None else None)
    tools = registry(clock)
    tools.register(child.as_tool("sub", "a sub-agent", on_child_stop=case["passes"]))
    model = WithSubAgents(case["parent"]["script"], case["subs"])
    parent = agent_of(case["parent"], model, tools, clock)
    wide = None if parent.limits.total_tool_calls is not None else widest(case["parent"]["script"], case["subs"])
    proof = check(parent, calls_per_reply=wide)
    result = _ended(parent, driver)
    hold_attempt(proof, result.trace, model.calls, "parent")
    inner = proof.children["sub"]
    for run in ended:
        hold_attempt(inner, run.trace, model_calls_in(run.trace), ("sub-agent", run.reason))


FAMILIES = settings(
    max_examples=examples(80), deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


@FAMILIES
@given(_families())
def test_each_sub_agent_run_stays_within_the_parents_proof_of_it_sync(case: dict[str, Any]) -> None:
    """Every run of the sub-agent (under the time, budgets and cap shares its parent hands it) within
    ``Proof.children["sub"]``: its transitions, model calls, ending and rows; the parent within its own proof."""
    _hold_family(case, "sync")


@FAMILIES
@given(_families())
def test_each_sub_agent_run_stays_within_the_parents_proof_of_it_async(case: dict[str, Any]) -> None:
    """The same on the async driver, whose sub-agent calls of a reply run in parallel and share the parent's limits."""
    _hold_family(case, "async")
