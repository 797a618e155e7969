"""``fsm_agent.testing.replay``: rich runs replay clean, and a change departs at its first transition.

Every tool counts its executions, so "nothing was called" is measured.
Runs are recorded on both drivers into a real store (SQLite, and PostgreSQL
where ``store_target`` gives one), exported, sent through JSON text and
replayed on both drivers.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import attrs
import pydantic
import pytest

from fsm_agent import (
    Agent,
    AgentLoopError,
    CancelToken,
    ContextOverflowError,
    Message,
    ModelResponse,
    Price,
    RunResult,
    ToolRegistry,
    Transition,
    Usage,
)
from fsm_agent.persist import open_store
from fsm_agent.persist.recording import read_recording, request_hash
from fsm_agent.testing import FakeModel, ManualClock, edges, reply, tool_call, tool_turn
from fsm_agent.testing.replay import ReplayDivergence, areplay, replay


class Made:
    """Every execution of every tool of the agents built here, by tool name."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def registry(
    made: Made, clock: ManualClock | None = None, token: CancelToken | None = None, plus: float = 0
) -> ToolRegistry:
    """``add``, ``boom`` (always raises) and ``big`` (a large text with a lone surrogate), each counting itself."""
    tools = ToolRegistry()

    def add(a: float, b: float) -> float:
        """Add two numbers."""
        made("add")
        if clock is not None:
            clock.advance(40)
        if token is not None:
            token.cancel("enough")
        return a + b + plus

    def boom(x: str) -> str:
        """Always fails."""
        made("boom")
        raise RuntimeError(f"boom \ud83d {x}")

    def big(n: int) -> str:
        """A big text."""
        made("big")
        return "é\ud83d" * n

    tools.register(add)
    tools.register(boom)
    tools.register(big)
    return tools


class Answer(pydantic.BaseModel):
    """The typed answer of the rich run."""

    total: int


RICH = [
    tool_turn(
        tool_call("add", id="a1", a=1, b=2),
        tool_call("boom", id="b1", x="ü\udc00"),
        tool_call("big", id="g1", n=50_000),
    ),
    reply("not json \ud83d"),  # rejected by the output type: one retry
    reply('{"total": 3}'),
]


def rich_agent(model: FakeModel, made: Made) -> Agent:
    return Agent(model, registry(made), system="sys ✓", output_type=Answer, output_retries=2, max_concurrency=3)


def drive(agent: Agent, driver: str, question: str, **keywords: Any) -> RunResult:
    """Run ``agent`` on ``driver``; a stop's result instead of its exception."""
    try:
        if driver == "sync":
            return agent.run(question, **keywords)
        return asyncio.run(agent.arun(question, **keywords))
    except AgentLoopError as stop:
        return stop.result


def replayed(agent: Agent, recording: Any, driver: str, **keywords: Any) -> RunResult:
    if driver == "sync":
        return replay(agent, recording, **keywords)
    return asyncio.run(areplay(agent, recording, **keywords))


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_rich_run_exported_through_json_text_replays_clean_on_both_drivers(store_target: str, driver: str) -> None:
    """A parallel batch with a failing call, a 100 kB result, lone surrogates and a typed-answer retry replay clean."""
    made = Made()
    with open_store(store_target) as store:
        original = drive(rich_agent(FakeModel(RICH), made), driver, "question \ud83d ü", store=store, run_id="rich")
        recording = store.export("rich")
    assert original.final == '{"total": 3}'
    assert made.calls == {"add": 1, "boom": 1, "big": 1}
    assert "Dispatch->AwaitModel[output_invalid]" in edges(original)
    text = json.dumps(recording)  # what a committed file holds
    loaded = read_recording(text)
    assert [c["hash"] for c in loaded["model_calls"]] == [request_hash(c["request"]) for c in loaded["model_calls"]]
    assert [c["name"] for c in loaded["tool_calls"]] == ["add", "boom", "big"]
    big = loaded["tool_calls"][2]["result"]["content"]
    assert len(big) >= 100_000
    assert "é\ud83d" in big
    for replay_driver in ("sync", "async"):
        unused = FakeModel()
        again = Made()
        result = replayed(rich_agent(unused, again), text, replay_driver)
        assert (result.final, result.trace, result.messages) == (original.final, original.trace, original.messages)
        assert (again.total, unused.seen) == (0, [])


U = Usage(input_tokens=1000, output_tokens=500)


def _turns(n: int, **keywords: Any) -> list[ModelResponse]:
    return [tool_turn(tool_call("add", id=f"x{i}", a=i, b=1), **keywords) for i in range(n)]


STOPS: dict[str, tuple[dict[str, Any], list[Any]]] = {
    # the stop: the agent's options, the live model's script
    "max_steps": ({"max_steps": 2}, _turns(5)),
    "max_steps finalized": ({"max_steps": 2, "on_stop": {"max_steps": "finalize"}}, [*_turns(2), reply("so far")]),
    "max_tokens": ({}, [reply("cut", stop_reason="max_tokens")]),
    "refusal": ({}, [reply("no", stop_reason="refusal")]),
    "repeated_action": ({}, [tool_turn(tool_call("add", id="c1", a=1, b=1))] * 3),
    "tool_failures": (
        {"max_consecutive_failures": 2},
        [tool_turn(tool_call("boom", id=f"b{i}", x=str(i))) for i in range(4)],
    ),
    "max_tool_calls": ({"max_tool_calls": 1}, _turns(4)),
    "token_budget": ({"token_budget": 2000}, _turns(4, usage=U)),
    "cost_budget": ({"cost_budget": 0.001, "prices": Price(1, 1)}, _turns(4, usage=U)),
    "model_error": ({}, [RuntimeError("provider down")]),
    "context_overflow": ({}, [ContextOverflowError("too long")]),
    "output_invalid": ({"output_type": Answer, "output_retries": 1}, [reply("x"), reply("y")]),
    "cycle": ({"cycle_window": 4, "max_steps": 20}, [tool_turn(tool_call("add", a=i % 2, b=1)) for i in range(10)]),
}


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("stop", list(STOPS))
def test_a_run_that_ended_at_each_replayable_stop_replays_as_that_stop(tmp_path: Any, stop: str, driver: str) -> None:
    """Recorded on either driver, each stop that came from the replies and results replays to it, nothing called."""
    options, script = STOPS[stop]
    made = Made()
    with open_store(str(tmp_path / "runs.db")) as store:
        original = drive(Agent(FakeModel(script), registry(made), **options), driver, "q", store=store, run_id="s")
        recording = store.export("s")
    assert original.reason == stop.split()[0]
    made = Made()
    for replay_driver in ("sync", "async"):
        unused = FakeModel()
        result = replayed(Agent(unused, registry(made), **options), recording, replay_driver)
        assert (result.reason, result.trace, result.final) == (original.reason, original.trace, original.final)
        assert (made.total, unused.seen) == (0, [])


@pytest.mark.parametrize("stop", ["timeout", "cancelled"])
def test_a_run_stopped_by_its_clock_or_its_token_replays_as_that_stop(tmp_path: Any, stop: str) -> None:
    """replay's docstring: "a recorded stop is replayed as one" (the how-to lists no exception for these two)."""
    clock = ManualClock()
    token = CancelToken() if stop == "cancelled" else None
    options: dict[str, Any] = {"timeout": 60, "clock": clock} if stop == "timeout" else {}
    made = Made()
    agent = Agent(FakeModel(_turns(5)), registry(made, clock if stop == "timeout" else None, token), **options)
    with open_store(str(tmp_path / "runs.db")) as store:
        original = drive(agent, "sync", "q", store=store, run_id="s", cancel=token)
        recording = store.export("s")
    assert original.reason == stop
    made = Made()
    result = replay(Agent(FakeModel(), registry(made), **options), recording)  # the very same agent
    assert (result.reason, result.trace) == (original.reason, original.trace)


def _parallel_recording(tmp_path: Any) -> dict[str, Any]:
    made = Made()
    script = [tool_turn(tool_call("add", id="c1", a=1, b=2), tool_call("add", id="c2", a=3, b=4)), reply("3 and 7")]
    with open_store(str(tmp_path / "runs.db")) as store:
        Agent(FakeModel(script), registry(made), max_concurrency=2).run("q", store=store, run_id="p")
        return store.export("p")


def _swap(r: dict[str, Any]) -> None:
    r["model_calls"][0]["reply"]["message"]["tool_calls"].reverse()


def _arguments(r: dict[str, Any]) -> None:
    r["model_calls"][0]["reply"]["message"]["tool_calls"][1]["arguments"] = {"a": 30, "b": 4}


def _result(r: dict[str, Any]) -> None:
    r["tool_calls"][1]["result"]["content"] = "70"


EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    # one thing changed in the recording, and a line of the diff that names it
    "the order of the parallel calls": (_swap, '+          "id": "c2",'),
    "a call's arguments": (_arguments, '+            "a": 30,'),
    "a tool's result": (_result, '+      "content": "70",'),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_one_edit_of_a_recorded_batch_departs_at_the_next_model_call_with_its_diff(tmp_path: Any, edit: str) -> None:
    """Transitions 0-5 are the first turn and its batch of two; the edit first shows in model call 2 (transition 6)."""
    recording = _parallel_recording(tmp_path)
    change, line = EDITS[edit]
    edited = copy.deepcopy(recording)
    change(edited)
    made = Made()
    for driver in ("sync", "async"):
        with pytest.raises(ReplayDivergence) as caught:
            replayed(Agent(FakeModel(), registry(made), max_concurrency=2), edited, driver)
        departed = caught.value
        assert departed.index == 6
        assert departed.expected == Transition(**recording["trace"][6])
        assert departed.actual is not None
        assert (departed.actual.dest, departed.actual.reason) == ("Failed", "model_error")
        assert "request of model call 2" in departed.diff
        assert line in departed.diff, departed.diff
    assert made.total == 0


def test_a_changed_live_tool_departs_at_the_model_call_that_is_sent_its_result(tmp_path: Any) -> None:
    """With tools="live" the tools run: unchanged, the replay is clean; one that now adds 1 departs at model call 2."""
    recording = _parallel_recording(tmp_path)
    made = Made()
    same = replay(Agent(FakeModel(), registry(made), max_concurrency=2), recording, tools="live")
    assert (same.final, made.calls) == ("3 and 7", {"add": 2})
    made = Made()
    with pytest.raises(ReplayDivergence) as caught:
        replay(Agent(FakeModel(), registry(made, plus=1), max_concurrency=2), recording, tools="live")
    assert made.calls == {"add": 2}
    assert caught.value.index == 6
    assert '+      "content": "4",' in caught.value.diff


def _tool_messages_edited(messages: list[Message]) -> list[Message]:
    """A history processor that acts from the second model call on: only then is a tool message in the history."""
    return [attrs.evolve(m, content=f"EDITED {m.content}") if m.role == "tool" else m for m in messages]


def _recorded_with_a_model_error(tmp_path: Any, *, retried: bool) -> tuple[dict[str, Any], RunResult]:
    """Model call 1 asks for add, model call 2 fails (and, ``retried``, is made again with retry=True and answers)."""
    made = Made()
    script: list[Any] = [tool_turn(tool_call("add", id="c1", a=2, b=3)), RuntimeError("provider down"), reply("5")]
    agent = Agent(FakeModel(script), registry(made), system="s")
    with open_store(str(tmp_path / "runs.db")) as store:
        result = drive(agent, "sync", "q", store=store, run_id="e")
        if retried:
            result = agent.resume(result, retry=True, store=store).finish()
        return store.export("e"), result


def test_a_changed_request_at_a_recorded_model_error_departs(tmp_path: Any) -> None:
    """The how-to: a changed agent "fails the test at the exact transition where the run departs, with a diff"."""
    recording, original = _recorded_with_a_model_error(tmp_path, retried=False)
    assert original.reason == "model_error"
    assert recording["model_calls"][1]["error"] == "RuntimeError: provider down"
    changed = Agent(FakeModel(), registry(Made()), system="s", history_processors=[_tool_messages_edited])
    with pytest.raises(ReplayDivergence) as caught:
        replay(changed, recording)  # today: returns the model_error result, no divergence
    assert caught.value.index == 4
    assert '+      "content": "EDITED 5",' in caught.value.diff


def test_a_changed_request_at_a_retried_model_error_departs_at_that_call(tmp_path: Any) -> None:
    """The diff names model call 2 (transition 4); the divergence's index says transition 6 (model call 3)."""
    recording, original = _recorded_with_a_model_error(tmp_path, retried=True)
    assert edges(original)[4:6] == ["AwaitModel->Failed[model_error]", "Failed->AwaitModel[retries_model_call]"]
    changed = Agent(FakeModel(), registry(Made()), system="s", history_processors=[_tool_messages_edited])
    with pytest.raises(ReplayDivergence) as caught:
        replay(changed, recording)
    assert "request of model call 2" in caught.value.diff
    assert caught.value.index == 4  # today: 6


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_not_strict_runs_a_live_call_whose_arguments_the_recording_lacks(tmp_path: Any, driver: str) -> None:
    """The how-to: past the divergence "tools the recording lacks run for real"; add(10, 20) was never recorded."""
    made = Made()
    script = [tool_turn(tool_call("add", id="call_1", a=1, b=2)), reply("3")]
    with open_store(str(tmp_path / "runs.db")) as store:
        Agent(FakeModel(script), registry(made), system="s").run("q", store=store, run_id="r")
        recording = store.export("r")
    made = Made()
    live = FakeModel(tool_turn(tool_call("add", id="call_1", a=10, b=20)), reply("30"))
    changed = Agent(FakeModel(), registry(made), system="another prompt")
    if driver == "sync":
        fresh = replay(changed, recording, strict=False, model=live)
    else:
        fresh = asyncio.run(areplay(changed, recording, strict=False, model=live))
    assert live.seen[1][-1].content == "30"  # today: "3", the result of add(1, 2)
    assert made.calls == {"add": 1}
    assert [(c["arguments"], c["result"]["content"]) for c in fresh["tool_calls"]] == [({"a": 10, "b": 20}, "30")]
