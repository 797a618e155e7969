"""Forks of the stored runs a user has: a sub-agent's own run, a session's turn, a run an older release stored.

fork-a-run.md: "``source`` may be the id of a stored run", forked "after
any transition of the source but the one into ``Done``", and "a tool call
the source completed after the fork point is not made again".  Each tool
counts its executions, on both drivers and both stores.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.by_turn import ByTurn
from support.store_cases import CHILDREN, child_process, tick_agent

from fsm_agent import (
    Agent,
    AgentRun,
    ForkError,
    RunExistsError,
    RunLeasedError,
    RunResult,
    Session,
    SqliteStore,
    ToolRegistry,
    Transition,
)
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.testing.replay import areplay, replay

DRIVERS = ["sync", "async"]


def counted(made: Counter[str]) -> ToolRegistry:
    """``lookup`` and ``send``, each counting its executions by tool and argument."""
    tools = ToolRegistry()

    def lookup(q: str) -> str:
        """Look something up."""
        made[f"lookup {q}"] += 1
        return f"found {q}"

    def send(to: str) -> str:
        """Send a message: an effect in the world."""
        made[f"send {to}"] += 1
        return f"sent {to}"

    tools.register(lookup)
    tools.register(send)
    return tools


def finished(run: AgentRun, driver: str) -> RunResult:
    return run.finish() if driver == "sync" else asyncio.run(run.afinish())


def forked(agent: Agent, driver: str, source: Any, at: int, **keywords: Any) -> RunResult:
    if driver == "sync":
        return agent.fork(source, at, **keywords).finish()

    async def aforked() -> RunResult:
        return await (await agent.afork(source, at, **keywords)).afinish()

    return asyncio.run(aforked())


# --- a sub-agent's run, forked by its own id ---------------------------------------------------------------------

CHILD = [tool_turn(tool_call("lookup", id="l1", q="x"), tool_call("lookup", id="l2", q="y")), reply("x and y")]


def researcher(made: Counter[str]) -> Agent:
    return Agent(ByTurn(CHILD), counted(made))


def planner(made: Counter[str]) -> Agent:
    tools = counted(made)
    tools.register(researcher(made).as_tool("research", "Research one question."))
    script = [tool_turn(tool_call("research", id="c1", input="x?"), tool_call("send", id="s1", to="ada")), reply("ok")]
    return Agent(ByTurn(script), tools)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_sub_agent_s_stored_run_forks_by_its_id_at_every_transition_making_no_completed_call(
    store_target: str, driver: str
) -> None:
    """``fork("plan/c1", at)`` with the sub-agent's agent: a top-level run naming the child, nothing made again."""
    with open_store(store_target) as store:
        made: Counter[str] = Counter()
        finished(planner(made).start("plan", store=store, run_id="plan"), driver)
        assert dict(made) == {"lookup x": 1, "lookup y": 1, "send ada": 1}
        child = store.load("plan/c1")
        last = len(child["trace"]) - 1
        for at in range(last):
            again: Counter[str] = Counter()
            result = forked(researcher(again), driver, "plan/c1", at, store=store, run_id=f"f{at}")
            assert result.final == "x and y", at
            assert list(result.trace) == [Transition(**t) for t in child["trace"]], at
            assert [m.content for m in result.messages] == [m["content"] for m in child["messages"]], at
            assert dict(again) == {}, at
            stored = store.load(f"f{at}")
            assert stored["forked_from"] == ["plan/c1", at]
            assert "parent_run_id" not in stored  # a fork is a run of its own, not a second child of the plan
        assert store.load("plan/c1")["state"] == "Done"  # the child's own run is untouched
        with pytest.raises(ForkError, match="ends the source in Done"):
            researcher(Counter()).fork("plan/c1", last, store=store, run_id="too-late")


# --- a session's turn ------------------------------------------------------------------------------------------


class Echoes:
    """Asks ``send`` to whoever the user named last, then says done; reads only the conversation."""

    def complete(self, messages: Any, tools: Any, output: Any = None) -> Any:
        users = [m.content for m in messages if m.role == "user"]
        if messages[-1].role == "user":
            return tool_turn(tool_call("send", id=f"s{len(users)}", to=users[-1]))
        return reply(f"done {len(users)}")


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_session_s_second_turn_replays_and_forks_at_every_transition_with_no_call(
    store_target: str, driver: str
) -> None:
    """Turn 2 of a stored session (its history before it) replays from its export and forks, nothing made again."""
    with open_store(store_target) as store:
        made: Counter[str] = Counter()
        session = Session(Agent(Echoes(), counted(made), system="Be brief."), store=store, session_id="chat")
        assert session.run("ada").final == "done 1"
        second = session.run("bob") if driver == "sync" else asyncio.run(session.arun("bob"))
        assert dict(made) == {"send ada": 1, "send bob": 1}
        turn = "chat/2"
        recording = store.export(turn)
        assert recording["prior"] == 5  # the system prompt and turn 1
        unused = FakeModel()
        again: Counter[str] = Counter()
        replayer = Agent(unused, counted(again), system="Be brief.")
        result = replay(replayer, recording) if driver == "sync" else asyncio.run(areplay(replayer, recording))
        assert (result.final, result.messages) == (second.final, second.messages)
        for at in range(len(second.trace) - 1):
            result = forked(Agent(Echoes(), counted(again), system="Be brief."), driver, turn, at, store=store)
            assert (result.final, result.messages) == (second.final, second.messages), at
        assert (dict(again), unused.seen) == ({}, [])
        assert session.turns == 2  # the forks are no turns of the session


# --- a run stored by the first SqliteStore (no model calls kept) -------------------------------------------------

V1_FILE = Path(__file__).resolve().parents[1] / "support" / "store_files" / "sqlite_v1.db"


def test_a_run_an_older_release_stored_forks_or_says_its_model_calls_were_not_kept(tmp_path: Path) -> None:
    """The first SqliteStore's ``done`` run (2 ticks): a fork after its first tick, with no tick made again.

    Its messages hold every reply and result (a RunResult without a
    snapshot is forked from them), so the fork can be rebuilt; if it is
    refused, the error must name what is missing, not a resume or a table
    the source never had.
    """
    path = tmp_path / "old.db"
    shutil.copyfile(V1_FILE, path)
    counter = tmp_path / "ticks.txt"
    with SqliteStore(path) as store:
        assert store.export("done")["model_calls"] == []  # stored before model calls were kept
        try:
            result = tick_agent(3, str(counter)).fork("done", 3, store=store, run_id="f").finish()
        except ForkError as refused:
            text = str(refused)
            assert "rows differ" not in text, text
            assert "resumed" not in text, text
            assert re.search(r"model call|not kept|older", text), text
        else:
            assert result.final == store.load("done")["final"]
            assert not counter.exists() or counter.read_text() == ""


# --- two processes forking one run under one id ------------------------------------------------------------------

BATCH = [tool_turn(tool_call("send", id="s1", to="ada"), tool_call("send", id="s2", to="bob")), reply("both sent")]


def _writing_registry(counter: str) -> ToolRegistry:
    """``send``, appending each execution's argument to the file ``counter`` (shared by the processes)."""
    tools = ToolRegistry()

    def send(to: str) -> str:
        """Send a message: an effect in the world."""
        with Path(counter).open("a", encoding="utf-8") as file:
            file.write(to + "\n")
        return f"sent {to}"

    tools.register(send)
    return tools


def _fork_in_process(target: str, driver: str, counter: str, start: Any, answers: Any) -> None:
    """Another process: its own store and agent; released with the other, fork ``src`` at 0 as ``same`` and finish."""
    with open_store(target) as store:
        agent = Agent(ByTurn(BATCH), _writing_registry(counter))
        start.wait()
        try:
            result = forked(agent, driver, "src", 0, store=store, run_id="same")
        except (RunExistsError, RunLeasedError) as refused:
            answers.put(("refused", type(refused).__name__))
        else:
            reused = [s.reused_from for s in result.steps if s.kind == "tool_call"]
            answers.put(("forked", json.dumps([result.final, reused])))


@pytest.mark.subprocess
@pytest.mark.parametrize("driver", DRIVERS)
def test_two_processes_forking_one_run_under_one_id_store_one_fork_and_send_nothing_again(
    store_target: str, driver: str, tmp_path: Path
) -> None:
    """Released by one barrier, each process forks ``src`` before its batch: one fork is stored, none sends."""
    counter = str(tmp_path / "sent.txt")
    with open_store(store_target) as store:
        Agent(ByTurn(BATCH), _writing_registry(counter)).run("go", store=store, run_id="src")
    assert Path(counter).read_text(encoding="utf-8").split() == ["ada", "bob"]
    start, answers = CHILDREN.Barrier(2), CHILDREN.Queue()
    workers = [child_process(_fork_in_process, store_target, driver, counter, start, answers) for _ in range(2)]
    for worker in workers:
        worker.start()
    got = sorted(answers.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    assert [kind for kind, _ in got] == ["forked", "refused"], got
    assert json.loads(got[0][1]) == ["both sent", ["src/s1", "src/s2"]]
    assert Path(counter).read_text(encoding="utf-8").split() == ["ada", "bob"]  # the source's two sends only
    with open_store(store_target) as store:
        stored = store.load("same")
        assert (stored["state"], stored["forked_from"]) == ("Done", ["src", 0])
