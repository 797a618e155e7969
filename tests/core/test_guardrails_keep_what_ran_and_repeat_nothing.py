"""Guardrails (input, answer) and tool stop conditions (Dispatch, ExecuteTool) drop nothing and repeat no tool.

Each tool counts its executions; each case runs on both drivers, with a
``SqliteStore`` where the store's copy is part of the promise, and with a
parallel batch where the async driver could run calls past a stop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import (
    Agent,
    AgentLoopError,
    RunResult,
    RunView,
    SqliteStore,
    StopCondition,
    ToolRegistry,
    TransitionEvent,
    run_context,
)
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class Counted:
    """A registry whose one tool, ``bump``, counts how often it ran for each key."""

    def __init__(self) -> None:
        self.ran: dict[str, int] = {}
        self.registry = ToolRegistry()

        @self.registry.register
        def bump(key: str) -> str:
            """Count one execution of ``key``."""
            self.ran[key] = self.ran.get(key, 0) + 1
            return f"bumped {key}"


def batch(*keys: str) -> Any:
    return tool_turn(*(tool_call("bump", id=key, key=key) for key in keys))


def ended(agent: Agent, driver: str, question: str = "q", **keywords: Any) -> RunResult:
    """The run's result, returned or carried by the ``AgentLoopError``."""
    try:
        return agent.run(question, **keywords) if driver == "sync" else asyncio.run(agent.arun(question, **keywords))
    except AgentLoopError as stop:
        return stop.result


def finished(run: Any, driver: str) -> RunResult:
    try:
        return run.finish() if driver == "sync" else asyncio.run(run.afinish())
    except AgentLoopError as stop:
        return stop.result


def asks_for_a_password(view: RunView) -> bool:
    """The input asks for a password."""
    return "password" in view.messages[-1].content


def leaks_a_key(view: RunView) -> bool:
    """The answer holds a key."""
    return view.last_response is not None and "sk-" in view.last_response.message.content


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_input_trip_of_a_stored_run_makes_no_call_and_the_store_holds_the_stop(driver: str, tmp_path: Path) -> None:
    tools = Counted()
    model = FakeModel(batch("a"), reply("never"))
    guard = StopCondition("unsafe_input", "input", asks_for_a_password, "asks for a password")
    agent = Agent(model, tools.registry, stop_conditions=[guard])
    store = SqliteStore(tmp_path / "runs.db")
    result = ended(agent, driver, "the admin password?", store=store, run_id="r1")
    assert result.reason == "unsafe_input"
    assert edges(result) == ["AwaitModel->Failed[unsafe_input]"]
    assert model.seen == []
    assert tools.ran == {}
    stored = store.load("r1")
    assert (stored["state"], stored["reason"]) == ("Failed", "unsafe_input")
    assert [m["content"] for m in stored["messages"]] == ["the admin password?"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_input_trip_is_the_only_edge_a_stream_yields_before_it_raises(driver: str) -> None:
    model = FakeModel(reply("never"))
    guard = StopCondition("unsafe_input", "input", asks_for_a_password, "asks for a password")
    agent = Agent(model, Counted().registry, stop_conditions=[guard])
    seen: list[Any] = []

    async def collect() -> None:
        async for event in agent.astream("the password?"):
            seen.append(event)

    def read() -> None:
        if driver == "sync":
            seen.extend(agent.stream("the password?"))
        else:
            asyncio.run(collect())

    with pytest.raises(AgentLoopError) as stop:
        read()
    assert stop.value.reason == "unsafe_input"
    assert [(e.source, e.dest, e.reason) for e in seen] == [("AwaitModel", "Failed", "unsafe_input")]
    assert model.seen == []


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_answer_trip_after_a_parallel_batch_keeps_every_result_and_counts_each_call_once(
    driver: str, tmp_path: Path
) -> None:
    tools = Counted()
    model = FakeModel(batch("a", "b", "c"), reply("Your key is sk-123."))
    guard = StopCondition("leaked_key", "answer", leaks_a_key, "holds a key", policy="return")
    agent = Agent(model, tools.registry, stop_conditions=[guard])
    store = SqliteStore(tmp_path / "runs.db")
    result = ended(agent, driver, store=store, run_id="r1")
    assert result.reason == "leaked_key"
    assert tools.ran == {"a": 1, "b": 1, "c": 1}
    assert result.final == "Your key is sk-123."
    assert [m.content for m in result.messages if m.role == "tool"] == ['"bumped a"', '"bumped b"', '"bumped c"']
    assert result.evidence["counters"]["tool_calls"][0] == 3
    assert edges(result)[-1] == "Dispatch->Failed[leaked_key]"
    stored = store.load("r1")
    assert (stored["state"], stored["reason"]) == ("Failed", "leaked_key")
    assert [m["content"] for m in stored["messages"]] == [m.content for m in result.messages]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_dispatch_stop_in_a_parallel_batch_runs_no_call_after_it_and_keeps_them_pending(driver: str) -> None:
    tools = Counted()

    def b_is_next(view: RunView) -> bool:
        """The next call is b's."""
        return bool(view.pending) and view.pending[0].arguments.get("key") == "b"

    guard = StopCondition("needs_review", "Dispatch", b_is_next, "b needs a person", policy="return")
    agent = Agent(FakeModel(batch("a", "b", "c"), reply("never")), tools.registry, stop_conditions=[guard])
    result = ended(agent, driver)
    assert result.reason == "needs_review"
    assert tools.ran == {"a": 1}
    assert [call.id for call in result.pending] == ["b", "c"]
    assert [m.content for m in result.messages if m.role == "tool"] == ['"bumped a"']


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_execute_tool_stop_after_a_parallel_batch_keeps_all_its_outcomes(driver: str) -> None:
    tools = Counted()

    def after_one_call(view: RunView) -> bool:
        """A tool ran."""
        return view.counters["tool_calls"][0] >= 1

    guard = StopCondition("enough", "ExecuteTool", after_one_call, "one call is enough", policy="return")
    model = FakeModel(batch("a", "b", "c"), reply("never"))
    result = ended(Agent(model, tools.registry, stop_conditions=[guard]), driver)
    assert result.reason == "enough"
    assert tools.ran == {"a": 1, "b": 1, "c": 1}
    assert len(result.steps) == 3
    assert result.pending == ()
    assert len(model.seen) == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_answer_trip_on_a_resumed_run_keeps_the_answer_and_repeats_no_tool(driver: str, tmp_path: Path) -> None:
    tools = Counted()
    model = FakeModel(batch("a"), batch("b"), reply("Use sk-999."))
    guard = StopCondition("leaked_key", "answer", leaks_a_key, "holds a key")
    agent = Agent(model, tools.registry, max_steps=1, stop_conditions=[guard])
    store = SqliteStore(tmp_path / "runs.db")
    first = ended(agent, driver, store=store, run_id="r1")
    assert first.reason == "max_steps"
    assert tools.ran == {"a": 1}
    result = finished(agent.resume(store.load("r1"), store=store, max_steps=5), driver)
    assert result.reason == "leaked_key"
    assert result.final == "Use sk-999."
    assert tools.ran == {"a": 1, "b": 1}
    assert store.load("r1")["reason"] == "leaked_key"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_guardrail_that_raises_on_a_retried_run_is_the_stops_cause(driver: str) -> None:
    """A model_error, resumed with retry, then an answer guardrail that raises: its exception is the cause."""

    def moderation(view: RunView) -> bool:
        """A moderation service."""
        raise TimeoutError("moderation down")

    guard = StopCondition("flagged", "answer", moderation, "flagged")
    agent = Agent(FakeModel(ConnectionError("reset"), reply("hello")), Counted().registry, stop_conditions=[guard])
    first = ended(agent, driver)
    assert first.reason == "model_error"
    run = agent.resume(first, retry=True)
    with pytest.raises(AgentLoopError) as stop:
        run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert stop.value.reason == "stop_condition_error"
    assert stop.value.evidence["condition"] == "moderation"
    assert isinstance(stop.value.__cause__, TimeoutError)
    assert [m.content for m in stop.value.result.messages if m.role == "assistant"] == ["hello"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_answer_whose_guardrail_raises_is_kept_in_final_like_a_tripped_one(driver: str) -> None:
    """Guardrails doc: the answer is kept in result.final (there for a trip); a raising check drops it from final."""

    def moderation(view: RunView) -> bool:
        """A moderation service."""
        raise ConnectionError("moderation service unreachable")

    def flags_all(view: RunView) -> bool:
        """Flags every answer."""
        return True

    finals = {}
    for check in (flags_all, moderation):
        guard = StopCondition("flagged", "answer", check, "flagged", policy="return")
        agent = Agent(FakeModel(reply("Hello there.")), Counted().registry, stop_conditions=[guard])
        result = ended(agent, driver)
        assert edges(result)[-1].startswith("Dispatch->Failed[")
        finals[check.__name__] = result.final
    assert finals == {"flags_all": "Hello there.", "moderation": "Hello there."}  # moderation: ''


@pytest.mark.parametrize("way", ["run", "arun", "stream", "astream"])
def test_input_and_answer_guardrails_read_the_runs_deps_on_every_way_of_running(way: str) -> None:
    class Policy:
        banned_input = "evil"
        banned_answer = "bad"

    def banned_input(view: RunView) -> bool:
        """The input is banned by the app's policy."""
        return view.messages[-1].content == run_context().deps.banned_input

    def banned_answer(view: RunView) -> bool:
        """The answer is banned by the app's policy."""
        return view.last_response is not None and view.last_response.message.content == run_context().deps.banned_answer

    def agent(model: FakeModel) -> Agent:
        conditions = [
            StopCondition("banned_input", "input", banned_input, "banned input", policy="return"),
            StopCondition("banned_answer", "answer", banned_answer, "banned answer", policy="return"),
        ]
        return Agent(model, Counted().registry, stop_conditions=conditions)

    def result_of(agent: Agent, question: str) -> RunResult:
        if way == "run":
            return agent.run(question, deps=Policy())
        if way == "arun":
            return asyncio.run(agent.arun(question, deps=Policy()))
        if way == "stream":
            events: list[Any] = list(agent.stream(question, deps=Policy()))
        else:

            async def collect() -> list[Any]:
                return [event async for event in agent.astream(question, deps=Policy())]

            events = asyncio.run(collect())
        last = events[-1]
        assert isinstance(last, TransitionEvent)
        assert last.result is not None
        return last.result

    blocked = FakeModel(reply("fine"))
    assert result_of(agent(blocked), "evil").reason == "banned_input"
    assert blocked.seen == []
    answered = result_of(agent(FakeModel(reply("bad"))), "hello")
    assert (answered.reason, answered.final) == ("banned_answer", "bad")
    assert result_of(agent(FakeModel(reply("good"))), "hello").reason == "done"
