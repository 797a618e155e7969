"""Forks whose history is not quite the source's: another system prompt, edited messages, odd ``rerun`` values.

Every tool counts its executions by call id (``support.counted_calls``), so
"nothing was made again" is counted.  The model answers by the number of
assistant messages it is sent (as a model at temperature 0 would), so one
script serves a source and every fork of it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.by_turn import ByTurn
from support.counted_calls import Counted, finish

from fsm_agent import Agent, AgentRun, ForkEdit, ForkError, Message, RunResult, SqliteStore
from fsm_agent.testing import reply, tool_call, tool_turn

SENDS = [
    tool_turn(tool_call("send", id="s1", to="bob")),
    tool_turn(tool_call("send", id="s2", to="eve")),
    reply("done"),
]


def sender(counted: Counted, system: str = "") -> Agent:
    return Agent(ByTurn(SENDS), counted.registry, system=system)


def forked(agent: Agent, driver: str, source: Any, at: int, **keywords: Any) -> AgentRun:
    if driver == "sync":
        return agent.fork(source, at, **keywords)
    return asyncio.run(agent.afork(source, at, **keywords))


def the_source(system: str) -> RunResult:
    counted = Counted()
    source = sender(counted, system).run("go")
    assert dict(counted.ran) == {"s1": 1, "s2": 1}
    return source


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_whose_agent_adds_a_system_prompt_makes_no_completed_call_again(driver: str) -> None:
    """A source without a system prompt, forked by an agent with one: the history is the source's, nothing repeated."""
    source = the_source("")
    for at, entry in enumerate(source.trace[:-1]):
        counted = Counted()
        result = finish(forked(sender(counted, "Be brief."), driver, source, at), driver)
        assert dict(counted.ran) == {}, (at, entry)
        assert [(m.role, m.tool_call_id) for m in result.messages if m.role != "system"] == [
            (m.role, m.tool_call_id) for m in source.messages
        ], at


def test_a_fork_whose_agent_has_no_system_prompt_keeps_the_whole_history() -> None:
    """A source with a system prompt, forked by an agent without one, goes on to the source's answer."""
    source = the_source("Be brief.")
    for at in range(len(source.trace) - 1):
        counted = Counted()
        result = finish(sender(counted, "").fork(source, at), "sync")
        assert (result.reason, dict(counted.ran)) == ("done", {}), at
        assert result.messages == source.messages, at


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_whose_agent_changes_the_system_prompt_keeps_the_source_s_and_repeats_nothing(driver: str) -> None:
    """The system prompt is part of the history: the fork keeps the source's, at every index, and makes no call."""
    source = the_source("Be brief.")
    for at in range(len(source.trace) - 1):
        counted = Counted()
        result = finish(forked(sender(counted, "Be thorough."), driver, source, at), driver)
        assert (result.reason, dict(counted.ran)) == ("done", {}), at
        assert result.messages == source.messages, at


def test_an_edited_reply_that_drops_its_tool_call_is_refused_and_stores_nothing(tmp_path: Path) -> None:
    """An edit leaving a tool message that answers no call (providers refuse it) is refused; nothing is stored."""
    with SqliteStore(tmp_path / "runs.db") as store:
        sender(Counted(), "").run("go", store=store, run_id="src")
        counted = Counted()
        edit = ForkEdit(messages={1: Message("assistant", "no call here")})  # the reply that asked for s1
        with pytest.raises(ValueError, match="tool message"):
            sender(counted, "").fork("src", 3, store=store, run_id="f", edit=edit)
        assert [run.run_id for run in store.list_runs()] == ["src"]
        assert dict(counted.ran) == {}


def test_an_edited_tool_answer_turned_into_a_user_message_is_refused_and_stores_nothing(tmp_path: Path) -> None:
    """s1's answer edited into a user message leaves s1 unanswered: a ForkError, and nothing stored or called."""
    with SqliteStore(tmp_path / "runs.db") as store:
        sender(Counted(), "").run("go", store=store, run_id="src")
        counted = Counted()
        edit = ForkEdit(messages={2: Message("user", "never mind")})
        with pytest.raises(ForkError, match="tool"):
            sender(counted, "").fork("src", 3, store=store, run_id="f", edit=edit)
        assert [run.run_id for run in store.list_runs()] == ["src"]
        assert dict(counted.ran) == {}


@pytest.mark.parametrize("rerun", [{5}, {"s2", 5}])
def test_a_rerun_that_is_no_collection_of_call_ids_says_so(tmp_path: Path, rerun: set[Any]) -> None:
    """A rerun whose items are not call ids is a clear TypeError naming rerun, and nothing is stored."""
    with SqliteStore(tmp_path / "runs.db") as store:
        sender(Counted(), "").run("go", store=store, run_id="src")
        with pytest.raises(TypeError, match="rerun"):
            sender(Counted(), "").fork("src", 0, store=store, rerun=rerun)
        assert [run.run_id for run in store.list_runs()] == ["src"]


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        (ForkEdit(approvals={"zz": True}), ForkError, "no pending tool call has id 'zz'"),
        (ForkEdit(approvals={"s1": 3}), TypeError, "must be True, False or a reason text"),
        (ForkEdit(limits={"max_steps": 0}), ForkError, "max_steps must be an integer >= 1"),
        (ForkEdit(limits={"timeout": -5}), ForkError, "timeout must be a finite number"),
        (ForkEdit(results={"s1": 7}), TypeError, "must be the result's text"),  # type: ignore[dict-item]
        (ForkEdit(messages={1: 5}), TypeError, "must be a Message or a text"),  # type: ignore[dict-item]
    ],
)
def test_a_bad_decision_limit_or_edit_at_a_pause_is_refused_and_stores_nothing(
    store_target: str, edit: ForkEdit, error: type[Exception], match: str
) -> None:
    """Forked where the source waits for a person: a bad edit is its own clear error; no run stored, no call made."""
    from fsm_agent.persist import open_store

    with open_store(store_target) as store:
        counted = Counted()
        careful = Agent(ByTurn(SENDS), counted.registry, approve={"send"})
        held = careful.run("go", store=store, run_id="src")
        assert held.reason == "paused"
        before = store.load("src")
        with pytest.raises(error, match=match):
            careful.fork("src", len(held.trace) - 1, store=store, run_id="f", edit=edit)
        assert [run.run_id for run in store.list_runs()] == ["src"]
        assert store.load("src") == before
        assert dict(counted.ran) == {}
