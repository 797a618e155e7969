"""Deps reach a run's tools on every entry point, both drivers, parallel calls, sub-agents and sessions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import Agent, JsonlLog, Message, ModelResponse, RunContext, Session, SqliteStore, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Db:
    """An application object the tools need."""

    def __init__(self, name: str) -> None:
        self.name = name


class Conversation:
    """A scripted model that answers by how many replies it already gave, so any run or turn can pick it up."""

    def __init__(self, responses: Sequence[ModelResponse]) -> None:
        self.responses = list(responses)

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return self.responses[sum(1 for m in messages if m.role == "assistant") % len(self.responses)]


def _tools(seen: list[tuple[str | None, Db]]) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.register
    def which(ctx: RunContext[Db]) -> str:
        """The database this call was given."""
        seen.append((ctx.call_id, ctx.deps))
        return ctx.deps.name

    return tools


def _answers(messages: Sequence[Message]) -> list[str]:
    return [m.content for m in messages if m.role == "tool"]


ONE_CALL = [tool_turn(tool_call("which", id="w1")), reply("done")]


@pytest.mark.parametrize("entry", ["run", "arun", "start", "start-aadvance", "stream", "astream"])
def test_every_entry_point_hands_its_deps_to_the_tools(entry: str) -> None:
    """run, arun, start (advance or aadvance), stream and astream: the tool sees the object given, once."""
    seen: list[tuple[str | None, Db]] = []
    db = Db("main")
    agent = Agent(Conversation(ONE_CALL), _tools(seen))
    if entry == "run":
        messages = agent.run("go", deps=db).messages
    elif entry == "arun":
        messages = asyncio.run(agent.arun("go", deps=db)).messages
    elif entry == "start":
        messages = agent.start("go", deps=db).finish().messages
    elif entry == "start-aadvance":
        run = agent.start("go", deps=db)

        async def drive() -> None:
            while not run.done:
                await run.aadvance()

        asyncio.run(drive())
        messages = run.result.messages
    elif entry == "stream":
        events = list(agent.stream("go", deps=db))
        messages = events[-1].result.messages  # type: ignore[union-attr]
    else:

        async def collect() -> list[Any]:
            return [event async for event in agent.astream("go", deps=db)]

        messages = asyncio.run(collect())[-1].result.messages
    assert _answers(messages) == ['"main"']
    assert seen == [("w1", db)]


def test_parallel_calls_of_one_reply_each_get_the_runs_deps() -> None:
    """arun with three calls in one reply, run at once: each sees the deps and its own call id, each runs once."""
    db = Db("shared")
    seen: list[tuple[str | None, Db]] = []
    running = 0
    overlapped = False
    tools = ToolRegistry()

    @tools.register
    async def slow(n: int, ctx: RunContext[Db]) -> str:
        """Waits a little, so the calls overlap."""
        nonlocal running, overlapped
        running += 1
        overlapped = overlapped or running > 1
        await asyncio.sleep(0.01)
        running -= 1
        seen.append((ctx.call_id, ctx.deps))
        return ctx.deps.name

    @tools.register
    def plain(ctx: RunContext[Db]) -> str:
        """A sync tool, run on a worker thread."""
        seen.append((ctx.call_id, ctx.deps))
        return ctx.deps.name

    calls = [tool_call("slow", id="p1", n=1), tool_call("slow", id="p2", n=2), tool_call("plain", id="p3")]
    agent = Agent(FakeModel(tool_turn(*calls), reply("done")), tools)
    result = asyncio.run(agent.arun("go", deps=db))
    assert _answers(result.messages) == ['"shared"'] * 3
    assert sorted(seen, key=lambda pair: str(pair[0])) == [("p1", db), ("p2", db), ("p3", db)]
    assert overlapped


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("own", [False, True])
def test_a_sub_agent_gets_the_parents_deps_unless_given_its_own(driver: str, own: bool) -> None:
    """as_tool(...) passes the parent run's deps on; as_tool(..., deps=x) gives its runs x instead."""
    seen: list[tuple[str | None, Db]] = []
    child = Agent(Conversation(ONE_CALL), _tools(seen))
    parents_db, childs_db = Db("parent's"), Db("child's")
    tools = ToolRegistry()
    tools.register(child.as_tool("helper", "asks the database", deps=childs_db if own else None))
    parent = Agent(FakeModel(tool_turn(tool_call("helper", id="h1", input="which?")), reply("ok")), tools)
    run = parent.run if driver == "sync" else lambda text, deps: asyncio.run(parent.arun(text, deps=deps))
    result = run("go", deps=parents_db)
    expected = childs_db if own else parents_db
    assert [db for _, db in seen] == [expected]
    assert _answers(result.messages) == ['"done"']


def test_a_sub_agent_called_directly_uses_its_own_deps() -> None:
    """The function as_tool returns, called by hand, runs the child with the deps it was given."""
    seen: list[tuple[str | None, Db]] = []
    db = Db("own")
    helper = Agent(Conversation(ONE_CALL), _tools(seen)).as_tool("helper", "asks the database", deps=db)
    assert helper("which?") == "done"
    assert [d for _, d in seen] == [db]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_session_gives_its_deps_to_every_turn_and_a_turn_may_bring_its_own(driver: str, tmp_path: Any) -> None:
    """Session(deps=a) for each turn; run(text, deps=b) for that turn only; a new Session is given them again."""
    seen: list[tuple[str | None, Db]] = []
    agent = Agent(Conversation(ONE_CALL), _tools(seen))
    first, second, third = Db("first"), Db("second"), Db("third")
    with SqliteStore(tmp_path / "chat.db") as store:
        session = Session(agent, store, "chat", deps=first)
        if driver == "sync":
            session.run("one")
            session.run("two", deps=second)
            Session(agent, store, "chat", deps=third).run("three")
        else:

            async def turns() -> None:
                await session.arun("one")
                await session.arun("two", deps=second)
                await Session(agent, store, "chat", deps=third).arun("three")

            asyncio.run(turns())
    assert [db for _, db in seen] == [first, second, third]


MARKER = "deps-marker-5f0c2e"


class Secret:
    """Deps whose every rendering carries the marker: any copy of them anywhere would show it."""

    token = MARKER

    def __repr__(self) -> str:
        return f"Secret({MARKER})"

    def __str__(self) -> str:
        return MARKER


def test_deps_are_never_stored_logged_snapshotted_or_sent(tmp_path: Any) -> None:
    """A run paused in a store with a log: no trace of deps in the file's bytes, the log, the snapshot or requests."""
    executed: list[str] = []
    tools = ToolRegistry()

    @tools.register
    def use(n: int, ctx: RunContext[Secret]) -> str:
        """Uses the secret without returning it."""
        executed.append(ctx.call_id or "")
        return "used" if ctx.deps.token == MARKER else "wrong"

    calls = [tool_turn(tool_call("use", id="u1", n=1)), tool_turn(tool_call("use", id="u2", n=2))]
    model = FakeModel(*calls, reply("done"))
    agent = Agent(model, tools, approve=lambda call: call.id == "u2")
    path, log = tmp_path / "runs.db", tmp_path / "run.jsonl"
    logged = JsonlLog(log)
    with SqliteStore(path) as store:
        paused = agent.start("go", store=store, run_id="r1", deps=Secret(), observers=[logged]).finish()
        assert paused.reason == "paused"
        assert executed == ["u1"]
        rows = json.dumps(store.load("r1"))
        resumed = agent.resume(store.load("r1"), approvals={"u2": True}, store=store, deps=Secret(), observers=[logged])
        finished = resumed.finish()
    logged.close()
    assert finished.final == "done"
    assert executed == ["u1", "u2"]
    assert _answers(finished.messages) == ['"used"', '"used"']
    sent = json.dumps([[m.content for m in messages] for messages in model.seen]) + json.dumps(model.tools_seen)
    for where, text in {
        "store rows": rows,
        "store files": "".join(f.read_bytes().decode("latin-1") for f in tmp_path.glob("runs.db*")),
        "log": log.read_text(encoding="utf-8"),
        "snapshot": json.dumps(paused.snapshot),
        "result": finished.to_json(),
        "requests": sent,
    }.items():
        assert text, where
        assert MARKER not in text, where


def test_a_paused_session_turn_resumes_with_the_deps_given_to_resume() -> None:
    """Session.resume(approvals, deps=b) continues the paused turn with b; the call is made once, after the pause."""
    seen: list[tuple[str | None, Db]] = []
    agent = Agent(Conversation(ONE_CALL), _tools(seen), approve=["which"])
    session = Session(agent, deps=Db("session's"))
    assert session.run("one").reason == "paused"
    assert seen == []
    resumed_with = Db("resume's")
    result = session.resume({"w1": True}, deps=resumed_with)
    assert result.final == "done"
    assert seen == [("w1", resumed_with)]
