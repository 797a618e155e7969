"""``ForkEdit`` changes what the rebuilt run is given: what follows from an edit, and the edits a fork refuses.

fork-a-run.md: an edited reply is the reply the fork goes on from, an edited
result is counted as it reads (``{"error": ...}`` a failure), an edit that
would change a transition before the fork point is a ``ForkError``, and a
taken ``run_id`` is a ``RunExistsError`` that asks for another id.  Nothing
is stored or called when a fork is refused.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from support.by_turn import ByTurn

from fsm_agent import (
    Agent,
    AgentLoopError,
    ForkEdit,
    ForkError,
    Message,
    RunExistsError,
    SqliteStore,
    ToolCall,
    ToolRegistry,
)
from fsm_agent.testing import reply, tool_call, tool_turn


def counted(made: Counter[str]) -> ToolRegistry:
    """``send``, counting its executions by argument."""
    tools = ToolRegistry()

    def send(to: str) -> str:
        """Send a message: an effect in the world."""
        made[to] += 1
        return f"sent {to}"

    tools.register(send)
    return tools


THREE_SENDS = [
    tool_turn(tool_call("send", id="s1", to="ada")),
    tool_turn(tool_call("send", id="s2", to="bob")),
    tool_turn(tool_call("send", id="s3", to="cy")),
    reply("all sent"),
]


def test_a_success_edited_into_an_error_counts_as_a_failure_and_can_stop_the_fork() -> None:
    """s1 and s2 edited into failures: two in a row, so the fork stops on tool_failures where the source went on."""
    made: Counter[str] = Counter()
    source = Agent(ByTurn(THREE_SENDS), counted(made), max_consecutive_failures=2).run("go")
    assert source.final == "all sent"
    made.clear()
    edit = ForkEdit(results={"s1": '{"error": "bounced"}', "s2": '{"error": "bounced"}'})
    agent = Agent(ByTurn(THREE_SENDS), counted(made), max_consecutive_failures=2)
    with pytest.raises(AgentLoopError) as stopped:
        agent.fork(source, 2, edit=edit).finish()
    assert stopped.value.reason == "tool_failures"
    assert dict(made) == {}  # s2's edited failure is the source's call, reused; nothing was sent


def test_an_edit_that_changes_a_transition_before_the_fork_point_is_refused_and_stores_nothing(
    tmp_path: Path,
) -> None:
    """s1 edited into a failure, under max_consecutive_failures=1: the source's transition 3 would now stop."""
    with SqliteStore(tmp_path / "runs.db") as store:
        Agent(ByTurn(THREE_SENDS), counted(Counter()), max_consecutive_failures=1).run("go", store=store, run_id="src")
        made: Counter[str] = Counter()
        agent = Agent(ByTurn(THREE_SENDS), counted(made), max_consecutive_failures=1)
        with pytest.raises(ForkError, match="fork at 2 or earlier"):
            agent.fork("src", 5, store=store, run_id="f", edit=ForkEdit(results={"s1": '{"error": "bounced"}'}))
        assert [run.run_id for run in store.list_runs()] == ["src"]
    assert dict(made) == {}


def test_an_edited_reply_turned_into_another_role_is_refused() -> None:
    """The model's reply edited into a user message: a reply stays a reply, a ForkError says so."""
    source = Agent(ByTurn(THREE_SENDS), counted(Counter())).run("go")
    made: Counter[str] = Counter()
    with pytest.raises(ForkError, match="a reply is edited as a reply"):
        Agent(ByTurn(THREE_SENDS), counted(made)).fork(source, 1, edit=ForkEdit(messages={1: Message("user", "hi")}))
    assert dict(made) == {}


def test_an_edited_call_the_fork_makes_is_made_once_and_the_source_s_is_not_taken_for_it() -> None:
    """s2 edited from bob to zoe while pending: zoe is sent once, bob never, and s3 still takes its recorded result."""
    made: Counter[str] = Counter()
    source = Agent(ByTurn(THREE_SENDS), counted(made)).run("go")
    made.clear()
    edited = Message("assistant", "", tool_calls=(ToolCall("s2", "send", {"to": "zoe"}),))
    result = Agent(ByTurn(THREE_SENDS), counted(made)).fork(source, 4, edit=ForkEdit(messages={3: edited})).finish()
    assert dict(made) == {"zoe": 1}
    assert [s.reused_from for s in result.steps if s.kind == "tool_call"] == [None, None, "s3"]
    assert result.final == "all sent"


def test_a_fork_onto_a_taken_run_id_asks_for_another_and_stores_nothing(tmp_path: Path) -> None:
    """Agent.fork(run_id=<taken>): a RunExistsError that advises another run_id, not overwrite=True (fork has none)."""
    with SqliteStore(tmp_path / "runs.db") as store:
        Agent(ByTurn(THREE_SENDS), counted(Counter())).run("go", store=store, run_id="src")
        made: Counter[str] = Counter()
        with pytest.raises(RunExistsError) as taken:
            Agent(ByTurn(THREE_SENDS), counted(made)).fork("src", 3, store=store, run_id="src")
        assert "overwrite=True" not in str(taken.value)
        assert "another run_id" in str(taken.value)
        assert [run.run_id for run in store.list_runs()] == ["src"]
        assert store.load("src")["final"] == "all sent"
    assert dict(made) == {}
