"""A call id names one call: reused ids are made unique on arrival, and a sub-agent's stored run answers only its call.

Providers do reuse ids (some OpenAI-compatible servers number every reply's
calls from ``call_0``), and outcomes, decisions and sub-agent runs are kept
by call id, so a reused id once let one call take another's outcome.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, SqliteStore, ToolRegistry
from fsm_agent.records import Message, ModelResponse
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


def _run(agent: Agent, driver: str, text: str = "go", **options: Any) -> Any:
    if driver == "sync":
        return agent.run(text, **options)
    return asyncio.run(agent.arun(text, **options))


def _adder(made: list[tuple[int, int]]) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.register
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        made.append((a, b))
        return a + b

    return tools


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_calls_reusing_an_id_in_one_reply_and_across_turns_each_run_once_with_their_own_answer(driver: str) -> None:
    """Three calls all named call_0: each runs once, and each tool message answers its own call under a fresh id."""
    made: list[tuple[int, int]] = []
    model = FakeModel(
        tool_turn(tool_call("add", id="call_0", a=1, b=2), tool_call("add", id="call_0", a=3, b=4)),
        tool_turn(tool_call("add", id="call_0", a=5, b=6)),
        reply("ok"),
    )
    result = _run(Agent(model, _adder(made)), driver)
    assert sorted(made) == [(1, 2), (3, 4), (5, 6)]
    asked = [call.id for m in result.messages for call in m.tool_calls]
    assert asked == ["call_0", "call_0-2", "call_0-3"]
    answers = {m.tool_call_id: m.content for m in result.messages if m.role == "tool"}
    assert answers == {"call_0": "3", "call_0-2": "7", "call_0-3": "11"}
    assert model.seen[2][1].tool_calls[1].id == "call_0-2", "the model is sent back the ids its calls were answered by"


class _Capitals:
    """A child model that answers the capital its question names, counting the questions it was asked."""

    def __init__(self, asked: list[str]) -> None:
        self.asked = asked

    def complete(self, messages: Sequence[Message], tools: list[Any]) -> ModelResponse:
        """Name the capital of the country in the question."""
        question = messages[-1].content
        self.asked.append(question)
        return reply("Rome" if "Italy" in question else "Paris")


def _parent(script: Sequence[ModelResponse], asked: list[str]) -> Agent:
    tools = ToolRegistry()
    tools.register(Agent(_Capitals(asked), ToolRegistry()).as_tool("geo", "Knows capitals."))
    return Agent(FakeModel(*script), tools)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_provider_reusing_call_ids_gets_each_sub_agent_question_answered(driver: str, tmp_path: Path) -> None:
    """Two sub-agent calls both named call_0: the child is asked both questions, and each answer is its own."""
    asked: list[str] = []
    script = (
        tool_turn(tool_call("geo", id="call_0", input="capital of France?")),
        tool_turn(tool_call("geo", id="call_0", input="capital of Italy?")),
        reply("done"),
    )
    with SqliteStore(tmp_path / "runs.db") as store:
        result = _run(_parent(script, asked), driver, store=store, run_id="P")
        assert asked == ["capital of France?", "capital of Italy?"]
        assert [m.content for m in result.messages if m.role == "tool"] == ['"Paris"', '"Rome"']
        assert {run.run_id for run in store.list_runs()} == {"P", "P/call_0", "P/call_0-2"}


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_parent_started_again_over_its_id_never_takes_its_old_childs_answer_to_another_question(
    driver: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """overwrite=True with a new question: the stored child of the old run is not taken; the child is asked."""
    asked: list[str] = []
    with SqliteStore(tmp_path / "runs.db") as store:
        first = (tool_turn(tool_call("geo", id="c1", input="capital of France?")), reply("done"))
        _run(_parent(first, asked), driver, store=store, run_id="P")
        second = (tool_turn(tool_call("geo", id="c1", input="capital of Italy?")), reply("done"))
        with caplog.at_level(logging.WARNING, logger="fsm_agent"):
            result = _run(_parent(second, asked), driver, store=store, run_id="P", overwrite=True)
        assert asked == ["capital of France?", "capital of Italy?"]
        assert [m.content for m in result.messages if m.role == "tool"] == ['"Rome"']
        assert "stored run 'P/c1' answers another call" in caplog.text
        child = store.load(str(result.steps[0].child))
        assert (child["parent_run_id"], child["parent_call_id"]) == ("P", "c1")
        assert child["run_id"].startswith("P/c1@")


class _Crash(BaseException):
    """The process dying, as far as the run can tell: nothing after it is recorded."""


@pytest.mark.slow  # leaves a dead owner's lease (0.3 s) to lapse: a 0.5 s sleep
def test_a_stored_child_of_this_very_call_is_still_taken_without_asking_again(tmp_path: Path) -> None:
    """A parent cut after its child finished, resumed: the same call and input take the child's stored answer."""
    asked: list[str] = []
    crash = [True]

    def parent() -> Agent:
        agent = _parent(
            (
                tool_turn(tool_call("geo", id="c1", input="capital of France?"), tool_call("boom", id="c2")),
                reply("done"),
            ),
            asked,
        )
        tools = agent.registry

        @tools.register
        def boom() -> str:
            """Crash the first time."""
            if crash[0]:
                raise _Crash
            return "fine"

        return Agent(agent.model, tools)

    # Written only before model calls: the parent's stored run holds neither call's outcome when it dies.
    with SqliteStore(tmp_path / "runs.db", every="turn", lease=0.3) as store:
        with pytest.raises(_Crash):
            parent().run("go", store=store, run_id="P")
        assert asked == ["capital of France?"]
        crash[0] = False
        time.sleep(0.5)  # the dead owner's lease (0.3 s) lapses
        result = parent().resume(store.load("P"), store=store).finish()
    assert asked == ["capital of France?"], "the child was asked again"
    assert [m.content for m in result.messages if m.role == "tool"] == ['"Paris"', '"fine"']
