"""In an async run, sync tools and sync models run off the event loop: the loop keeps serving other tasks meanwhile.

docs/how-to/async.md, "What is awaited, and what runs in a thread": a
model without ``acomplete`` runs ``complete`` in a worker thread; sync tools
run in a worker thread.  Each check runs a ``Ticker`` task beside the run;
the sync call blocks its thread until the ticker has advanced, so a call made
on the loop itself would never see it advance (it gives up after a guard of
seconds and reports that).  No timing is asserted: only that the loop ran.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fsm_agent import Agent, Message, ModelResponse, Session, SqliteStore, ToolRegistry
from fsm_agent.persist.recording import export
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.testing.replay import areplay

T = TypeVar("T")

ADVANCE = 5
"""Ticks the loop must make while one sync call blocks its thread."""


class Ticker:
    """A task that counts how often the event loop ran it; a sync call waits for it to move on."""

    def __init__(self, patience: int = 10_000) -> None:
        self.ticks = 0
        self.patience = patience  # polls of 2 ms before a blocked call gives up
        self.seen: list[bool] = []  # per sync call: whether the loop advanced while it blocked

    async def tick(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0.001)

    def wait_for_the_loop(self) -> None:
        """Block this thread until the loop ticked ``ADVANCE`` more times (a guard gives up after about 20 s)."""
        start = self.ticks
        for _ in range(self.patience):
            if self.ticks >= start + ADVANCE:
                self.seen.append(True)
                return
            time.sleep(0.002)
        self.seen.append(False)

    async def beside(self, work: Awaitable[T]) -> T:
        """Await ``work`` with the ticker running beside it."""
        task = asyncio.create_task(self.tick())
        try:
            return await work
        finally:
            task.cancel()


class BlockingModel:
    """A sync model (no ``acomplete``) whose every call blocks until the loop ticked; then its next reply."""

    def __init__(self, ticker: Ticker, *replies: ModelResponse) -> None:
        self.ticker = ticker
        self.replies = list(replies)

    def complete(self, messages: Sequence[Message], tools: Any) -> ModelResponse:
        self.ticker.wait_for_the_loop()
        return self.replies.pop(0)


class Immediate:
    """An async model with a script: the loop is free while it answers (the control)."""

    def __init__(self, *replies: ModelResponse) -> None:
        self.replies = list(replies)

    async def acomplete(self, messages: Sequence[Message], tools: Any) -> ModelResponse:
        return self.replies.pop(0)

    def complete(self, messages: Sequence[Message], tools: Any) -> ModelResponse:
        """For the sync driver (a recording made on it); the async driver awaits ``acomplete``."""
        return self.replies.pop(0)


def _blocking_tools(ticker: Ticker) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    def look(city: str) -> str:
        """Look a city up, blocking this thread until the loop ticked."""
        ticker.wait_for_the_loop()
        return f"{city}: sunny"

    return registry


def _all_off_the_loop(ticker: Ticker, calls: int) -> None:
    assert ticker.seen == [True] * calls, "a sync call blocked the event loop"


def test_the_ticker_sees_a_call_that_blocks_the_loop() -> None:
    """The control: an async model that blocks inside ``acomplete`` holds the loop, and the ticker says so."""
    ticker = Ticker(patience=25)

    class BlocksTheLoop:
        async def acomplete(self, messages: Sequence[Message], tools: Any) -> ModelResponse:
            ticker.wait_for_the_loop()
            return reply("hello")

    assert asyncio.run(ticker.beside(Agent(BlocksTheLoop(), ToolRegistry()).arun("hi"))).final == "hello"
    assert ticker.seen == [False]


def test_a_sync_model_runs_off_the_loop() -> None:
    """``complete`` runs in a worker thread: the loop ticks while it blocks."""
    ticker = Ticker()
    agent = Agent(BlockingModel(ticker, reply("hello")), ToolRegistry())
    assert asyncio.run(ticker.beside(agent.arun("hi"))).final == "hello"
    _all_off_the_loop(ticker, 1)


def test_a_sync_model_runs_off_the_loop_in_a_run_with_a_deadline() -> None:
    """With ``timeout=`` the call runs in a daemon worker (which the deadline may abandon): off the loop still."""
    ticker = Ticker()
    agent = Agent(BlockingModel(ticker, reply("hello")), ToolRegistry(), timeout=120)
    assert asyncio.run(ticker.beside(agent.arun("hi"))).final == "hello"
    _all_off_the_loop(ticker, 1)


@pytest.mark.parametrize("timeout", [None, 120.0], ids=["no tool_timeout", "tool_timeout"])
def test_sync_tools_run_off_the_loop_one_call_and_a_parallel_batch(timeout: float | None) -> None:
    """One call alone, then a turn of three: each sync tool call blocks a worker thread, never the loop."""
    ticker = Ticker()
    one = tool_turn(tool_call("look", id="c1", city="Oslo"))
    three = tool_turn(*(tool_call("look", id=f"c{i}", city=city) for i, city in enumerate(["Rome", "Lima", "Nuuk"], 2)))
    agent = Agent(Immediate(one, three, reply("done")), _blocking_tools(ticker), tool_timeout=timeout)
    result = asyncio.run(ticker.beside(agent.arun("weather")))
    assert result.final == "done"
    assert [m.content for m in result.messages if m.role == "tool"] == [
        '"Oslo: sunny"',
        '"Rome: sunny"',
        '"Lima: sunny"',
        '"Nuuk: sunny"',
    ]
    _all_off_the_loop(ticker, 4)


def test_a_sub_agent_s_sync_model_and_tools_run_off_the_loop() -> None:
    """The parent awaits its child on the same loop: the child's sync model and sync tool block threads only."""
    ticker = Ticker()
    child = Agent(
        BlockingModel(ticker, tool_turn(tool_call("look", id="k1", city="Oslo")), reply("sunny")),
        _blocking_tools(ticker),
    )
    registry = ToolRegistry()
    registry.register(child.as_tool("research", "Answers one question."))  # type: ignore[arg-type]
    parent = Agent(Immediate(tool_turn(tool_call("research", id="q1", input="Oslo?")), reply("It is sunny.")), registry)
    assert asyncio.run(ticker.beside(parent.arun("weather"))).final == "It is sunny."
    _all_off_the_loop(ticker, 3)


def test_astream_calls_a_sync_model_and_sync_tools_off_the_loop() -> None:
    """``agent.astream``: the same calls as ``arun``, each in a worker thread."""
    ticker = Ticker()
    model = BlockingModel(ticker, tool_turn(tool_call("look", id="c1", city="Oslo")), reply("done"))
    agent = Agent(model, _blocking_tools(ticker))

    async def go() -> list[Any]:
        return [event async for event in agent.astream("weather")]

    events = asyncio.run(ticker.beside(go()))
    assert events
    _all_off_the_loop(ticker, 3)


def test_a_session_turn_calls_a_sync_model_off_the_loop() -> None:
    """``Session.arun`` drives the turn on the async driver: the sync model runs in a thread."""
    ticker = Ticker()
    session = Session(Agent(BlockingModel(ticker, reply("one"), reply("two")), ToolRegistry()))

    async def go() -> list[str]:
        return [(await session.arun("a")).final, (await session.arun("b")).final]

    assert asyncio.run(ticker.beside(go())) == ["one", "two"]
    _all_off_the_loop(ticker, 2)


def test_areplay_with_live_sync_tools_runs_them_off_the_loop(tmp_path: Path) -> None:
    """``areplay(..., tools="live")``: the recorded model answers, the agent's own sync tools run in threads."""
    script = (tool_turn(tool_call("look", id="c1", city="Oslo")), reply("done"))
    with SqliteStore(tmp_path / "runs.db") as store:
        recorder = Ticker()
        recorder.wait_for_the_loop = lambda: None  # type: ignore[method-assign] # recorded on the sync driver
        Agent(Immediate(*script), _blocking_tools(recorder)).run("weather", store=store, run_id="r")
        recording = export(store, "r")
    ticker = Ticker()
    agent = Agent(Immediate(), _blocking_tools(ticker))
    replayed = asyncio.run(ticker.beside(areplay(agent, recording, tools="live")))
    assert replayed.final == "done"
    _all_off_the_loop(ticker, 1)
