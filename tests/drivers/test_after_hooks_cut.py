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
