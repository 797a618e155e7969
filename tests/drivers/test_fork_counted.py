"""``Agent.fork``: side effects counted against how-to/fork-a-run.md, on both drivers.

The promise: "a tool call the source completed after the fork point is not
made again when the fork asks for it with the same arguments".  The models
answer by the conversation they are sent (as a model at temperature 0
would), so one model serves a source and all its forks; every tool counts
its executions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pydantic
import pytest
from support.by_turn import ByTurn

from fsm_agent import (
    Agent,
    ForkEdit,
    Message,
    ModelResponse,
    RunExistsError,
    RunResult,
    SqliteStore,
    ToolRegistry,
)
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.testing.replay import areplay, replay
from fsm_agent.tools import JSONSchema


class Made:
    """Every tool execution, in order, as (tool, arguments)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def registry(self) -> ToolRegistry:
        tools = ToolRegistry()

        def add(a: int, b: int) -> int:
            """Add two numbers."""
            self.calls.append(("add", (a, b)))
            return a + b

        def boom(x: str) -> str:
            """Always fails."""
            self.calls.append(("boom", (x,)))
            raise RuntimeError(f"boom {x}")

        tools.register(add)
        tools.register(boom)
        return tools


RICH = [
    tool_turn(
        tool_call("add", id="a1", a=1, b=2), tool_call("boom", id="b1", x="1"), tool_call("add", id="a2", a=3, b=4)
    ),
    tool_turn(tool_call("boom", id="b2", x="2")),
    reply("not json"),  # the typed answer is retried once
    reply('{"total": 10}'),
]


class Answer(pydantic.BaseModel):
    """The typed answer."""

    total: int


def rich_agent(made: Made) -> Agent:
    return Agent(
        ByTurn(RICH),
        made.registry(),
        output_type=Answer,
        output_retries=2,
        max_concurrency=3,
        max_consecutive_failures=5,
    )


def fork_finished(agent: Agent, driver: str, source: Any, at: int, **keywords: Any) -> RunResult:
    if driver == "sync":
        return agent.fork(source, at, **keywords).finish()

    async def go() -> RunResult:
        run = await agent.afork(source, at, **keywords)
        return await run.afinish()

    return asyncio.run(go())


@pytest.mark.parametrize("fork_driver", ["sync", "async"])
@pytest.mark.parametrize("source_driver", ["sync", "async"])
def test_a_fork_at_every_transition_of_a_batch_with_a_failure_and_a_typed_retry_makes_no_call_again(
    tmp_path: Path, source_driver: str, fork_driver: str
) -> None:
    """A failed call counts as completed: neither it nor any other completed call is made again, at any fork point."""
    made = Made()
    with SqliteStore(tmp_path / "runs.db") as store:
        agent = rich_agent(made)
        if source_driver == "sync":
            source = agent.run("go", store=store, run_id="src")
        else:
            source = asyncio.run(agent.arun("go", store=store, run_id="src"))
        assert (source.reason, source.final) == ("done", '{"total": 10}')
        assert len(made.calls) == 4
        reused = 0
        for at, entry in enumerate(source.trace):
            if entry.dest == "Done":
                continue
            made = Made()
            result = fork_finished(rich_agent(made), fork_driver, "src", at, store=store, run_id=f"f{at}")
            assert made.calls == [], at
            assert (result.final, result.trace) == (source.final, source.trace), at
            reused += sum(1 for s in result.steps if s.reused_from is not None)
        assert reused > 0


def test_a_fork_s_recording_replays_with_no_call_and_so_does_its_fork(tmp_path: Path) -> None:
    """A fork (plain, with an edited result, with an edited question) is a stored run: its export replays clean."""
    with SqliteStore(tmp_path / "runs.db") as store:
        rich_agent(Made()).run("go", store=store, run_id="src")
        edits = {"plain": None, "result": ForkEdit(results={"a1": "30"}), "question": ForkEdit(messages={0: "go on"})}
        for name, edit in edits.items():
            made = Made()
            forked = rich_agent(made).fork("src", 5, store=store, run_id=name, edit=edit).finish()
            assert made.calls == [], name
            again = rich_agent(made).fork(name, 9, store=store, run_id=f"{name}-again").finish()
            assert made.calls == [], name
            for run_id, original in ((name, forked), (f"{name}-again", again)):
                recording = store.export(run_id)
                assert recording["run_id"] == run_id
                for result in (replay(rich_agent(made), recording), asyncio.run(areplay(rich_agent(made), recording))):
                    assert (result.trace, result.messages) == (original.trace, original.messages), run_id
            assert made.calls == [], name


def _counting_turns(made: Made, approve: set[str] | None = None) -> Agent:
    class ThreeAdds:
        def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
            n = sum(1 for m in messages if m.role == "tool")
            return tool_turn(tool_call("add", id=f"c{n}", a=n, b=1)) if n < 3 else reply("done")

    return Agent(ThreeAdds(), made.registry(), approve=approve)


def test_a_fork_of_a_source_still_running_under_another_owner_reuses_what_it_completed(tmp_path: Path) -> None:
    """The source is mid-run in one connection; a fork made through another reuses c1 and makes c2 itself."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as owner, SqliteStore(path) as other:
        source_made = Made()
        running = _counting_turns(source_made).start("go", store=owner, run_id="src")
        while len(running.trace) < 8:  # c0 and c1 made; the third model call is next
            running.advance()
        assert source_made.calls == [("add", (0, 1)), ("add", (1, 1))]
        fork_made = Made()
        forked = _counting_turns(fork_made).fork("src", 3, store=other, run_id="fork").finish()
        assert fork_made.calls == [("add", (2, 1))]
        assert [s.reused_from for s in forked.steps if s.kind == "tool_call"] == [None, "src/c1", None]
        assert running.finish().final == "done"  # the source's owner is not disturbed by the fork
        assert source_made.calls[2:] == [("add", (2, 1))]
        assert other.load("src")["state"] == "Done"


def test_a_fork_of_a_source_held_for_approval_is_held_and_makes_the_call_once_approved(tmp_path: Path) -> None:
    """The source never made c0 (it waits for a person): the fork pauses on it, and makes it when its edit approves."""
    with SqliteStore(tmp_path / "runs.db") as store:
        made = Made()
        held = _counting_turns(made, approve={"add"}).run("go", store=store, run_id="held")
        assert held.reason == "paused"
        at = len(held.trace) - 1
        assert _counting_turns(made, approve={"add"}).fork("held", at, store=store, run_id="h1").paused
        edit = ForkEdit(approvals={"c0": True})
        approved = _counting_turns(made, approve={"add"}).fork("held", at, store=store, run_id="h2", edit=edit)
        assert approved.finish().reason == "paused"  # on c1 now
        assert made.calls == [("add", (0, 1))]
        assert store.load("held")["paused"] is True  # the source still waits, undecided


def test_two_forks_from_one_point_and_a_fork_onto_the_source_s_own_id(tmp_path: Path) -> None:
    """Each fork gets its own fresh id and reuses the source's calls; the source's id is refused, the source kept."""
    with SqliteStore(tmp_path / "runs.db") as store:
        _counting_turns(Made()).run("go", store=store, run_id="src")
        before = store.load("src")
        made = Made()
        ids = []
        for _ in range(2):
            run = _counting_turns(made).fork("src", 3, store=store)
            assert run.finish().final == "done"
            ids.append(run.run_id)
        assert made.calls == []
        assert len(set(ids)) == 2
        with pytest.raises(RunExistsError):
            _counting_turns(made).fork("src", 3, store=store, run_id="src")
        assert store.load("src") == before
        assert sorted(run.run_id for run in store.list_runs()) == sorted(["src", *ids])


def test_a_stored_run_whose_id_starts_with_a_brace_forks_by_its_id(tmp_path: Path) -> None:
    """fork-a-run.md: with a store, ``source`` may be the id of a stored run (any id the store took)."""
    with SqliteStore(tmp_path / "runs.db") as store:
        _counting_turns(Made()).run("go", store=store, run_id="{ticket-7}")
        made = Made()
        result = _counting_turns(made).fork("{ticket-7}", 3, store=store, run_id="f").finish()
        assert (result.final, made.calls) == ("done", [])


def test_an_empty_fork_id_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    """fork-a-run.md: bad input is an error "before anything is stored or called"; start(run_id='') is a ValueError."""
    with SqliteStore(tmp_path / "runs.db") as store:
        _counting_turns(Made()).run("go", store=store, run_id="src")
        with pytest.raises(ValueError, match="run_id must not be empty"):
            _counting_turns(Made()).start("go", store=store, run_id="")
        with pytest.raises(ValueError, match="run_id must not be empty"):
            _counting_turns(Made()).fork("src", 3, store=store, run_id="")
        assert [run.run_id for run in store.list_runs()] == ["src"]
