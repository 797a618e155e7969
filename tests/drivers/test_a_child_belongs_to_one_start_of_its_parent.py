"""A sub-agent's stored run answers its call in one start of its parent: a parent started again asks its child anew.

A resumed parent takes its call's child from the store (read back, or
taken over), never running it twice.  A parent started again over the same
id, by ``overwrite=True`` or as a fork under the id of a deleted run, is a
new run: though its call and input be the same, the old run's child (left
in the store: ``delete`` removes one run) is not its answer, so a fork that
makes every call again (``rerun="all"``) makes the child's calls too.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import Agent, AgentRun, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class Asks:
    """Asks for ``call`` until a tool result is back, then answers ``answer``; counts its calls in ``ran``."""

    def __init__(self, ran: Counter[str], name: str, call: Any, answer: str) -> None:
        self.ran, self.name, self.call, self.answer = ran, name, call, answer

    def complete(self, messages: Sequence[Message], tools: Any) -> ModelResponse:
        self.ran[self.name] += 1
        if any(message.role == "tool" for message in messages):
            return reply(self.answer)
        return tool_turn(self.call)


def _parent(ran: Counter[str]) -> Agent:
    child_tools = ToolRegistry()

    @child_tools.register
    def look_up(city: str) -> str:
        """Look a city up: the child's side effect, counted."""
        ran["look_up"] += 1
        return "capital"

    child = Agent(Asks(ran, "child model", tool_call("look_up", id="l1", city="Paris"), "Paris"), child_tools)
    tools = ToolRegistry()
    tools.register(child.as_tool("research", "Answers one research question."))  # type: ignore[arg-type]
    return Agent(Asks(ran, "parent model", tool_call("research", id="c1", input="capital?"), "It is Paris."), tools)


def _finished(run: AgentRun, driver: str) -> RunResult:
    return run.finish() if driver == "sync" else asyncio.run(run.afinish())


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_parent_started_again_with_overwrite_asks_its_child_anew(store_target: str, driver: str) -> None:
    ran: Counter[str] = Counter()
    with open_store(store_target) as store:
        first = _finished(_parent(ran).start("q", store=store, run_id="trip"), driver)
        assert first.steps[0].child == "trip/c1"
        again = _finished(_parent(ran).start("q", store=store, run_id="trip", overwrite=True), driver)
        assert again.final == "It is Paris."
        assert str(again.steps[0].child).startswith("trip/c1@")  # the old run's child is not its answer
        assert ran == Counter({"parent model": 4, "child model": 4, "look_up": 2})


def _fork(driver: str, ran: Counter[str], store: Any) -> RunResult:
    """``src`` forked at its first transition as ``x``, every call made again, to its end."""
    if driver == "sync":
        return _parent(ran).fork("src", 0, store=store, run_id="x", rerun="all").finish()

    async def forked() -> RunResult:
        return await (await _parent(ran).afork("src", 0, store=store, run_id="x", rerun="all")).afinish()

    return asyncio.run(forked())


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_under_the_id_of_a_deleted_fork_makes_its_childs_calls_again(store_target: str, driver: str) -> None:
    ran: Counter[str] = Counter()
    with open_store(store_target) as store:
        _finished(_parent(ran).start("q", store=store, run_id="src"), driver)
        assert _fork(driver, ran, store).steps[0].child == "x/c1"
        assert ran["look_up"] == 2
        assert store.delete("x")  # the fork goes; its child's run x/c1 stays
        again = _fork(driver, ran, store)
        assert again.final == "It is Paris."
        assert ran == Counter({"parent model": 4, "child model": 6, "look_up": 3})  # rerun="all": the child's too
