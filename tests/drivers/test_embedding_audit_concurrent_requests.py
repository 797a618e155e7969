"""One agent (or one Session) serving many requests at once, each with its own deps: nothing leaks between them.

A web service builds its agent once and serves every request with it
(docs/how-to/async.md, "Serve many runs at once"), each request's run given
its own deps (docs/how-to/deps.md).  The models here are stateless (they
answer from the conversation alone), so any run may be served by them in any
order; every tool counts its executions on the request's own deps.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import (
    Agent,
    AgentLoopError,
    Message,
    ModelResponse,
    RunContext,
    RunView,
    Session,
    SqliteStore,
    StopCondition,
    ToolRegistry,
    run_context,
)
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

DRIVERS = ["sync", "async"]


class Request:
    """One request's deps: the signed-in user, and the executions of its tools (counted under a lock)."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.ran: list[str] = []
        self._lock = threading.Lock()

    def made(self, what: str) -> None:
        with self._lock:
            self.ran.append(what)


def _tool_texts(messages: Sequence[Message]) -> list[str]:
    return [json.loads(m.content) for m in messages if m.role == "tool"]


class AsksThree:
    """First turn: a sync tool, an async tool and a sub-agent in one reply; then the tools' answers joined."""

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        await asyncio.sleep(random.random() * 0.003)
        return self.complete(messages, tools)

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if not any(m.role == "assistant" for m in messages):
            calls = [
                tool_call("whoami", id="a"),
                tool_call("awhoami", id="b"),
                tool_call("helper", id="h", input="who"),
            ]
            return tool_turn(*calls)
        return reply("|".join(_tool_texts(messages)))


class AsksOnce:
    """The sub-agent's model: asks ``whoami`` once, then answers with what it said."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if not any(m.role == "tool" for m in messages):
            return tool_turn(tool_call("whoami", id="c"))
        return reply(_tool_texts(messages)[-1])


def whoami(ctx: RunContext[Request]) -> str:
    """Who this call was made for (a sync tool: a worker thread on the async driver)."""
    time.sleep(random.random() * 0.002)
    ctx.deps.made(f"whoami {ctx.run_id}")
    return f"{ctx.deps.user}@{ctx.run_id}"


async def awhoami(ctx: RunContext[Request]) -> str:
    """Who this call was made for (an async tool: a task of its own on the async driver)."""
    await asyncio.sleep(random.random() * 0.002)
    ctx.deps.made(f"awhoami {ctx.run_id}")
    return f"{ctx.deps.user}@{ctx.run_id}"


def test_many_requests_at_once_on_one_agent_each_reach_only_their_own_deps() -> None:
    """40 arun at once and 16 run in 8 threads on one agent: every tool, sub-agent and stop condition sees its own."""
    checked: list[tuple[str, str]] = []
    lock = threading.Lock()

    def reads_deps(view: RunView) -> bool:
        context = run_context()
        with lock:
            checked.append((context.run_id, context.deps.user))
        return False

    tools = ToolRegistry()
    tools.register(whoami)
    tools.register(awhoami)
    tools.register(Agent(AsksOnce(), [whoami]).as_tool("helper", "Asks who."))
    agent = Agent(AsksThree(), tools, stop_conditions=[StopCondition("reads_deps", "Dispatch", reads_deps, "never")])

    requests = {f"a{n}": Request(f"user-a{n}") for n in range(40)} | {f"s{n}": Request(f"user-s{n}") for n in range(16)}

    async def at_once() -> list[Any]:
        return await asyncio.gather(*(agent.arun("Who?", deps=requests[f"a{n}"], run_id=f"a{n}") for n in range(40)))

    results = dict(zip([f"a{n}" for n in range(40)], asyncio.run(at_once()), strict=True))
    with ThreadPoolExecutor(8) as pool:
        synced = pool.map(lambda n: agent.run("Who?", deps=requests[f"s{n}"], run_id=f"s{n}"), range(16))
        results |= dict(zip([f"s{n}" for n in range(16)], synced, strict=True))
    for run_id, result in results.items():
        user = requests[run_id].user
        assert result.final == f"{user}@{run_id}|{user}@{run_id}|{user}@{run_id}/h"
        assert sorted(requests[run_id].ran) == sorted([f"whoami {run_id}", f"awhoami {run_id}", f"whoami {run_id}/h"])
    assert {run_id.split("/")[0] for run_id, _ in checked} == set(requests)
    assert all(requests[run_id.split("/")[0]].user == user for run_id, user in checked)


@pytest.mark.parametrize("driver", DRIVERS)
def test_concurrent_paused_runs_sharing_call_ids_make_only_their_own_approved_calls_once(
    driver: str, tmp_path: Path
) -> None:
    """12 runs of one agent pause on call ``c1``; resumed at once, half approved: each approved one charges once."""

    class Charges:
        def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
            if not any(m.role == "assistant" for m in messages):
                return tool_turn(tool_call("charge", id="c1", cents=100))
            return reply(_tool_texts(messages)[-1] if isinstance(_tool_texts(messages)[-1], str) else "rejected")

    def charge(cents: int, ctx: RunContext[Request]) -> str:
        """Charge the signed-in user (counted on the request)."""
        ctx.deps.made(f"charge {cents}")
        return f"charged {ctx.deps.user}"

    agent = Agent(Charges(), [charge], approve={"charge"})
    store = SqliteStore(tmp_path / "runs.db")
    requests = [Request(f"u{n}") for n in range(12)]
    first = [Request(f"first-{n}") for n in range(12)]

    def start(n: int) -> Any:
        return agent.run("Charge me.", deps=first[n], store=store, run_id=f"u{n}")

    def resume(n: int) -> Any:
        run = agent.resume(store.load(f"u{n}"), approvals={"c1": n % 2 == 0}, store=store, deps=requests[n])
        return run.finish()

    async def aresume(n: int) -> Any:
        run = await agent.aresume(
            await store.aload(f"u{n}"), approvals={"c1": n % 2 == 0}, store=store, deps=requests[n]
        )
        return await run.afinish()

    if driver == "sync":
        with ThreadPoolExecutor(6) as pool:
            paused = list(pool.map(start, range(12)))
            results = list(pool.map(resume, range(12)))
    else:

        async def at_once() -> tuple[list[Any], list[Any]]:
            starts = [agent.arun("Charge me.", deps=first[n], store=store, run_id=f"u{n}") for n in range(12)]
            stopped = await asyncio.gather(*starts)
            return stopped, await asyncio.gather(*(aresume(n) for n in range(12)))

        paused, results = asyncio.run(at_once())
    store.close()
    assert [result.reason for result in paused] == ["paused"] * 12
    assert all(request.ran == [] for request in first)
    for n, (request, result) in enumerate(zip(requests, results, strict=True)):
        assert request.ran == (["charge 100"] if n % 2 == 0 else []), n
        assert result.final == (f"charged u{n}" if n % 2 == 0 else "rejected"), n


@pytest.mark.parametrize("driver", DRIVERS)
def test_one_session_serving_requests_at_once_gives_each_turn_the_deps_its_request_brought(
    driver: str, tmp_path: Path
) -> None:
    """Six requests at once on one Session object: six turns, one after another, each tool call on its own deps."""

    class Conversation:
        def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
            turn = sum(1 for m in messages if m.role == "assistant")
            if turn % 2 == 0:
                return tool_turn(tool_call("whoami", id=f"w{turn}"))
            return reply(f"you are {_tool_texts(messages)[-1].split('@')[0]}")

    requests = [Request(f"user{n}") for n in range(6)]
    with SqliteStore(tmp_path / "chat.db") as store:
        session = Session(Agent(Conversation(), [whoami]), store, "chat")
        if driver == "sync":
            with ThreadPoolExecutor(6) as pool:
                results = list(pool.map(lambda request: session.run("Who am I?", deps=request), requests))
        else:

            async def at_once() -> list[Any]:
                return await asyncio.gather(*(session.arun("Who am I?", deps=request) for request in requests))

            results = asyncio.run(at_once())
        turns = sorted(run.run_id for run in store.list_runs(session="chat"))
    assert [result.final for result in results] == [f"you are {request.user}" for request in requests]
    assert [len(request.ran) for request in requests] == [1] * 6
    assert session.turns == 6
    assert turns == [f"chat/{n}" for n in range(1, 7)]


class TwoLooks:
    """Asks ``whoami`` as call ``a``, then as call ``b``, then answers with both results; stateless, so forks go on."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn < 2:
            return tool_turn(tool_call("whoami", id="ab"[turn], step=turn))
        return reply(" | ".join(str(text) for text in _tool_texts(messages)))


def whoami_at(step: int, ctx: RunContext[Request]) -> str:
    """Who this call was made for."""
    ctx.deps.made(f"step {step}")
    return ctx.deps.user


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_gives_the_calls_it_makes_again_the_deps_the_fork_was_given(driver: str) -> None:
    """deps.md: forks are given deps too; the recorded call is reused (nothing made), the rerun one gets the fork's."""
    tools = ToolRegistry()
    tools.register(whoami_at, name="whoami")
    agent = Agent(TwoLooks(), tools)
    original, forked = Request("original"), Request("forked")
    source = agent.run("Who?", deps=original)
    assert source.final == "original | original"
    at = next(i for i, t in enumerate(source.trace) if t.dest == "AwaitModel" and i > 0)  # after call a ran
    if driver == "sync":
        result = agent.fork(source, at, rerun={"b"}, deps=forked).finish()
    else:

        async def fork() -> Any:
            return await (await agent.afork(source, at, rerun={"b"}, deps=forked)).afinish()

        result = asyncio.run(fork())
    assert result.final == "original | forked"
    assert (original.ran, forked.ran) == (["step 0", "step 1"], ["step 1"])


def test_a_fork_given_no_deps_tells_the_call_it_makes_again_to_pass_them() -> None:
    """A fork is a new owner: without deps=, the call it makes gets NoDepsError as its result, never the source's."""
    tools = ToolRegistry()
    tools.register(whoami_at, name="whoami")
    agent = Agent(TwoLooks(), tools)
    original = Request("original")
    source = agent.run("Who?", deps=original)
    at = next(i for i, t in enumerate(source.trace) if t.dest == "AwaitModel" and i > 0)
    try:
        result = agent.fork(source, at, rerun={"b"}).finish()
    except AgentLoopError as stop:
        result = stop.result
    (answer,) = [m.content for m in result.messages if m.role == "tool" and m.tool_call_id == "b"]
    assert "NoDepsError" in answer
    assert original.ran == ["step 0", "step 1"]
