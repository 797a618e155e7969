"""A crash or a Ctrl-C inside an ``after_tool`` or ``after_model`` hook makes no call again, tool or model.

A call's ``after_tool`` hooks run before the transition that records its
outcome (a strict hook's error stops the run on that edge), so the outcome is
written as the call returns when the agent has such a hook
(``Journal.keep_outcome``).  Before, a process killed in the hook (a slow
exporter's ``span.end()``), or a Ctrl-C there, left the outcome unwritten and
the next owner made the call again.  A model's reply is taken in by the
transition after its ``after_model`` hooks alike, and is written as it is
taken when the agent has such a hook (``Journal.keep_reply``, the snapshot's
``replied``): before, a cut there asked the model again.  Every effect is
tallied in a file, which a killed process cannot lose.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.exactly_once import resumed_by_new_owner
from support.exactly_once_audit import LEASE, Tally
from support.store_cases import in_child

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class PaysOnce:
    """Asks for one ``pay`` call, then answers; each model call tallied."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if not any(message.role == "tool" for message in messages):
            self.tally.add("model asks")
            return tool_turn(tool_call("pay", id="p1", amount=5))
        self.tally.add("model answers")
        return reply("paid")


def _agent(folder: str, hook: str | None, cut: str) -> Agent:
    tally = Tally(Path(folder) / "effects.log")
    tools = ToolRegistry()

    @tools.register
    def pay(amount: int) -> str:
        """Pay, once."""
        tally.add("pay")
        return "ok"

    agent = Agent(PaysOnce(tally), tools)
    if hook is not None:
        fired: list[bool] = []

        def cut_here(event: Any) -> None:
            if not fired:
                fired.append(True)
                if cut == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)  # the process dies while the hook runs
                raise KeyboardInterrupt

        agent.on(hook, cut_here)
    return agent


def _cut(target: str, folder: str, driver: str, hook: str, cut: str, every: str) -> None:
    store = open_store(target, lease=LEASE, every=every)
    agent = _agent(folder, hook, cut)
    try:
        agent.run("go", store=store, run_id="r") if driver == "sync" else asyncio.run(
            agent.arun("go", store=store, run_id="r")
        )
    finally:
        store.close()


def _cut_and_taken_over(target: str, folder: str, driver: str, hook: str, cut: str, every: str) -> list[str]:
    if cut == "kill":
        assert in_child(_cut, target, folder, driver, hook, cut, every) == -signal.SIGKILL
    else:
        with pytest.raises(KeyboardInterrupt):
            _cut(target, folder, driver, hook, cut, every)
    result = resumed_by_new_owner(target, "r", driver, _agent(folder, None, cut))
    assert (result.reason, result.final) == ("done", "paid")
    assert [m.content for m in result.messages if m.role == "tool"] == ['"ok"']
    return Tally(Path(folder) / "effects.log").lines()


@pytest.mark.parametrize("every", ["call", "transition"])
@pytest.mark.parametrize("cut", ["kill", "ctrl_c"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_cut_in_an_after_tool_hook_makes_the_call_that_returned_not_again(
    store_target: str, tmp_path: Path, driver: str, cut: str, every: str
) -> None:
    effects = _cut_and_taken_over(store_target, str(tmp_path), driver, "after_tool", cut, every)
    assert effects == ["model asks", "pay", "model answers"]


@pytest.mark.parametrize("every", ["call", "transition"])
@pytest.mark.parametrize("cut", ["kill", "ctrl_c"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_cut_in_an_after_model_hook_asks_the_model_not_again_and_makes_no_tool_call_twice(
    store_target: str, tmp_path: Path, driver: str, cut: str, every: str
) -> None:
    effects = _cut_and_taken_over(store_target, str(tmp_path), driver, "after_model", cut, every)
    assert effects == ["model asks", "pay", "model answers"]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_with_every_turn_a_cut_in_an_after_model_hook_asks_the_model_again(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """``every="turn"`` writes only before model calls (fewer writes, exactly-once given up): the reply is not kept."""
    effects = _cut_and_taken_over(store_target, str(tmp_path), driver, "after_model", "ctrl_c", "turn")
    assert effects == ["model asks", "model asks", "pay", "model answers"]


class SlowWriteAfterReply:
    """A store whose first write after the model replied takes ``seconds`` (a slow database round trip)."""

    def __init__(self, store: Any, seconds: float) -> None:
        self.armed, self.started = False, asyncio.Event()
        inner = store.aappend

        async def aappend(entry: Any, *, owner: str) -> None:
            if self.armed:
                self.armed = False
                self.started.set()
                await asyncio.sleep(seconds)
            await inner(entry, owner=owner)

        store.aappend = aappend


class AnswersAtOnce:
    """Answers at once, and arms the store's slow write; each call tallied."""

    def __init__(self, tally: Tally, slow: SlowWriteAfterReply) -> None:
        self.tally, self.slow = tally, slow

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.tally.add("model answers")
        self.slow.armed = True
        return reply("all done")


def _answering(tally: Tally, slow: SlowWriteAfterReply, **options: Any) -> Agent:
    agent = Agent(AnswersAtOnce(tally, slow), ToolRegistry(), **options)
    agent.on("after_model", lambda event: tally.add("after_model"))
    return agent


@pytest.mark.parametrize("every", ["call", "transition"])
def test_a_deadline_passing_while_the_reply_is_written_ends_the_run_with_the_answer(
    store_target: str, tmp_path: Path, every: str
) -> None:
    """Async driver: the write comes after the call's deadline scope, so the answer that came is not dropped."""
    tally = Tally(tmp_path / "effects.log")
    store = open_store(store_target, every=every)
    slow = SlowWriteAfterReply(store, 0.6)
    try:
        result = asyncio.run(_answering(tally, slow, timeout=0.3).arun("go", store=store, run_id="r"))
    finally:
        store.close()
    assert (result.reason, result.final) == ("done", "all done")
    assert tally.lines() == ["model answers", "after_model"]


def test_a_session_turn_cancelled_while_its_reply_is_written_ends_with_the_answer(
    store_target: str, tmp_path: Path
) -> None:
    """The client left during the reply's write: the turn ends ``Done`` with the answer, and answers its request."""
    from fsm_agent import Session

    tally = Tally(tmp_path / "effects.log")
    store = open_store(store_target)
    slow = SlowWriteAfterReply(store, 0.6)

    async def go() -> tuple[dict[str, Any], str, int]:
        session = await Session.aopen(_answering(tally, slow), store, "s")
        task = asyncio.create_task(session.arun("go", request_id="q1"))
        await slow.started.wait()
        await asyncio.sleep(0.1)  # inside the slow write
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stored = await store.aload("s/1")
        again = await Session.aopen(_answering(tally, slow), store, "s")
        result = await again.arun("go", request_id="q1")
        return stored, result.final, again.turns

    try:
        stored, final, turns = asyncio.run(go())
    finally:
        store.close()
    assert (stored["state"], stored["reason"], final, turns) == ("Done", "done", "all done", 1)
    assert tally.lines().count("model answers") == 1
