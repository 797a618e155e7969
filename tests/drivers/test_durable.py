"""Durable runs: snapshots at any transition, resuming with new limits, human approval, the stores (both kinds)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import pytest
from support.store_cases import child_process

import fsm_agent
from fsm_agent import (
    Agent,
    AgentLoopError,
    CancelToken,
    Message,
    ModelResponse,
    RunResult,
    RunStateError,
    ToolRegistry,
    Usage,
)
from fsm_agent.errors import SnapshotError
from fsm_agent.persist import SqliteStore, open_store
from fsm_agent.testing import ManualClock, demo_registry, edges, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Conversation:
    """A scripted model that answers by how many replies it already gave: stateless, so any process can resume it."""

    def __init__(self, responses: Sequence[ModelResponse | Exception]) -> None:
        self.responses = list(responses)

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        given = sum(1 for m in messages if m.role == "assistant")
        item = self.responses[given]
        if isinstance(item, Exception):
            raise item
        return item


SCRIPT = [
    tool_turn(tool_call("echo", id="a", text="one"), content="looking", usage=Usage(10, 5)),
    tool_turn(tool_call("add", id="b", a=1, b=2), tool_call("echo", id="c", text="two"), usage=Usage(20, 5)),
    tool_turn(tool_call("fail", id="d", reason="flaky"), usage=Usage(30, 5)),
    reply("all done", usage=Usage(40, 5)),
]


def _agent(script: Sequence[ModelResponse | Exception] = SCRIPT, **options: Any) -> Agent:
    return Agent(Conversation(script), demo_registry(), clock=ManualClock(), **options)


def _outcome(go: Any) -> RunResult:
    try:
        return go()  # type: ignore[no-any-return]
    except AgentLoopError as exc:
        return exc.result


@pytest.mark.parametrize(
    ("script", "options"),
    [(SCRIPT, {}), (SCRIPT, {"max_steps": 2}), ([*SCRIPT[:2], reply("cut", stop_reason="max_tokens")], {})],
    ids=["done", "max_steps", "max_tokens"],
)
def test_a_run_cut_after_any_transition_resumes_to_the_same_result(script: Any, options: dict[str, Any]) -> None:
    """Snapshot after every transition, through JSON text, into a fresh Agent: same result, trace and messages."""
    whole = _outcome(lambda: _agent(script, **options).start("q", run_id="r1").finish())
    for cut in range(1, len(whole.trace)):
        run = _agent(script, **options).start("q", run_id="r1")
        for _ in range(cut):
            run.advance()
        text = json.dumps(run.snapshot())
        resumed = _agent(script, **options).resume(text)
        assert resumed.state == run.state
        again = _outcome(resumed.finish)
        assert again == whole, f"differs when cut after transition {cut}"


def test_resume_fires_no_callbacks_for_the_past() -> None:
    """Resuming mid-run replays nothing: hooks see only transitions made after the resume."""
    run = _agent().start("q")
    for _ in range(5):
        run.advance()
    agent = _agent()
    seen: list[str] = []
    agent.on("transition", lambda e: seen.append(e.source))
    agent.resume(run.snapshot()).finish()
    assert len(seen) == len(_agent().run("q").trace) - 5


@pytest.mark.parametrize(
    ("options", "lift", "edge"),
    [
        ({"max_steps": 2}, {"max_steps": 16}, "Failed->AwaitModel[resumes_before_model]"),
        ({"token_budget": 40}, {"token_budget": 1000}, "Failed->AwaitModel[resumes_before_model]"),
        ({"max_tool_calls": 2}, {"max_tool_calls": 10}, "Failed->Dispatch[resumes_before_tool]"),
    ],
)
def test_a_run_stopped_on_a_limit_continues_with_new_limits(
    options: dict[str, Any], lift: dict[str, Any], edge: str
) -> None:
    """What AgentLoopError hands back is enough: resume(exc.result, new limit) finishes the run."""
    agent = _agent(**options)
    with pytest.raises(AgentLoopError) as info:
        agent.run("q")
    result = agent.resume(info.value.result, **lift).finish()
    assert result.final == "all done"
    assert edge in edges(result)
    assert result.reason == "done"


def test_timeout_and_cancel_can_be_lifted() -> None:
    """A longer timeout, or a fresh cancel token, continues a run stopped on them."""
    clock = ManualClock()
    agent = Agent(Conversation(SCRIPT), demo_registry(), clock=clock, timeout=5)
    run = agent.start("q")
    run.advance()
    clock.advance(6)
    with pytest.raises(AgentLoopError) as info:
        run.finish()
    assert info.value.reason == "timeout"
    assert agent.resume(info.value.result, timeout=60).finish().final == "all done"
    token = CancelToken()
    token.cancel()
    with pytest.raises(AgentLoopError) as info:
        _agent().run("q", cancel=token)
    assert _agent().resume(info.value.result, cancel=CancelToken()).finish().final == "all done"


def test_stops_the_new_limits_do_not_lift_are_a_clear_error() -> None:
    """max_tokens cannot be lifted; max_steps with the same limit neither; model_error needs retry=True."""
    with pytest.raises(AgentLoopError) as cut:
        _agent([reply("half", stop_reason="max_tokens")]).run("q")
    with pytest.raises(ValueError, match="stopped with 'max_tokens', which these limits do not lift"):
        _agent().resume(cut.value.result, max_steps=50)
    with pytest.raises(AgentLoopError) as steps:
        _agent(max_steps=2).run("q")
    with pytest.raises(ValueError, match="'max_steps', which these limits do not lift"):
        _agent().resume(steps.value.result, max_steps=2)
    flaky: list[ModelResponse | Exception] = [RuntimeError("503"), *SCRIPT]
    with pytest.raises(AgentLoopError) as down:
        Agent(Conversation(flaky), demo_registry()).run("q")
    with pytest.raises(ValueError, match="model_error"):
        _agent().resume(down.value.result)


def test_model_error_resumes_with_retry() -> None:
    """resume(retry=True) calls the model again after a model_error."""
    calls = {"n": 0}

    class FlakyOnce:
        def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
            calls["n"] += 1
            if calls["n"] == 1:
                raise ConnectionError("reset")
            return reply("recovered")

    agent = Agent(FlakyOnce(), demo_registry())
    with pytest.raises(AgentLoopError) as info:
        agent.run("q")
    result = agent.resume(info.value.result, retry=True).finish()
    assert (result.final, edges(result)[1]) == ("recovered", "Failed->AwaitModel[retries_model_call]")


def test_a_finished_run_does_not_resume() -> None:
    """A run that reached Done has no snapshot and cannot be resumed."""
    result = _agent().run("q")
    assert result.snapshot is None
    with pytest.raises(ValueError, match="only stopped or paused runs resume"):
        _agent().resume(result)


# --- approval ----------------------------------------------------------------------------------------------

MAIL = [tool_turn(tool_call("echo", id="e1", text="draft"), tool_call("send", id="s1", to="boss")), reply("sent")]


def _mail_agent(**options: Any) -> tuple[Agent, list[str]]:
    registry = demo_registry()
    sent: list[str] = []

    def send(to: str) -> str:
        sent.append(to)
        return "ok"

    registry.register(send, name="send")
    return Agent(Conversation(MAIL), registry, approve={"send"}, **options), sent


def test_a_call_needing_approval_pauses_the_run_before_it_runs() -> None:
    """run() returns reason 'paused' with the call pending and a snapshot; nothing was sent."""
    agent, sent = _mail_agent()
    result = agent.run("mail the boss")
    assert (result.reason, result.ok, [c.id for c in result.pending]) == ("paused", False, ["s1"])
    assert sent == []
    assert result.snapshot is not None
    assert result.snapshot["paused"] is True
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == ["e1"]


def test_advance_is_an_error_until_a_decision_is_given() -> None:
    """A paused run object stays in ExecuteTool; advance() says what it waits for."""
    agent, _ = _mail_agent()
    run = agent.start("q")
    while not run.paused:
        run.advance()
    assert run.state == "ExecuteTool"
    with pytest.raises(RunStateError, match=r"paused until a person decides on: send \(s1\)"):
        run.advance()
    run.decide({"s1": True})
    assert run.finish().final == "sent"


def test_approval_survives_a_restart_through_the_snapshot() -> None:
    """The paused snapshot as JSON text, resumed by a new agent with approvals, runs the approved call."""
    agent, _ = _mail_agent()
    text = json.dumps(agent.run("q").snapshot)
    fresh, sent = _mail_agent()
    result = fresh.resume(text, approvals={"s1": True}).finish()
    assert (result.final, sent) == ("sent", ["boss"])


def test_a_rejected_call_tells_the_model_why_and_counts_as_a_failure() -> None:
    """Rejection becomes an error tool message with the reason; it counts toward tool_failures."""
    agent, sent = _mail_agent()
    paused = agent.run("q")
    result = agent.resume(paused, approvals={"s1": "not during the holidays"}).finish()
    rejection = next(m for m in result.messages if m.tool_call_id == "s1")
    assert json.loads(rejection.content)["error"] == "a person rejected this call to 'send': not during the holidays"
    assert sent == []
    strict, _ = _mail_agent(max_consecutive_failures=1)
    with pytest.raises(AgentLoopError) as info:
        strict.resume(strict.run("q"), approvals={"s1": False}).finish()
    assert info.value.reason == "tool_failures"


def test_approve_accepts_a_predicate_on_the_call() -> None:
    """approve may be a function of the tool call, e.g. only some arguments need a person."""
    registry = demo_registry()
    agent = Agent(Conversation(MAIL), registry, approve=lambda call: call.arguments.get("text") == "draft")
    assert [c.id for c in agent.run("q").pending] == ["e1"]


def test_decisions_for_unknown_calls_are_rejected() -> None:
    """A decision naming no pending call is an error, not silently ignored."""
    agent, _ = _mail_agent()
    with pytest.raises(ValueError, match="no pending tool call has id 'nope'"):
        agent.resume(agent.run("q"), approvals={"nope": True})


# --- bad snapshots -----------------------------------------------------------------------------------------


def _snapshot() -> dict[str, Any]:
    run = _agent().start("q")
    for _ in range(4):
        run.advance()
    return run.snapshot()


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda s: {**s, "version": 7}, "unsupported snapshot"),
        (lambda s: json.dumps(s)[:-5], "snapshot is not valid JSON"),
        (lambda s: {**s, "state": "Limbo"}, "snapshot state 'Limbo' is not a state"),
        (lambda s: {**s, "counters": {**s["counters"], "tool_calls": 9}}, "tool_calls is 9 but 1 tool steps"),
        (lambda s: {**s, "counters": {**s["counters"], "turns": 0}}, "turns is 0 but 1 assistant messages"),
        (lambda s: {**s, "messages": s["messages"][:2]}, "1 tool calls ran but only 0 tool messages"),
        (lambda s: {**s, "state": "Dispatch"}, "the trace ends in AwaitModel but the state is Dispatch"),
        (lambda s: {k: v for k, v in s.items() if k != "counters"}, "snapshot field counters must be an object"),
        (lambda s: {**s, "evidence": [["a", 1]]}, r"snapshot field evidence must be an object, got \[\['a', 1\]\]"),
        (lambda s: {**s, "run_id": 7}, "snapshot field run_id must be a string or null, got 7"),
        (lambda s: {**s, "steps": [1, 2]}, r"snapshot field steps must be a list of objects, got \[1, 2\]"),
        (lambda s: {**s, "trace": [{"bogus": 1}]}, r"snapshot field trace\[0\] is malformed: TypeError"),
        (lambda s: {**s, "counters": {**s["counters"], "sent": -1}}, "counters.sent must be a whole number >= 0"),
    ],
)
def test_corrupted_snapshots_are_rejected_naming_the_problem(corrupt: Any, message: str) -> None:
    """Wrong version, broken JSON, unknown state, counters contradicting messages: a SnapshotError saying what."""
    with pytest.raises(SnapshotError, match=message):
        _agent().resume(corrupt(_snapshot()))


# --- the store ---------------------------------------------------------------------------------------------


def test_store_keeps_the_latest_snapshot_lists_runs_and_deletes_finished(store_target: str) -> None:
    """A run with a store is saved after every transition; list, load and delete work by run id."""
    with open_store(store_target) as store:
        _agent().run("q", store=store, run_id="ok")
        with pytest.raises(AgentLoopError):
            _agent(max_steps=1).run("q", store=store, run_id="stopped")
        runs = {r.run_id: (r.state, r.reason) for r in store.list_runs()}
        assert runs == {"ok": ("Done", "done"), "stopped": ("Failed", "max_steps")}
        assert store.load("stopped")["counters"]["turns"] == 1
        with pytest.raises(KeyError, match="no run 'missing'"):
            store.load("missing")
        assert store.delete_finished() == 2
        assert store.list_runs() == []


def test_store_every_turn_writes_less_but_still_resumes(store_target: str) -> None:
    """every='turn' saves before model calls and at the end; the saved run resumes to the same result."""
    saves: list[str] = []
    with open_store(store_target, every="turn") as store:
        real_append = store.append

        def append(entry: Any, *, owner: str) -> None:
            saves.append(entry.summary.state)
            real_append(entry, owner=owner)

        store.append = append  # type: ignore[method-assign]
        run = _agent().start("q", store=store, run_id="t")
        for _ in range(6):
            run.advance()
        assert set(saves) <= {"AwaitModel", "Done", "Failed"}
        assert _agent().resume(store.load("t")).finish() == _agent().start("q", run_id="t").finish()


def _child(path: str, every: str) -> None:
    """Run the script with a store; the third tool call kills the process without any cleanup."""
    registry = ToolRegistry()
    for name in ("echo", "add"):
        tool = demo_registry().get(name)
        assert tool is not None
        registry.register(tool.function, name=name)
    registry.register(lambda reason="x": os._exit(9), name="fail", description="dies")
    agent = Agent(Conversation(SCRIPT), registry, clock=ManualClock())
    agent.run("q", store=open_store(path, lease=0.2, every=every), run_id="crash")


@pytest.mark.subprocess
@pytest.mark.parametrize("every", ["transition", "call"])
def test_a_killed_process_loses_at_most_the_transition_in_flight(store_target: str, every: str) -> None:
    """A child killed mid-call leaves its last transition (every="call": its last call's outcome) in the store;
    the parent resumes and finishes."""
    path = store_target
    child = child_process(_child, path, every)
    child.start()
    child.join(60)
    assert child.exitcode == 9
    time.sleep(0.3)  # the dead process's lease lapses
    with open_store(path) as store:
        saved = store.load("crash")
        if every == "transition":
            assert (saved["state"], saved["pending"][0]["id"]) == ("ExecuteTool", "d")
        else:  # the last write closed the call before the fatal one: the model's reply asking for it
            assert saved["trace"][-1]["source"] == "AwaitModel"
            assert [c["id"] for c in saved["messages"][-1]["tool_calls"]][-1] == "d"
        result = _agent().resume(saved, store=store).finish()
        assert store.list_runs()[0].state == "Done"
    assert result == _agent().start("q", run_id="crash").finish()


def test_resumed_runs_keep_the_store_current(store_target: str) -> None:
    """A run resumed with a store goes on saving under the same id."""
    with open_store(store_target) as store:
        paused = _mail_agent()[0].run("q", store=store, run_id="mail")
        assert store.list_runs()[0].paused
        _mail_agent()[0].resume(store.load("mail"), approvals={"s1": True}, store=store).finish()
        assert [(r.run_id, r.state) for r in store.list_runs()] == [("mail", "Done")]
    assert paused.reason == "paused"


def test_fsm_agent_exports_the_durable_api() -> None:
    """The store and snapshot error are public names."""
    assert fsm_agent.SqliteStore is SqliteStore
    assert fsm_agent.SnapshotError is SnapshotError
