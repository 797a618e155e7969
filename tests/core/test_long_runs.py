"""Runs that outgrow the context window: the context_overflow stop, compaction, and history processors.

Each behaviour runs on both drivers with the same script; tools count their
calls, so a compaction retry is seen not to repeat a side effect.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.scenarios import OVERFLOW, keep_last

from fsm_agent import Agent, AgentLoopError, ContextOverflowError, Message, RunResult, SqliteStore, ToolRegistry
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


def finish(agent: Agent, driver: str, question: str = "summarise the logs") -> RunResult:
    """Run ``agent`` to the end on the sync or the async driver."""
    if driver == "sync":
        return agent.run(question)
    return asyncio.run(agent.arun(question))


def stopped(agent: Agent, driver: str) -> AgentLoopError:
    """Run ``agent`` expecting a stop."""
    with pytest.raises(AgentLoopError) as caught:
        finish(agent, driver)
    return caught.value


class Counted:
    """A registry whose one tool, ``fetch``, counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.registry = ToolRegistry()
        self.registry.register(self.fetch)

    def fetch(self, page: int) -> str:
        """Fetch one page of logs."""
        self.calls += 1
        return f"page {page}: " + "x" * 50


def _compacting(model: FakeModel, compact: Any = keep_last, **options: Any) -> Agent:
    on_stop = {"context_overflow": "compact", **options.pop("on_stop", {})}
    return Agent(model, Counted().registry, on_stop=on_stop, compact=compact, **options)


@pytest.mark.parametrize("driver", DRIVERS)
def test_await_model_to_failed_context_overflow_is_not_a_model_error(driver: str) -> None:
    """AwaitModel->Failed[context_overflow]: the evidence has the provider's message and counts; the cause is kept."""
    error = stopped(Agent(FakeModel(OVERFLOW), ToolRegistry()), driver)
    assert edges(error.result) == ["AwaitModel->Failed[context_overflow]"]
    assert error.reason == "context_overflow"
    evidence = error.result.evidence
    assert (evidence["tokens"], evidence["limit"], evidence["compacted"]) == (210000, 200000, False)
    assert evidence["error"] == "prompt is too long: 210000 tokens > 200000 maximum"
    assert isinstance(error.__cause__, ContextOverflowError)


@pytest.mark.parametrize("driver", DRIVERS)
def test_another_model_error_is_still_model_error(driver: str) -> None:
    """Only a ContextOverflowError takes the new edge; any other failure of the call stays model_error."""
    error = stopped(Agent(FakeModel(ConnectionError("down")), ToolRegistry()), driver)
    assert edges(error.result) == ["AwaitModel->Failed[model_error]"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_await_model_to_await_model_compacts_history_then_the_call_is_made_again(driver: str) -> None:
    """AwaitModel->AwaitModel[compacts_history]: compact sees the history, the model the short one; nothing lost."""
    seen: list[int] = []
    tools = Counted()

    def compact(messages: list[Message]) -> list[Message]:
        seen.append(len(messages))
        return [Message("user", "Summary so far: page 1 fetched. Go on.")]

    script = FakeModel(
        tool_turn(tool_call("fetch", id="f1", page=1)),
        OVERFLOW,
        tool_turn(tool_call("fetch", id="f2", page=2)),
        reply("both pages read"),
    )
    agent = Agent(script, tools.registry, on_stop={"context_overflow": "compact"}, compact=compact)
    result = finish(agent, driver)
    assert result.ok
    assert "AwaitModel->AwaitModel[compacts_history]" in edges(result)
    assert seen == [3]  # question, the call, its result
    assert [m.content for m in script.seen[2]] == ["Summary so far: page 1 fetched. Go on."]
    assert len(script.seen[3]) == 3  # the summary, then the new call and its result
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert tools.calls == 2
    compaction = [step for step in result.steps if step.kind == "compaction"]
    assert [step.detail for step in compaction] == ["3 messages -> 1"]
    assert [step.sent for step in result.steps if step.kind != "compaction"] == [0, 1, 3]


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_async_compact_function_takes_effect_on_both_drivers(driver: str) -> None:
    """An async compact is awaited (on the sync driver too), and its history is what the model gets next."""

    async def summarise(messages: list[Message]) -> list[Message]:
        await asyncio.sleep(0)
        return [Message("user", f"({len(messages)} messages summarised)")]

    model = FakeModel(OVERFLOW, reply("ok"))
    result = finish(_compacting(model, summarise), driver)
    assert result.final == "ok"
    assert [m.content for m in model.seen[1]] == ["(1 messages summarised)"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_second_overflow_right_after_a_compaction_stops_the_run(driver: str) -> None:
    """The call is made again once: overflowing again, the run takes AwaitModel->Failed[context_overflow]."""
    model = FakeModel(OVERFLOW, OVERFLOW, reply("never"))
    error = stopped(_compacting(model), driver)
    assert edges(error.result) == ["AwaitModel->AwaitModel[compacts_history]", "AwaitModel->Failed[context_overflow]"]
    assert error.result.evidence["compacted"] is True
    assert len(model.seen) == 2


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_overflow_later_in_the_run_is_compacted_again(driver: str) -> None:
    """Once per overflow, not once per run: a later overflow, after a good reply, is compacted too."""
    model = FakeModel(OVERFLOW, tool_turn(tool_call("fetch", id="f1", page=1)), OVERFLOW, reply("done"), reply("never"))
    result = finish(_compacting(model), driver)
    assert edges(result).count("AwaitModel->AwaitModel[compacts_history]") == 2
    assert result.final == "done"


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("compact", "problem"),
    [
        (lambda messages: [], "compact must return a non-empty list of Message"),
        (lambda messages: ["text"], "compact must return a list of Message; not messages: [0] str"),
        (lambda messages: 1 / 0, "compact raised ZeroDivisionError: division by zero"),
        (
            lambda messages: [Message("assistant", "", tool_calls=(tool_call("fetch", id="lost", page=1),))],
            "compact returned a history providers refuse",
        ),
    ],
    ids=["empty", "not_messages", "raises", "unpaired_call"],
)
def test_a_compaction_that_fails_stops_the_run_saying_why(compact: Any, problem: str, driver: str) -> None:
    """A compact that raises or returns what no provider accepts leaves the overflow standing: context_overflow."""
    model = FakeModel(OVERFLOW, reply("never"))
    error = stopped(_compacting(model, compact), driver)
    assert error.reason == "context_overflow"
    assert error.result.evidence["compact_error"].startswith(problem)
    assert len(model.seen) == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_limit_that_forbids_the_next_call_stops_the_compaction_retry(driver: str) -> None:
    """With max_steps spent, no compaction is made: context_overflow, blocked_by max_steps."""
    compacted: list[int] = []

    def compact(messages: list[Message]) -> list[Message]:
        compacted.append(len(messages))
        return messages[-1:]

    error = stopped(_compacting(FakeModel(OVERFLOW, reply("never")), compact, max_steps=1), driver)
    assert error.result.evidence["blocked_by"] == "max_steps"
    assert compacted == []


@pytest.mark.parametrize("driver", DRIVERS)
def test_history_processors_shape_what_is_sent_but_not_what_is_recorded(driver: str) -> None:
    """Each processor (sync or async) runs on a copy before every call; the step says how many messages went."""
    tools = Counted()

    def without_system(messages: list[Message]) -> list[Message]:
        messages[:] = [m for m in messages if m.role != "system"]  # changing the copy must not change the run
        return messages

    async def tagged(messages: list[Message]) -> list[Message]:
        await asyncio.sleep(0)
        return [Message("user", "[trimmed]"), *messages]

    model = FakeModel(
        tool_turn(tool_call("fetch", id="f1", page=1)),
        tool_turn(tool_call("fetch", id="f2", page=2)),
        reply("done"),
    )
    agent = Agent(model, tools.registry, "You read logs.", history_processors=[without_system, tagged])
    result = finish(agent, driver)
    assert [len(messages) for messages in model.seen] == [2, 4, 6]
    assert all(messages[0].content == "[trimmed]" for messages in model.seen)
    assert result.messages[0].role == "system"
    assert len(result.messages) == 7  # system, question, 2 x (call, result), answer
    assert [step.sent for step in result.steps] == [2, 4, 6]
    assert tools.calls == 2


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("processor", "error"),
    [
        (lambda messages: 1 / 0, "ZeroDivisionError"),
        (lambda messages: [m for m in messages if m.role != "tool"], "history processor <lambda> returned"),
    ],
    ids=["raises", "drops_tool_answers"],
)
def test_a_processor_that_fails_stops_the_run_with_model_error(processor: Any, error: str, driver: str) -> None:
    """A processor that raises, or makes a history providers refuse, is a model_error before any call is made."""
    model = FakeModel(tool_turn(tool_call("fetch", id="f1", page=1)), reply("never"))
    caught = stopped(Agent(model, Counted().registry, history_processors=[lambda m: m, processor]), driver)
    assert caught.reason == "model_error"
    assert error in f"{type(caught.__cause__).__name__}: {caught.__cause__}"
    assert len(model.seen) == (0 if error == "ZeroDivisionError" else 1)


def test_a_compacted_run_resumes_sending_the_compacted_history() -> None:
    """The compaction is part of the snapshot: a resumed run goes on from the short history, not the long one."""
    model = FakeModel(
        tool_turn(tool_call("fetch", id="f1", page=1)),
        OVERFLOW,
        tool_turn(tool_call("fetch", id="f2", page=2), tool_call("fetch", id="f3", page=3)),
    )
    agent = _compacting(model, max_tool_calls=2, on_stop={"context_overflow": "compact", "max_tool_calls": "return"})
    first = agent.run("read the logs")
    assert first.reason == "max_tool_calls"
    assert first.snapshot is not None
    assert first.snapshot["compaction"]["start"] == 3
    later = FakeModel(reply("all read"))
    again = _compacting(later).resume(first, max_tool_calls=5).finish()
    assert again.final == "all read"
    assert later.seen[0][0].content == "read the logs"
    assert len(later.seen[0]) == 1 + 3  # the kept question, then the turn after the compaction
    assert len(again.messages) == 7


def test_a_context_overflow_resumes_with_retry_under_an_agent_that_trims() -> None:
    """A run stopped on context_overflow continues with retry=True, here under an agent whose processor trims."""
    first = stopped(Agent(FakeModel(OVERFLOW), ToolRegistry()), "sync").result
    model = FakeModel(reply("short enough now"))
    trimming = Agent(model, ToolRegistry(), history_processors=[lambda messages: messages[-1:]])
    result = trimming.resume(first, retry=True).finish()
    assert result.final == "short enough now"
    assert "Failed->AwaitModel[retries_model_call]" in edges(result)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"on_stop": {"context_overflow": "compact"}}, ValueError, "needs compact=fn"),
        ({"compact": keep_last}, ValueError, "called only with on_stop="),
        ({"compact": "summarise"}, TypeError, "compact must be a callable"),
        ({"history_processors": ["trim"]}, TypeError, "history_processors must hold callables"),
        ({"on_stop": {"max_steps": "compact"}}, ValueError, "compact to context_overflow"),
    ],
    ids=["policy_without_fn", "fn_without_policy", "fn_not_callable", "processor_not_callable", "wrong_reason"],
)
def test_bad_long_run_settings_are_refused_when_the_agent_is_built(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    """Each mistake is a clear error at Agent(...), before any run."""
    with pytest.raises(error, match=message):
        Agent(FakeModel(), ToolRegistry(), **options)


def test_the_viewer_shows_the_compaction_on_its_own_edge(tmp_path: Path) -> None:
    """In the replay, the compaction edge brings no message and shows its step's counters and sizes."""
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")
    from fsm_agent.ui import moments

    model = FakeModel(tool_turn(tool_call("fetch", id="f1", page=1)), OVERFLOW, reply("done"))
    with SqliteStore(tmp_path / "runs.db") as store:
        _compacting(model).run("read", store=store, run_id="long")
        data = store.load("long")
    (compaction,) = [m for m in moments(data) if m["guard"] == "compacts_history"]
    assert compaction["messages"][0] == compaction["messages"][1]
    assert compaction["counted_from"] == "after the compaction (3 messages -> 1)"
    assert data["compaction"]["head"][0]["content"] == "read"
