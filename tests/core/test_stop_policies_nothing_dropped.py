"""``on_stop`` policies for each reason, the finalize call and its own stops, and the partial result a stop leaves.

Nothing a run produced before its stop may be missing from the result: the
calls of a batch that ran, the text and tokens of the last reply, the calls
that never ran (in ``pending``, or answered as not executed on a finalize).
Each tool counts its executions, so "not executed" can be checked against
what really ran.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, CancelToken, RunResult, ToolRegistry, Usage
from fsm_agent.testing import FakeModel, ManualClock, edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
NOT_EXECUTED = '{{"error": "not executed: the run stopped ({reason}) before this call"}}'


def counted_registry(ran: Counter[str]) -> ToolRegistry:
    """``echo`` and ``fail``, each execution counted in ``ran`` by its text."""
    registry = ToolRegistry()

    @registry.register
    def echo(text: str) -> str:
        """Return the text unchanged."""
        ran[text] += 1
        return text

    @registry.register
    def fail(reason: str = "always fails") -> dict[str, str]:
        """Report an error, every time."""
        ran[f"fail:{reason}"] += 1
        return {"error": reason}

    return registry


def finish(agent: Agent, driver: str, **options: Any) -> RunResult | AgentLoopError:
    try:
        if driver == "sync":
            return agent.run("go", **options)
        return asyncio.run(agent.arun("go", **options))
    except AgentLoopError as stop:
        return stop


def tool_messages(result: RunResult) -> dict[str, str]:
    return {m.tool_call_id or "": m.content for m in result.messages if m.role == "tool"}


# --- finalize, answered -------------------------------------------------------------------------------------------


def _finalizing_case(reason: str, ran: Counter[str]) -> tuple[FakeModel, dict[str, Any], list[str], list[str]]:
    """A model and agent options that stop on ``reason``; the calls that must run, and those answered as not run."""
    answer = reply("best effort", usage=Usage(3, 4))
    if reason == "max_steps":
        model = FakeModel(tool_turn(tool_call("echo", id="a", text="a")), answer)
        return model, {"max_steps": 1}, ["a"], []
    if reason == "max_tool_calls":
        model = FakeModel(tool_turn(tool_call("echo", id="a", text="a"), tool_call("echo", id="b", text="b")), answer)
        return model, {"max_tool_calls": 1}, ["a"], ["b"]
    if reason == "repeated_action":
        model = FakeModel(
            tool_turn(
                tool_call("echo", id="a", text="a"),
                tool_call("echo", id="b", text="a"),
                tool_call("echo", id="c", text="c"),
            ),
            answer,
        )
        return model, {}, ["a"], ["b", "c"]
    if reason == "token_budget":
        model = FakeModel(tool_turn(tool_call("echo", id="a", text="a"), usage=Usage(60, 40)), answer)
        return model, {"token_budget": 100}, ["a"], []
    if reason == "cycle":
        a, b = tool_call("echo", id="a", text="a"), tool_call("echo", id="b", text="b")
        a2, b2 = tool_call("echo", id="a2", text="a"), tool_call("echo", id="b2", text="b")
        model = FakeModel(tool_turn(a), tool_turn(b), tool_turn(a2), tool_turn(b2), answer)
        return model, {}, ["a", "b", "a2", "b2"], []
    raise AssertionError(reason)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("reason", ["max_steps", "max_tool_calls", "repeated_action", "token_budget", "cycle"])
def test_finalize_answers_the_stop_with_one_toolless_call_and_answers_every_call_that_did_not_run(
    driver: str, reason: str
) -> None:
    ran: Counter[str] = Counter()
    model, options, runs, not_run = _finalizing_case(reason, ran)
    result = finish(Agent(model, counted_registry(ran), on_stop={reason: "finalize"}, **options), driver)
    assert isinstance(result, RunResult)
    assert (result.reason, result.ok, result.final) == (reason, False, "best effort")
    assert result.evidence["finalize"] == {"outcome": "answered"}
    assert model.tools_seen[-1] == []
    assert model.seen[-1][-1].content.startswith(f"The run has to stop now ({reason}).")
    messages = tool_messages(result)
    for call_id in not_run:
        assert messages[call_id] == NOT_EXECUTED.format(reason=reason)
    for call_id in runs:
        assert messages[call_id] != NOT_EXECUTED.format(reason=reason)
    assert sum(ran.values()) == len(runs)
    assert result.pending == ()
    assert result.usage.output_tokens >= 4  # the finalize reply's tokens are counted


@pytest.mark.parametrize("driver", DRIVERS)
def test_finalize_on_timeout_in_the_middle_of_a_turn_answers_the_call_the_deadline_kept_from_running(
    driver: str,
) -> None:
    clock = ManualClock()
    ran: Counter[str] = Counter()
    registry = counted_registry(ran)

    @registry.register
    def slow(n: int) -> str:
        """Take 100 seconds."""
        clock.advance(100)
        ran[f"slow{n}"] += 1
        return f"ok{n}"

    model = FakeModel(tool_turn(tool_call("slow", id="x1", n=1), tool_call("slow", id="x2", n=2)), reply("late answer"))
    agent = Agent(model, registry, timeout=10, clock=clock, on_stop={"timeout": "finalize"})
    result = finish(agent, driver)
    assert isinstance(result, RunResult)
    assert (result.reason, result.final, result.evidence["finalize"]) == (
        "timeout",
        "late answer",
        {"outcome": "answered"},
    )
    messages = tool_messages(result)
    assert messages["x1"] == '"ok1"'
    # Whatever the driver did with x2, its message says the truth about it.
    if ran["slow2"]:
        assert messages["x2"] == '"ok2"'
    else:
        assert messages["x2"] == NOT_EXECUTED.format(reason="timeout")
    assert max(ran.values()) == 1


def test_Dispatch_to_AwaitModel_finalize_on_cycle_sync_answers_the_call_after_the_cycle_as_not_executed() -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(tool_call("echo", id="a1", text="a"), tool_call("echo", id="b1", text="b")),
        tool_turn(
            tool_call("echo", id="a2", text="a"),
            tool_call("echo", id="b2", text="b"),
            tool_call("echo", id="c2", text="c"),
        ),
        reply("final"),
    )
    result = finish(Agent(model, counted_registry(ran), on_stop={"cycle": "finalize"}), "sync")
    assert isinstance(result, RunResult)
    assert "ExecuteTool->AwaitModel[finalize_on_cycle]" in edges(result)
    assert ran["c"] == 0
    assert tool_messages(result)["c2"] == NOT_EXECUTED.format(reason="cycle")


def test_finalize_on_cycle_inside_a_parallel_batch_keeps_the_result_of_the_call_that_already_ran() -> None:
    """Async: c2 ran in the batch before the cycle was seen on b2; its result must not become "not executed"."""
    ran: Counter[str] = Counter()
    model = FakeModel(
        tool_turn(tool_call("echo", id="a1", text="a"), tool_call("echo", id="b1", text="b")),
        tool_turn(
            tool_call("echo", id="a2", text="a"),
            tool_call("echo", id="b2", text="b"),
            tool_call("echo", id="c2", text="c"),
        ),
        reply("final"),
    )
    result = finish(Agent(model, counted_registry(ran), on_stop={"cycle": "finalize"}), "async")
    assert isinstance(result, RunResult)
    assert result.evidence["finalize"] == {"outcome": "answered"}
    assert ran["c"] == 1  # it did run
    assert tool_messages(result)["c2"] == '"c"'
    assert len([step for step in result.steps if step.kind == "tool_call"]) == 5
    assert result.evidence["counters"]["tool_calls"][0] == 5


# --- finalize, and the finalize call meets a stop of its own ---------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("last", "outcome", "final", "edge"),
    [
        (reply("half of it", stop_reason="max_tokens", usage=Usage(5, 6)), "max_tokens", "half of it",
         "CheckTruncation->Failed[max_tokens]"),
        (reply("I won't", stop_reason="refusal", usage=Usage(5, 6)), "refusal", "I won't",
         "CheckTruncation->Failed[refusal]"),
        (ConnectionError("provider down"), "model_error", "", "AwaitModel->Failed[model_error]"),
        (tool_turn(tool_call("echo", id="more", text="more"), content="let me look", usage=Usage(5, 6)),
         "finalize_failed", "let me look", "Dispatch->Failed[finalize_failed]"),
    ],
)  # fmt: skip
def test_a_finalize_call_that_fails_leaves_the_original_stop_standing_with_what_arrived(
    driver: str, last: Any, outcome: str, final: str, edge: str
) -> None:
    ran: Counter[str] = Counter()
    model = FakeModel(tool_turn(tool_call("echo", id="a", text="a"), usage=Usage(1, 1)), last)
    stop = finish(Agent(model, counted_registry(ran), max_steps=1, on_stop={"max_steps": "finalize"}), driver)
    assert isinstance(stop, AgentLoopError)
    assert stop.reason == "max_steps"
    assert stop.evidence["turns"] == 1
    assert stop.evidence["finalize"]["outcome"] == outcome
    assert stop.evidence["finalize"]["step"] == 1
    assert edges(stop.result)[-1] == edge
    assert stop.result.final == final
    assert ran == Counter({"a": 1})  # the tool the finalize reply asked for never ran
    if isinstance(last, BaseException):
        assert stop.evidence["finalize"]["type"] == "ConnectionError"
        assert isinstance(stop.__cause__, ConnectionError)
        assert stop.result.usage.output_tokens == 1
    else:
        assert stop.result.messages[-1].content == final
        assert stop.result.usage.output_tokens == 7
    if outcome == "finalize_failed":
        assert stop.evidence["finalize"]["tool_calls"] == ["echo"]
        assert [call.id for call in stop.result.pending] == ["more"]


@pytest.mark.parametrize("policy", ["raise", "return"])
def test_a_policy_for_finalize_failed_is_refused_when_the_agent_is_built(policy: str) -> None:
    """stops.md lists finalize_failed's `on_stop` as "—": a policy it does not allow is a ValueError at build."""
    with pytest.raises(ValueError, match="finalize_failed"):
        Agent(FakeModel(), counted_registry(Counter()), on_stop={"finalize_failed": policy})


# --- return: no exception, ok false, the same result --------------------------------------------------------------


def _returning_case(reason: str) -> tuple[FakeModel, dict[str, Any], dict[str, Any]]:
    if reason == "tool_failures":
        model = FakeModel([tool_turn(tool_call("fail", reason=f"r{n}")) for n in range(2)])
        return model, {"max_consecutive_failures": 2}, {}
    if reason == "max_tokens":
        return FakeModel(reply("cut", stop_reason="max_tokens")), {}, {}
    if reason == "refusal":
        return FakeModel(reply("no", stop_reason="refusal")), {}, {}
    if reason == "model_error":
        return FakeModel(TimeoutError("slow provider")), {}, {}
    if reason == "cancelled":
        token = CancelToken()
        token.cancel("stop")
        return FakeModel(reply("never")), {}, {"cancel": token}
    if reason == "max_steps":
        return FakeModel(tool_turn(tool_call("echo", text="a"))), {"max_steps": 1}, {}
    if reason == "cycle":
        a, b = tool_turn(tool_call("echo", text="a")), tool_turn(tool_call("echo", text="b"))
        return FakeModel(a, b, a, b), {}, {}
    if reason == "repeated_action":
        return FakeModel(tool_turn(tool_call("echo", text="a"), tool_call("echo", text="a"))), {}, {}
    if reason == "max_tool_calls":
        return FakeModel(tool_turn(tool_call("echo", text="a"))), {"max_tool_calls": 0}, {}
    if reason == "token_budget":
        return FakeModel(tool_turn(tool_call("echo", text="a"), usage=Usage(1, 1))), {"token_budget": 2}, {}
    raise AssertionError(reason)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    "reason",
    [
        "tool_failures",
        "max_tokens",
        "refusal",
        "model_error",
        "cancelled",
        "max_steps",
        "cycle",
        "repeated_action",
        "max_tool_calls",
        "token_budget",
    ],
)
def test_on_stop_return_returns_the_result_the_raise_policy_would_carry(driver: str, reason: str) -> None:
    model, options, run_options = _returning_case(reason)
    returned = finish(
        Agent(model, counted_registry(Counter()), on_stop={reason: "return"}, **options), driver, **run_options
    )
    assert isinstance(returned, RunResult)
    assert (returned.reason, returned.ok) == (reason, False)
    assert edges(returned)[-1].endswith(f"->Failed[{reason}]")
    model, options, run_options = _returning_case(reason)
    raised = finish(Agent(model, counted_registry(Counter()), **options), driver, **run_options)
    assert isinstance(raised, AgentLoopError)
    assert raised.reason == reason
    assert edges(raised.result) == edges(returned)
    assert [m.content for m in raised.result.messages] == [m.content for m in returned.messages]
    assert raised.result.final == returned.final
    assert {k: v for k, v in raised.evidence.items() if k != "counters"}.keys() == {
        k for k in returned.evidence if k != "counters"
    }


# --- a batch cut while its first call is in flight -----------------------------------------------------------------


def test_a_cancel_while_the_first_call_of_a_batch_is_in_flight_keeps_the_later_calls_that_finished() -> None:
    """q1 and q2 ran to the end (their effects happened) while s was still in flight when the task was cancelled.

    The result does not list them as never run (``pending``): the evidence
    names them (``came_back``) and the snapshot keeps their outcomes, so the
    resume takes them in after s, in the order asked, without running them again.
    """
    effects: list[str] = []

    async def scenario() -> tuple[RunResult, RunResult]:
        registry = ToolRegistry()
        both_done = asyncio.Event()

        @registry.register
        async def stuck() -> str:
            """Never finishes the first time."""
            effects.append("s")
            if effects.count("s") == 1:
                await asyncio.Event().wait()
            return "s done"

        @registry.register
        async def quick(n: int) -> str:
            """Finishes at once."""
            effects.append(f"q{n}")
            if effects.count("q1") + effects.count("q2") == 2:
                both_done.set()
            return f"q{n}"

        batch = tool_turn(
            tool_call("stuck", id="s"), tool_call("quick", id="q1", n=1), tool_call("quick", id="q2", n=2)
        )
        agent = Agent(FakeModel(batch, reply("all done")), registry)
        run = await agent.astart("go")
        task = asyncio.ensure_future(run.afinish())
        await both_done.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert run.result.snapshot is not None
        again = await agent.aresume(run.result.snapshot)
        return run.result, await again.afinish()

    cut, resumed = asyncio.run(scenario())
    assert cut.reason == "cancelled"
    assert cut.evidence["unfinished"] == "s"
    assert [call.id for call in cut.pending] == ["s"]
    assert cut.evidence["came_back"] == ["q1", "q2"]
    assert "also_ran" not in cut.evidence
    assert cut.snapshot is not None
    assert sorted(cut.snapshot["ran"]) == ["q1", "q2"]
    assert resumed.final == "all done"
    assert [m.tool_call_id for m in resumed.messages if m.role == "tool"] == ["s", "q1", "q2"]
    assert tool_messages(resumed) == {"s": '"s done"', "q1": '"q1"', "q2": '"q2"'}
    assert sorted(effects) == ["q1", "q2", "s", "s"]  # s cut and made again (its outcome never came); q1, q2 once
