"""The one core under every driver: exactly-once tool calls across any cut, approvals, user-check failures,
the Stop catalogue as the single source, the row walker against the library, and the snapshot format."""

from __future__ import annotations

import asyncio
import json
import math
import pickle
from collections import Counter
from collections.abc import Sequence
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, RunResult, StopCondition, ToolCall, ToolRegistry
from fsm_agent.core.walker import library_machine, walker_for
from fsm_agent.definition.run import Meter, Run, signature
from fsm_agent.definition.states import Reason, State
from fsm_agent.definition.stops import CATALOGUE, CONDITION_ERROR, At, Stop
from fsm_agent.definition.table import build_table, first_row
from fsm_agent.errors import DefinitionError, RunStateError
from fsm_agent.render.markdown import reasons_table
from fsm_agent.render.mermaid import to_mermaid
from fsm_agent.testing import FakeModel, ManualClock, demo_registry, reply, tool_turn

# --- a script the model follows by the history alone, so a resumed run picks up where it was ---------------


class ByHistory:
    """Answers turn n (counted from the assistant messages so far) with ``script[n]``; stateless, so resumable."""

    def __init__(self, script: Sequence[ModelResponse]) -> None:
        self.script = script
        self.calls = 0

    def complete(self, messages: Sequence[Message], tools: object) -> ModelResponse:
        self.calls += 1
        turn = sum(1 for m in messages if m.role == "assistant")
        return self.script[turn] if turn < len(self.script) else reply("that is all")


def counting_registry(counter: Counter[str]) -> ToolRegistry:
    """``charge`` and ``echo`` count each execution by call id: the side effect the tests hold the engine to."""
    registry = ToolRegistry()

    @registry.register
    def charge(card: int, call_id: str) -> dict[str, int]:
        """Charge a card."""
        counter[call_id] += 1
        return {"charged": card}

    @registry.register
    def echo(text: str, call_id: str) -> str:
        """Echo the text."""
        counter[call_id] += 1
        return text

    return registry


@st.composite
def scripts(draw: st.DrawFn) -> list[ModelResponse]:
    """Turns of one to three calls (a turn of several is a parallel batch), then an answer."""
    turns = []
    n = 0
    for _ in range(draw(st.integers(1, 4))):
        calls = []
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            if draw(st.booleans()):
                calls.append(ToolCall(f"c{n}", "charge", {"card": n}))
            else:
                calls.append(ToolCall(f"c{n}", "echo", {"text": draw(st.sampled_from(["a", "b"]))}))
        turns.append(tool_turn(*calls))
    turns.append(reply("paid"))
    return turns


def _agent(script: Sequence[ModelResponse], counter: Counter[str], **options: Any) -> Agent:
    return Agent(ByHistory(script), counting_registry(counter), max_steps=10, clock=ManualClock(), **options)


def _outcome(go: Any) -> RunResult:
    try:
        return go()  # type: ignore[no-any-return]
    except AgentLoopError as exc:
        return exc.result


def _same(a: RunResult, b: RunResult) -> None:
    assert (a.messages, a.steps, a.trace, a.reason, a.pending) == (b.messages, b.steps, b.trace, b.reason, b.pending)


def _executed_once(result: RunResult, counter: Counter[str]) -> None:
    ran = [m.tool_call_id for m in result.messages if m.role == "tool"]
    assert counter == Counter(ran), "every completed call ran exactly once, and only calls that are recorded ran"


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(script=scripts(), cut=st.integers(0, 40), drivers=st.lists(st.booleans(), min_size=2, max_size=2))
def test_sync_async_and_a_run_cut_anywhere_and_resumed_agree_and_run_each_call_once(
    script: list[ModelResponse], cut: int, drivers: list[bool]
) -> None:
    """Same script: sync, async, and cut after `cut` transitions (either driver), resumed (either driver)."""
    sync_counter: Counter[str] = Counter()
    sync = _outcome(lambda: _agent(script, sync_counter).run("pay"))
    _executed_once(sync, sync_counter)

    async_counter: Counter[str] = Counter()
    async_ = _outcome(lambda: asyncio.run(_agent(script, async_counter).arun("pay")))
    _same(sync, async_)
    _executed_once(async_, async_counter)

    cut_counter: Counter[str] = Counter()
    run = _agent(script, cut_counter).start("pay")
    for _ in range(cut):
        if run.done:
            break
        if drivers[0]:
            asyncio.run(run.aadvance())
        else:
            run.advance()
    saved = json.dumps(run.snapshot())
    if run.done:
        resumed = run.result
    else:
        again = _agent(script, cut_counter).resume(saved)
        resumed = _outcome(lambda: asyncio.run(again.afinish()) if drivers[1] else again.finish())
    _same(sync, resumed)
    _executed_once(resumed, cut_counter)


def test_a_parallel_batch_cut_mid_replay_and_resumed_charges_each_card_once() -> None:
    """The issue's case: three charges run together; a snapshot between their replays holds the results."""
    counter: Counter[str] = Counter()
    script = [tool_turn(*(ToolCall(f"k{i}", "charge", {"card": i}) for i in (1, 2, 3))), reply("paid")]
    run = _agent(script, counter).start("pay")
    edges = [asyncio.run(run.aadvance()) for _ in range(5)]  # model, check, dispatch, the batch, replay 1
    assert [e.dest for e in edges][-2:] == ["Dispatch", "ExecuteTool"]
    assert counter == Counter({"k1": 1, "k2": 1, "k3": 1})
    for driver in ("sync", "async"):
        again = _agent(script, counter).resume(json.dumps(run.snapshot()))
        result = again.finish() if driver == "sync" else asyncio.run(again.afinish())
        assert (result.final, counter) == ("paid", Counter({"k1": 1, "k2": 1, "k3": 1}))


# --- approvals, in both drivers ----------------------------------------------------------------------------

APPROVALS = {
    "all approved": ({"a": True, "b": True}, {"a": 1, "b": 1}, 0),
    "all rejected": ({"a": False, "b": "too expensive"}, {}, 2),
    "mixed": ({"a": True, "b": "no"}, {"a": 1}, 1),
    "mixed, rejected first": ({"a": "not this card", "b": True}, {"b": 1}, 1),
}


@pytest.mark.parametrize(("decisions", "ran", "rejected"), APPROVALS.values(), ids=APPROVALS)
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_rejected_call_never_runs_in_either_driver(
    decisions: dict[str, bool | str], ran: dict[str, int], rejected: int, driver: str
) -> None:
    """Only approved calls run; a rejection's text reaches the model; both drivers give the same result."""
    counter: Counter[str] = Counter()
    script = [tool_turn(ToolCall("a", "charge", {"card": 1}), ToolCall("b", "charge", {"card": 2})), reply("ok")]
    agent = _agent(script, counter, approve={"charge"})
    paused = agent.run("pay")
    assert (paused.reason, [c.id for c in paused.pending]) == ("paused", ["a", "b"])
    run = agent.resume(paused, approvals=decisions)
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert counter == Counter(ran)
    notes = [m.content for m in result.messages if m.role == "tool" and "rejected" in m.content]
    assert len(notes) == rejected
    for call_id, decision in decisions.items():
        if isinstance(decision, str):
            assert any(decision in note for note in notes), call_id


def test_a_step_refused_before_an_approved_call_ran_keeps_the_decision() -> None:
    """``step()`` before carrying out the cleared call is refused naming it, and the person's decision stays."""
    counter: Counter[str] = Counter()
    script = [tool_turn(ToolCall("a", "charge", {"card": 1})), reply("ok")]
    run = _agent(script, counter, approve={"charge"}).start("pay")
    while not run.paused:
        run.advance()
    run.decide({"a": True})
    with pytest.raises(RunStateError, match=r"tool call charge \(a\) has not run yet"):
        run.stepper.step()
    assert (run.paused, run.position.calls.approvals) == (False, {"a": True})
    assert run.finish().final == "ok"
    assert counter == Counter({"a": 1})


# --- a user's check that raises --------------------------------------------------------------------------


def _boom(view: Any) -> bool:
    raise KeyError("no such field")


@pytest.mark.parametrize("state", ["AwaitModel", "CheckTruncation", "Dispatch", "ExecuteTool"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_state_to_failed_stop_condition_error(state: str, driver: str) -> None:
    """<state>->Failed[stop_condition_error]: the run stops cleanly, evidence names the check, cause is the error."""
    counter: Counter[str] = Counter()
    script = [tool_turn(ToolCall("e1", "echo", {"text": "a"})), reply("done")]
    agent = _agent(script, counter, stop_conditions=[StopCondition("my_stop", state, _boom)])
    with pytest.raises(AgentLoopError) as info:
        agent.run("q") if driver == "sync" else asyncio.run(agent.arun("q"))
    exc = info.value
    assert (exc.reason, exc.result.trace[-1].source) == ("stop_condition_error", state)
    assert (exc.evidence["condition"], exc.evidence["type"]) == ("_boom", "KeyError")
    assert isinstance(exc.__cause__, KeyError)
    _executed_once(exc.result, counter)
    with pytest.raises(ValueError, match=r"stop_condition_error.*do not lift"):
        agent.resume(exc.result)


# --- the catalogue is the one source ---------------------------------------------------------------------


def _too_chatty(run: Run) -> bool:
    """The model has written more than 5 characters in one reply."""
    return run.talk.last_response is not None and len(run.talk.last_response.message.content) > 5


def _chatty_evidence(run: Run) -> dict[str, Any]:
    """`chars`: how long the reply was."""
    return {"chars": len(run.talk.last_response.message.content) if run.talk.last_response else 0}


def test_adding_a_stop_to_the_catalogue_alone_puts_it_in_the_table_diagram_readme_and_resume_rules() -> None:
    """One new Stop entry: a table row at its checkpoint, a finalize edge, an edge drawn, a listed reason, resumable."""
    chatty = Stop("chatty", (At.CHECK_REPLY,), _too_chatty, _chatty_evidence, "the reply is too long", resume="lift")
    table = build_table((*CATALOGUE, chatty))
    rows = [str(r) for r in table.rows_from(State.CheckTruncation, "check")]
    assert rows[-2:] == ["CheckTruncation->Failed[chatty]", "CheckTruncation->Dispatch"]
    assert "chatty" in to_mermaid(table)
    assert "| `chatty` | CheckTruncation (`check`) | `_too_chatty` | `chars`: how long the reply was." in (
        reasons_table(table)
    )
    run = Run(Agent(ByHistory([]), ToolRegistry()).limits, [], table=table)
    run.at.state, run.at.reason = State.Failed, "chatty"
    run.talk.last_response = reply("short")
    assert [r.guard_name for r in table.rows_from(State.Failed, "resume") if r.guard and r.guard(run)] == [
        "resumes_before_model"
    ]


def _no_limit(limits: object) -> None:
    return None


def test_a_stop_s_counter_in_the_catalogue_alone_appears_in_every_step_s_counters() -> None:
    """A meter declared on a new Stop is read into Step.counters by the generated function, after the built-ins."""
    watched = Stop("chatty", (At.CHECK_REPLY,), _too_chatty, _chatty_evidence, "the reply is too long",
                   counter=Meter("answers", "counts.turns", _no_limit))  # fmt: skip
    table = build_table((*CATALOGUE, watched))
    run = Run(Agent(ByHistory([]), ToolRegistry()).limits, [], table=table)
    run.counts.turns, run.counts.elapsed = 3, 1.23456789
    counters = run.counters()
    assert list(counters)[-1] == "answers"
    assert counters["answers"] == [3, None]
    assert counters["steps"] == [3, 8]
    assert counters["seconds"][0] == 1.234568  # to the microsecond, as round() would give
    run.counts.turns = 4
    assert run.counters()["answers"] == [4, None]  # read afresh on every call, not kept


def test_a_table_whose_meter_names_no_attribute_is_refused_naming_the_stop() -> None:
    """Meter.used becomes code in the generated counters function, so the table accepts only an identifier."""
    bad = Stop("chatty", (At.CHECK_REPLY,), _too_chatty, _chatty_evidence, "the reply is too long",
               counter=Meter("answers", "turns; import os", _no_limit))  # fmt: skip
    with pytest.raises(DefinitionError, match=r"stop chatty: its counter's used must name an attribute of Run"):
        build_table((*CATALOGUE, bad))


def test_the_reason_literal_names_every_built_in_stop() -> None:
    """The Reason type the type checker holds on_stop to is the catalogue's reasons, no more, no less."""
    assert set(get_args(Reason)) == {stop.reason for stop in (*CATALOGUE, CONDITION_ERROR)}


def test_limits_can_be_given_as_one_object_but_not_twice() -> None:
    """Agent(limits=Limits(...)) works beside the keywords; giving both is an error naming the keyword."""
    from fsm_agent import Limits

    agent = Agent(ByHistory([]), ToolRegistry(), limits=Limits(max_steps=2))
    assert agent.limits.max_steps == 2
    with pytest.raises(ValueError, match=r"not both .*max_steps"):
        Agent(ByHistory([]), ToolRegistry(), max_steps=3, limits=Limits())


# --- the row walker against the library ------------------------------------------------------------------


class Probe:
    """A model for the library's own machine (a plain class: the library sets its trigger methods on it)."""

    state: str


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    turns=st.integers(0, 9),
    failures=st.integers(0, 4),
    pending=st.integers(0, 2),
    cancelled=st.booleans(),
    elapsed=st.sampled_from([0.0, 10.0]),
    text=st.sampled_from(["end_turn", "max_tokens", "refusal"]),
)
def test_the_library_trigger_takes_the_same_row_as_the_walker(
    turns: int, failures: int, pending: int, cancelled: bool, elapsed: float, text: str
) -> None:
    """For every state and trigger of the table, ``transitions``' own trigger() takes the row the walker takes."""
    agent = Agent(ByHistory([]), ToolRegistry(), max_steps=5, timeout=5, on_stop={"max_steps": "finalize"})
    walker = walker_for(agent.table)
    taken: list[int] = []
    machine = library_machine(agent.table, on_taken=lambda index, run: taken.append(index))
    for (state, trigger), _rows in agent.table.index.items():
        run = Run(agent.limits, [Message("user", "q")], table=agent.table, policies=agent.on_stop)
        run.at.state, run.counts.turns, run.counts.failures, run.counts.cancelled, run.counts.elapsed = (
            state,
            turns,
            failures,
            cancelled,
            elapsed,
        )
        calls = [ToolCall(f"c{i}", "echo", {"text": str(i)}) for i in range(pending)]
        run.calls.pending.extend(calls)
        run.talk.last_response = ModelResponse(Message("assistant", "x", tuple(calls)), text)
        probe = Probe()
        machine.add_model(probe, initial=str(state))
        taken.clear()
        library_moved = probe.trigger(trigger, run)  # type: ignore[attr-defined]
        machine.remove_model(probe)
        fast = walker.try_fire(run, trigger)
        assert library_moved == (fast is not None)
        if fast is not None:
            assert agent.table.rows[taken[0]].entry == fast, f"{state} on {trigger}"


SETUPS = {
    "bare": {},
    "every limit": {"timeout": 5, "token_budget": 50, "max_tool_calls": 3, "cycle_window": 6},
    "no cycle guard, finalize": {"cycle_window": 0, "on_stop": {"max_steps": "finalize"}},
    "strict hooks": {"strict_hooks": True},
}


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    setup=st.sampled_from(sorted(SETUPS)),
    cancellable=st.booleans(),
    turns=st.integers(0, 6),
    failures=st.integers(0, 4),
    pending=st.integers(0, 3),
    same_call=st.booleans(),
    tokens=st.sampled_from([0, 60]),
    elapsed=st.sampled_from([0.0, 10.0]),
    text=st.sampled_from(["end_turn", "max_tokens", "refusal"]),
)
def test_a_run_s_pruned_rows_take_the_same_edge_as_the_whole_table(
    setup: str,
    cancellable: bool,
    turns: int,
    failures: int,
    pending: int,
    same_call: bool,
    tokens: int,
    elapsed: float,
    text: str,
) -> None:
    """Leaving out a run's dormant guards changes no edge, for every state and trigger and any reachable counters."""
    from fsm_agent import CancelToken

    token = CancelToken() if cancellable else None
    if token is not None and turns % 2:
        token.cancel("stop")
    agent = Agent(ByHistory([]), demo_registry(), max_steps=5, **SETUPS[setup])  # type: ignore[arg-type]
    for state, trigger in agent.table.index:
        handle = agent.start("q", cancel=token)
        run = handle.position
        assert run.rows is not agent.table.index
        handle._observe()  # the clock and cancel token, as the driver tells them
        run.at.state, run.counts.turns, run.counts.failures, run.counts.input_tokens, run.counts.elapsed = (
            state,
            turns,
            failures,
            tokens,
            elapsed,
        )
        calls = [ToolCall(f"c{i}", "echo", {"text": "same" if same_call else str(i)}) for i in range(pending)]
        run.calls.pending.extend(calls)
        run.counts.last_signature = None if not calls else signature(calls[0]) if same_call else None
        run.talk.last_response = ModelResponse(Message("assistant", "x", tuple(calls)), text)
        for call in calls:
            run.counts.recent.append((signature(call), '"same"'))
        pruned = first_row(run, trigger)
        run.rows = agent.table.index
        whole = first_row(run, trigger)
        assert pruned == whole, f"{setup}: {state} on {trigger}"
    if setup == "bare" and not cancellable:
        # Not vacuous: a bare run walks only has_no_tool_calls, repeats_last_call and the fallback at Dispatch.
        assert [row.guard_name for row in agent.start("q").position.rows[State.Dispatch, "dispatch"]] == [
            "has_no_tool_calls",
            "repeats_last_call",
            None,
        ]


# --- the snapshot format ---------------------------------------------------------------------------------


def _stopped_snapshot() -> dict[str, Any]:
    counter: Counter[str] = Counter()
    result = _outcome(lambda: _agent([tool_turn(ToolCall("e1", "echo", {"text": "a"}))] * 3, counter).run("q"))
    assert result.snapshot is not None
    return result.snapshot


TAMPERED = {
    "elapsed nan": (("counters", "elapsed"), math.nan, "counters.elapsed must be a finite number"),
    "elapsed negative": (("counters", "elapsed"), -1e9, "counters.elapsed must be a finite number"),
    "failures negative": (("counters", "failures"), -1000, "counters.failures must be a whole number >= 0"),
    "tokens negative": (("counters", "input_tokens"), -5, "counters.input_tokens must be a whole number >= 0"),
    "turns a string": (("counters", "turns"), "3", "counters.turns must be a whole number >= 0, got '3'"),
}


@pytest.mark.parametrize(("path", "value", "message"), TAMPERED.values(), ids=TAMPERED)
def test_a_tampered_counter_is_a_snapshot_error_naming_the_field(
    path: tuple[str, str], value: Any, message: str
) -> None:
    """A counter out of type or range would switch a limit off: it is refused, naming the field."""
    from fsm_agent import SnapshotError

    data = _stopped_snapshot()
    data[path[0]][path[1]] = value
    with pytest.raises(SnapshotError, match=message):
        _agent([], Counter()).resume(data, max_steps=9)


def test_a_snapshot_without_a_limit_is_refused_rather_than_unlimited() -> None:
    """A missing limits.timeout must not silently become 'no timeout'."""
    from fsm_agent import FsmAgentError, SnapshotError

    data = _stopped_snapshot()
    del data["limits"]["timeout"]
    with pytest.raises(SnapshotError, match="limits lacks timeout") as info:
        _agent([], Counter()).resume(data, max_steps=9)
    assert isinstance(info.value, FsmAgentError)


def test_a_version_1_snapshot_taken_mid_batch_still_resumes_without_running_a_call_twice() -> None:
    """Version 1 kept a batch's outcomes as a list; it is migrated and the kept outcome is replayed, not re-run."""
    counter: Counter[str] = Counter()
    script = [tool_turn(ToolCall("k1", "charge", {"card": 1}), ToolCall("k2", "charge", {"card": 2})), reply("ok")]
    run = _agent(script, counter).start("pay")
    for _ in range(4):
        asyncio.run(run.aadvance())
    data = run.snapshot()
    assert set(data["ran"]) == {"k2"}
    old = {**data, "version": 1, "ran": [[{"id": "k2", "name": "charge", "arguments": {"card": 2},
                                             "raw_arguments": None}, data["ran"]["k2"]["content"], None]]}  # fmt: skip
    for key in ("frozen", "unfinished"):
        old.pop(key)
    result = _agent(script, counter).resume(json.dumps(old)).finish()
    assert (result.final, counter) == ("ok", Counter({"k1": 1, "k2": 1}))


def test_agent_loop_error_says_why_and_pickles_with_its_result() -> None:
    """str() gives reason, step and evidence; the error survives pickling (process pools) with its result."""
    script = [tool_turn(ToolCall("e1", "echo", {"text": "a"}))] * 4
    with pytest.raises(AgentLoopError) as info:
        _agent(script, Counter()).run("q")
    exc = info.value
    assert str(exc).startswith("repeated_action in model turn 2: signature=")
    again = pickle.loads(pickle.dumps(exc))
    assert (again.reason, again.result, again.evidence) == (exc.reason, exc.result, exc.evidence)


class SlowModel:
    """An async model whose reply takes far longer than the run may."""

    async def acomplete(self, messages: object, tools: object) -> ModelResponse:
        await asyncio.sleep(30)
        return reply("too late")

    def complete(self, messages: object, tools: object) -> ModelResponse:
        raise AssertionError("the async driver uses acomplete")


def test_a_model_call_in_flight_at_the_deadline_is_cancelled_and_the_run_stops_on_timeout() -> None:
    """AwaitModel->Failed[timeout] on expired, async: the call is cancelled, named unfinished, the turn counted."""
    with pytest.raises(AgentLoopError) as info:
        asyncio.run(Agent(SlowModel(), ToolRegistry(), timeout=0.2).arun("q"))
    exc = info.value
    assert (exc.reason, exc.result.trace[-1].trigger) == ("timeout", "expired")
    assert exc.evidence["unfinished"] == "model call of turn 1"
    assert exc.evidence["counters"]["steps"][0] == 1


def test_an_async_tool_in_flight_at_the_deadline_is_cancelled_and_the_run_stops_on_timeout() -> None:
    """ExecuteTool->Failed[timeout] on expired, async: the tool is cancelled and the call stays pending."""
    registry = ToolRegistry()

    @registry.register
    async def slow() -> str:
        """Take a long time."""
        await asyncio.sleep(30)
        return "late"

    agent = Agent(ByHistory([tool_turn(ToolCall("s1", "slow", {}))]), registry, timeout=0.2)
    with pytest.raises(AgentLoopError) as info:
        asyncio.run(agent.arun("q"))
    exc = info.value
    assert (exc.reason, exc.evidence["unfinished"], [c.id for c in exc.result.pending]) == ("timeout", "s1", ["s1"])


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_call_whose_time_is_up_before_it_starts_is_not_made(driver: str) -> None:
    """Time that passes between two advances ends the run on the expired edge, with no call made or counted."""
    clock = ManualClock()
    model = FakeModel([tool_turn(ToolCall("e1", "echo", {"text": "hi"})), reply("never asked")])
    run = Agent(model, demo_registry(), clock=clock, timeout=5).start("q")
    for _ in range(4):  # one tool turn, back in AwaitModel
        run.advance()
    clock.advance(10)
    edge = run.advance() if driver == "sync" else asyncio.run(run.aadvance())
    assert (edge.source, edge.trigger, edge.dest, edge.reason) == ("AwaitModel", "expired", "Failed", "timeout")
    assert (len(model.seen), run.turns) == (1, 1)
    assert run.result.evidence["step"] == 0
