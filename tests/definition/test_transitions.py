"""One test per row of the transition table: put a run where the guard holds, advance once, check the edge."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from support.deadline_cuts import DEADLINE
from support.scenarios import OVERFLOW, POINT, keep_last, with_failing_child

from fsm_agent import TABLE, Agent, AgentLoopError, CancelToken, ModelResponse, Price, Row, RunResult, State
from fsm_agent.definition.run import RECORDS, signature
from fsm_agent.definition.triggers import EXPIRED, FINALIZE, INTERRUPTED, RESUME, START
from fsm_agent.drivers.agent import AgentRun
from fsm_agent.testing import (
    CounterModel,
    FakeModel,
    LoopingModel,
    ManualClock,
    demo_registry,
    edge_id,
    reply,
    tool_call,
    tool_turn,
)

Arrange = Callable[[dict[str, Any]], AgentRun]

ECHO = tool_call("echo", id="e1", text="hi")
ECHO2 = tool_call("echo", id="e2", text="again")
FAIL = tool_call("fail", id="f1", reason="nope")
A = tool_call("echo", id="a", text="a")
B = tool_call("echo", id="b", text="b")
SLOW = tool_call("pass_time", id="p1", seconds=1.0)
STOP = tool_call("press_stop", id="s1")


def _at(state: State, options: dict[str, Any], responses: tuple[object, ...] = (), **counters: Any) -> AgentRun:
    """A fresh run of a 3-step agent (plus ``options``), moved to ``state`` with the given counters."""
    clock = ManualClock()
    registry = demo_registry()

    def pass_time(seconds: float) -> str:
        """Let ``seconds`` pass on the run's clock while the call runs."""
        clock.advance(seconds)
        return "later"

    token = counters.pop("cancel", None)

    def press_stop(seconds: float = 0.0) -> str:
        """Let ``seconds`` pass, and cancel the run's token while the call runs (the guards cleared it before)."""
        assert token is not None, "press_stop needs the run's token"
        clock.advance(seconds)
        token.cancel("user pressed stop")
        return "stopped"

    registry.register(pass_time)
    registry.register(press_stop)
    agent = Agent(FakeModel(list(responses)), registry, max_steps=3, clock=clock, **options)
    run = agent.start("question", cancel=token)
    position = run.position
    position.at.state = state
    position.calls.pending.extend(counters.pop("pending", ()))
    position.counts.recent.extend(counters.pop("recent", ()))
    clock.advance(counters.pop("seconds", 0.0))
    for name, value in counters.items():
        record = next((key for key, kind in RECORDS.items() if hasattr(kind, name)), "")
        setattr(getattr(position, record) if record else position, name, value)
    return run


def _cancelled() -> CancelToken:
    token = CancelToken()
    token.cancel("user pressed stop")
    return token


def _dispatch(options: dict[str, Any], **counters: Any) -> AgentRun:
    counters.setdefault("pending", [ECHO])
    return _at(State.Dispatch, options, turns=1, last_response=tool_turn(*counters["pending"]), **counters)


def _execute(options: dict[str, Any], **counters: Any) -> AgentRun:
    counters.setdefault("pending", [ECHO])
    counters.setdefault("turns", 1)
    return _at(State.ExecuteTool, options, **counters)


def _child_stops(options: dict[str, Any]) -> AgentRun:
    """A run about to call a sub-agent that stops and passes the stop on."""
    agent = Agent(FakeModel([]), with_failing_child(demo_registry()), **options)
    run = agent.start("question")
    run.position.at.state = State.ExecuteTool
    run.position.counts.turns = 1
    run.position.calls.pending.append(tool_call("research", id="r1", input="why?"))
    return run


STOPS: dict[str, tuple[Arrange, dict[str, Any]]] = {
    "AwaitModel->Failed[context_overflow]": (lambda o: _at(State.AwaitModel, o, (OVERFLOW,)), {}),
    "AwaitModel->Failed[model_error]": (lambda o: _at(State.AwaitModel, o, (RuntimeError("provider down"),)), {}),
    "CheckTruncation->Failed[max_tokens]": (
        lambda o: _at(State.CheckTruncation, o, turns=1, last_response=reply("half an ans", stop_reason="max_tokens")),
        {},
    ),
    "CheckTruncation->Failed[refusal]": (
        lambda o: _at(State.CheckTruncation, o, turns=1, last_response=reply("I can't", stop_reason="refusal")),
        {},
    ),
    "AwaitModel->Failed[hook_error]": (
        lambda o: _at(State.AwaitModel, o, (reply("hi"),), hook_error=RuntimeError("observer broke")),
        {"strict_hooks": True},
    ),
    "CheckTruncation->Failed[hook_error]": (
        lambda o: _at(State.CheckTruncation, o, turns=1, last_response=reply("ok"), hook_error=RuntimeError("x")),
        {"strict_hooks": True},
    ),
    "Dispatch->Failed[hook_error]": (
        lambda o: _dispatch(o, hook_error=RuntimeError("observer broke")),
        {"strict_hooks": True},
    ),
    "ExecuteTool->Failed[hook_error]": (
        lambda o: _execute(o, hook_error=RuntimeError("observer broke")),
        {"strict_hooks": True},
    ),
    "Dispatch->Failed[finalize_failed]": (
        lambda o: _dispatch(o, finalizing="max_steps"),
        {"on_stop": {"max_steps": "finalize"}},
    ),
    "Dispatch->Failed[output_invalid]": (
        lambda o: _at(State.Dispatch, o, turns=1, last_response=reply("not json")),
        {"output_type": POINT, "output_retries": 0},
    ),
    "Dispatch->Failed[cancelled]": (lambda o: _dispatch(o, cancel=_cancelled()), {}),
    "Dispatch->Failed[timeout]": (lambda o: _dispatch(o, seconds=10.0), {"timeout": 10}),
    "Dispatch->Failed[repeated_action]": (lambda o: _dispatch(o, last_signature=signature(ECHO)), {}),
    "Dispatch->Failed[max_tool_calls]": (lambda o: _dispatch(o, tool_calls=2), {"max_tool_calls": 2}),
    "ExecuteTool->Failed[child_stopped]": (lambda o: _child_stops(o), {}),
    "ExecuteTool->Failed[tool_failures]": (lambda o: _execute(o, pending=[FAIL], failures=2), {}),
    "ExecuteTool->Failed[cycle]": (
        lambda o: _execute(
            o, pending=[B], recent=[(signature(A), '"a"'), (signature(B), '"b"'), (signature(A), '"a"')]
        ),
        {},
    ),
    # The cancel comes while the call runs (one already there before it would be the interrupted edge).
    "ExecuteTool->Failed[cancelled]": (lambda o: _execute(o, pending=[STOP], cancel=CancelToken()), {}),
    # The deadline passes while the call runs (one already past before it would be the expired edge).
    "ExecuteTool->Failed[timeout]": (lambda o: _execute(o, pending=[SLOW], seconds=4.0), {"timeout": 5}),
    "ExecuteTool->Failed[token_budget]": (
        lambda o: _execute(o, input_tokens=60, output_tokens=40),
        {"token_budget": 100},
    ),
    "ExecuteTool->Failed[cost_budget]": (
        lambda o: _execute(o, cost=0.5, priced=1),
        {"cost_budget": 0.5, "prices": Price(input_per_mtok=1, output_per_mtok=1)},
    ),
    "ExecuteTool->Failed[max_steps]": (lambda o: _execute(o, turns=3), {}),
}
"""Stop edges: how to arrange a run where the stop's guard holds, and the agent options it needs."""

ARRANGE: dict[str, Arrange] = {
    **{edge: lambda o, go=go, opts=opts: go({**opts, **o}) for edge, (go, opts) in STOPS.items()},
    "AwaitModel->CheckTruncation": lambda o: _at(State.AwaitModel, o, (reply("hello"),)),
    "AwaitModel->AwaitModel[compacts_history]": lambda o: _at(
        State.AwaitModel, {"on_stop": {"context_overflow": "compact"}, "compact": keep_last, **o}, (OVERFLOW,)
    ),
    "CheckTruncation->Dispatch": lambda o: _at(State.CheckTruncation, o, turns=1, last_response=reply("fine")),
    "Dispatch->Done[has_no_tool_calls]": lambda o: _at(State.Dispatch, o, turns=1, last_response=reply("42")),
    "Dispatch->AwaitModel[output_invalid]": lambda o: _at(
        State.Dispatch, {"output_type": POINT, **o}, turns=1, last_response=reply('{"x": 1}')
    ),
    "Dispatch->ExecuteTool": lambda o: _dispatch(o),
    "ExecuteTool->Dispatch[has_pending_calls]": lambda o: _execute(o, pending=[ECHO, ECHO2]),
    "ExecuteTool->AwaitModel": lambda o: _execute(o),
}
# A finalize edge fires where its stop would, when the agent's policy for that stop is finalize.
for _edge, (_go, _opts) in STOPS.items():
    _source, _reason = _edge.split("->")[0], _edge.split("[")[1].rstrip("]")
    ARRANGE[f"{_source}->AwaitModel[finalize_on_{_reason}]"] = lambda o, go=_go, opts=_opts, reason=_reason: go(
        {**opts, "on_stop": {reason: "finalize"}, **o}
    )


class Stuck:
    """A model whose reply never comes, and a tool that never returns, until the test releases them."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def acomplete(self, messages: object, tools: object) -> ModelResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def complete(self, messages: object, tools: object) -> ModelResponse:
        raise AssertionError("the async driver must use acomplete")

    def tool(self) -> str:
        self.release.wait(5)
        return "late"


def _interrupted(state: State) -> tuple[AgentRun, Stuck]:
    stuck = Stuck()
    registry = demo_registry()
    registry.register(stuck.tool, name="stuck")
    if state is State.Dispatch:  # a typed answer's check, held until the test releases it
        checking = Agent(FakeModel(reply("7")), registry, output_type=str,
                         output_validators=[lambda value: stuck.release.wait(5) and value])  # fmt: skip
        run = checking.start("q")
        while run.state is not State.Dispatch:
            run.advance()
        return run, stuck
    run = Agent(stuck, registry).start("q")
    if state is State.ExecuteTool:
        run.position.at.state = state
        run.position.counts.turns = 1
        run.position.calls.pending.append(tool_call("stuck", id="s1"))
    return run, stuck


HELD = 10 * DEADLINE
"""How long a held call waits at most; the test releases it as soon as the run has stopped."""


class Hang:
    """A sync model whose reply never comes before the test releases it."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def complete(self, messages: object, tools: object) -> ModelResponse:
        self.release.wait(HELD)
        return reply("late")


def _expired(state: State) -> AgentRun:
    """A run whose call (or, in Dispatch, a typed answer's check) is still in flight when its timeout passes.

    The timeout is ``deadline_cuts.DEADLINE`` (2 s): at 0.05 s the run, beside CPU hogs, sometimes met it before it
    reached the state the row leaves (``Failed`` from ``AwaitModel`` instead of ``Dispatch``).
    """
    hang = Hang()
    registry = demo_registry()
    registry.register(lambda: hang.release.wait(HELD), name="hang")
    if state is State.Dispatch:
        schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
        checking = Agent(FakeModel(reply('{"x": 1}')), registry, output_type=schema, timeout=DEADLINE,
                         output_validators=[lambda value: hang.release.wait(HELD) and value])  # fmt: skip
        run = checking.start("q")
        while run.state is not State.Dispatch:
            run.advance()
        try:
            run.advance()
        finally:
            hang.release.set()
        return run
    run = Agent(hang, registry, timeout=DEADLINE).start("q")
    if state is State.ExecuteTool:
        run.position.at.state = state
        run.position.counts.turns = 1
        run.position.calls.pending.append(tool_call("hang", id="h1"))
    try:
        run.advance()
    finally:
        hang.release.set()
    return run


START_ARRANGE: dict[str, Callable[[], AgentRun]] = {
    "cancelled": lambda: _at(State.AwaitModel, {}, (reply("never asked"),), cancel=_cancelled()),
    "timeout": lambda: _at(State.AwaitModel, {"timeout": 1}, (reply("never asked"),), seconds=1.0),
}
"""Rows on the start trigger: a run that may not go on before its first model call."""


async def _cancel_mid_call(run: AgentRun, stuck: Stuck) -> None:
    task = asyncio.ensure_future(run.aadvance())
    for _ in range(20):  # let the call start; the loop needs a few turns to reach the worker thread
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stuck.release.set()  # the abandoned worker thread may now end, so the loop can close


def _stopped(model: Any, **options: Any) -> tuple[Agent, RunResult]:
    agent = Agent(model, demo_registry(), **options)
    with pytest.raises(AgentLoopError) as info:
        agent.run("q")
    return agent, info.value.result


class _SlowAnswer:
    """Answers ``{"x": 1}`` while the run's (manual) clock passes ``seconds``: its check starts with no time left."""

    def __init__(self, clock: ManualClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def complete(self, messages: object, tools: object, output: object = None) -> ModelResponse:
        self.clock.advance(self.seconds)
        return reply('{"x": 1}')


def _answer_unchecked() -> tuple[Agent, RunResult]:
    clock = ManualClock()
    return _stopped(_SlowAnswer(clock, 11.0), output_type=POINT, timeout=10.0, clock=clock)


RESUMED: dict[str, Callable[[], AgentRun]] = {
    "Failed->Dispatch[resumes_before_tool]": lambda: (lambda agent, result: agent.resume(result, max_tool_calls=5))(
        *_stopped(FakeModel([tool_turn(ECHO, ECHO2), reply("ok")]), max_tool_calls=1)
    ),
    "Failed->Dispatch[resumes_before_answer]": lambda: (lambda agent, result: agent.resume(result, timeout=100.0))(
        *_answer_unchecked()
    ),
    "Failed->AwaitModel[resumes_before_model]": lambda: (lambda agent, result: agent.resume(result, max_steps=3))(
        *_stopped(CounterModel(), max_steps=1)
    ),
    "Failed->AwaitModel[retries_model_call]": lambda: (lambda agent, result: agent.resume(result, retry=True))(
        *_stopped(FakeModel([RuntimeError("flaky"), reply("ok")]))
    ),
    # The answer was sent back with a retry left that max_steps forbade: a higher max_steps makes the retry.
    "Failed->AwaitModel[resumes_output_retry]": lambda: (lambda agent, result: agent.resume(result, max_steps=3))(
        *_stopped(FakeModel([reply("not a point"), reply('{"x": 1}')]), output_type=POINT, max_steps=1)
    ),
    # The finalize call failed: the max_steps stop stands, and retry=True makes that call again.
    "Failed->AwaitModel[resumes_finalize]": lambda: (lambda agent, result: agent.resume(result, retry=True))(
        *_stopped(
            FakeModel([tool_turn(ECHO), RuntimeError("flaky"), reply("what I have")]),
            max_steps=1,
            on_stop={"max_steps": "finalize"},
        )
    ),
}
"""Resume edges are fired by Agent.resume on a stopped run."""


def test_every_row_has_a_transition_test() -> None:
    """Adding a row to the table without arranging a test for it fails here."""
    elsewhere = {edge_id(row) for row in TABLE.rows if row.trigger in (INTERRUPTED, EXPIRED, START)}
    assert {edge_id(row) for row in TABLE.rows} - elsewhere <= set(ARRANGE) | set(RESUMED)
    assert {row.reason for row in TABLE.rows if row.trigger == START} <= set(START_ARRANGE)


@pytest.mark.parametrize(
    "row",
    [pytest.param(row, marks=pytest.mark.slow) if row.trigger == EXPIRED else row for row in TABLE.rows],
    ids=edge_id,
)
def test_row_fires_when_its_guard_holds(row: Row) -> None:
    """From the row's source, with its guard true and every earlier guard false, advance takes exactly this row."""
    if row.trigger == INTERRUPTED:
        run, stuck = _interrupted(row.source)
        asyncio.run(_cancel_mid_call(run, stuck))
        taken = run.trace[-1]
    elif row.trigger == EXPIRED:
        run = _expired(row.source)
        taken = run.trace[-1]
        assert run.result.evidence["unfinished"]
    elif row.trigger == START:
        run = START_ARRANGE[str(row.reason)]()
        taken = run.advance()
        assert run.turns == 0  # no model call was made
    elif row.trigger == RESUME:
        run = RESUMED[edge_id(row)]()
        taken = run.trace[-1]
    else:
        run = ARRANGE[edge_id(row)]({})
        taken = run.advance()
    assert (taken.source, taken.trigger, taken.dest, taken.guard, taken.reason) == (
        row.source,
        row.trigger,
        row.dest,
        row.guard_name,
        row.reason,
    )
    assert run.state is row.dest
    if row.dest is State.Failed and run.finalizing is None:
        assert (run.result.reason, run.result.ok) == (row.reason, False)
        assert run.result.evidence["step"] == max(run.turns - 1, 0)
    elif row.dest is State.Failed:
        # A failed finalize keeps the stop that forced it; the edge's reason says how the finalize failed.
        assert (run.result.reason, run.result.ok) == (run.finalizing, False)
        assert run.result.evidence["finalize"]["outcome"] == row.reason
    if row.trigger == FINALIZE:
        assert run.finalizing == row.guard_name.removeprefix("finalize_on_")  # type: ignore[union-attr]
        assert run.messages[-1].role == "user"


@pytest.mark.parametrize("edge", sorted(STOPS))
def test_stop_edge_is_plain_failure_without_finalize_policy(edge: str) -> None:
    """With the default policy (raise), a finalizable stop goes straight to Failed."""
    run = ARRANGE[edge]({})
    assert edge_id(run.advance()) == edge


def test_truncation_outranks_tool_calls() -> None:
    """CheckTruncation->Failed[max_tokens] wins even when the cut reply also asks for tools."""
    cut = tool_turn(ECHO, content="let me")
    cut = type(cut)(cut.message, "max_tokens")
    run = _at(State.CheckTruncation, {}, turns=1, last_response=cut, pending=[ECHO])
    assert edge_id(run.advance()) == "CheckTruncation->Failed[max_tokens]"
    assert run.result.final == "let me"


def test_failures_outrank_pending_calls_and_max_steps() -> None:
    """ExecuteTool->Failed[tool_failures] is tried before more calls of the turn and before max_steps."""
    run = _execute({}, turns=3, pending=[FAIL, ECHO], failures=2)
    assert edge_id(run.advance()) == "ExecuteTool->Failed[tool_failures]"
    assert run.result.pending == (ECHO,)


def test_pending_calls_outrank_end_of_turn_stops() -> None:
    """The calls of the last allowed turn all run before max_steps, budget, timeout or cancel stop the run."""
    late = tool_call("press_stop", id="p9", seconds=9)  # the deadline passes and the stop is pressed during this call
    run = _execute({"timeout": 1, "token_budget": 5}, turns=3, pending=[late, ECHO2], cancel=CancelToken())
    run.position.counts.input_tokens = 10
    assert edge_id(run.advance()) == "ExecuteTool->Dispatch[has_pending_calls]"


def test_end_of_turn_priority_is_cancelled_timeout_budget_steps() -> None:
    """When every end-of-turn stop holds at once, the table's order decides: cancelled first."""
    everything = {"timeout": 1, "token_budget": 5}
    expected = ["cancelled", "timeout", "token_budget", "max_steps"]
    for reason in expected:
        lifted = expected[: expected.index(reason)]  # the stops that outrank this one are made not to hold
        # The deadline passes, or the stop is pressed, during this call: the stops that hold after it compete.
        late = tool_call("press_stop" if "cancelled" not in lifted else "pass_time", id="p9", seconds=9)
        run = _execute(
            everything,
            turns=3,
            pending=[ECHO if "timeout" in lifted else late],
            cancel=None if "cancelled" in lifted else CancelToken(),
        )
        run.position.counts.input_tokens = 0 if "token_budget" in lifted else 10
        taken = run.advance()
        assert (edge_id(taken), taken.trigger) == (f"ExecuteTool->Failed[{reason}]", "tool_done")


def test_dispatch_priority_is_cancelled_timeout_repeat_cap() -> None:
    """Before a tool call, cancel outranks timeout outranks repeated_action outranks max_tool_calls."""
    run = _dispatch({"timeout": 1, "max_tool_calls": 1}, cancel=_cancelled(), seconds=2, last_signature=signature(ECHO))
    run.position.counts.tool_calls = 1
    assert edge_id(run.advance()) == "Dispatch->Failed[cancelled]"
    run = _dispatch({"timeout": 1, "max_tool_calls": 1}, seconds=2, last_signature=signature(ECHO), tool_calls=1)
    assert edge_id(run.advance()) == "Dispatch->Failed[timeout]"
    run = _dispatch({"max_tool_calls": 1}, last_signature=signature(ECHO), tool_calls=1)
    assert edge_id(run.advance()) == "Dispatch->Failed[repeated_action]"


def test_final_answer_outranks_every_stop_at_dispatch() -> None:
    """Dispatch->Done is the first row of Dispatch: an answer that arrived is never thrown away."""
    run = _at(State.Dispatch, {"timeout": 1}, turns=3, last_response=reply("done"), cancel=_cancelled(), seconds=5)
    assert edge_id(run.advance()) == "Dispatch->Done[has_no_tool_calls]"


def test_cycle_outranks_pending_calls() -> None:
    """The cycle is checked after each tool call, even mid-turn."""
    recent = [(signature(A), '"a"'), (signature(B), '"b"'), (signature(A), '"a"')]
    run = _execute({}, pending=[B, ECHO], recent=recent)
    assert edge_id(run.advance()) == "ExecuteTool->Failed[cycle]"


def _trace_of(go: Callable[[], object]) -> list[str]:
    try:
        result = go()
    except AgentLoopError as exc:
        result = exc.result
    return [edge_id(t) for t in result.trace]  # type: ignore[attr-defined]


def test_seed_rows_fire_in_end_to_end_scenarios() -> None:
    """The first scenarios plus a model failure, a refusal and a multi-call turn use every row of the first table."""
    registry = demo_registry()
    scenarios = [
        lambda: Agent(CounterModel(), registry, max_steps=3).run("go"),
        lambda: Agent(LoopingModel(ECHO), registry).run("go"),
        lambda: Agent(FakeModel([reply("cut", stop_reason="max_tokens")]), registry).run("go"),
        lambda: Agent(FakeModel([reply("no", stop_reason="refusal")]), registry).run("go"),
        lambda: Agent(FakeModel([tool_turn(FAIL, tool_call("nope"), tool_call("add", a="1", b=2))]), registry).run("x"),
        lambda: Agent(FakeModel([tool_turn(ECHO, ECHO2), reply("ok")]), registry).run("go"),
        lambda: Agent(FakeModel([]), registry).run("go"),
    ]
    seen = {edge for go in scenarios for edge in _trace_of(go)}
    seed_rows = {
        "AwaitModel->Failed[model_error]",
        "AwaitModel->CheckTruncation",
        "CheckTruncation->Failed[max_tokens]",
        "CheckTruncation->Failed[refusal]",
        "CheckTruncation->Dispatch",
        "Dispatch->Done[has_no_tool_calls]",
        "Dispatch->Failed[repeated_action]",
        "Dispatch->ExecuteTool",
        "ExecuteTool->Failed[tool_failures]",
        "ExecuteTool->Dispatch[has_pending_calls]",
        "ExecuteTool->Failed[max_steps]",
        "ExecuteTool->AwaitModel",
    }
    assert seen == seed_rows
