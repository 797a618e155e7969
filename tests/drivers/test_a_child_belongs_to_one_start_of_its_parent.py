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

from fsm_agent import Agent, AgentLoopError, AgentRun, CancelToken, Message, ModelResponse, RunResult, ToolRegistry
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


def _parent(
    ran: Counter[str], stop: CancelToken | None = None, city: str = "Paris", cities: Counter[str] | None = None
) -> Agent:
    """A parent whose sub-agent looks ``city`` up; with ``stop``, the look-up presses it (the run's own token).

    ``ran`` counts each model's calls and the look-ups, ``cities`` (if given) the look-ups of each city.
    """
    child_tools = ToolRegistry()

    @child_tools.register
    def look_up(city: str) -> str:
        """Look a city up: the child's side effect, counted."""
        ran["look_up"] += 1
        if cities is not None:
            cities[city] += 1
        if stop is not None:
            stop.cancel("the user pressed stop")
        return "capital"

    child = Agent(Asks(ran, "child model", tool_call("look_up", id="l1", city=city), city), child_tools)
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


def _cut_in_its_child(
    ran: Counter[str], store: Any, driver: str, cities: Counter[str] | None = None, **start: Any
) -> None:
    """A start of ``trip`` cut by a cancel its child's look-up pressed: the look-up made, the child unfinished."""
    token = CancelToken()
    parent = _parent(ran, token, cities=cities)
    with pytest.raises(AgentLoopError, match="cancelled"):
        _finished(parent.start("q", store=store, run_id="trip", cancel=token, **start), driver)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_parent_started_a_third_time_and_cut_finds_its_own_child_when_resumed(store_target: str, driver: str) -> None:
    ran: Counter[str] = Counter()
    with open_store(store_target) as store:
        _finished(_parent(ran).start("q", store=store, run_id="trip"), driver)
        _finished(_parent(ran).start("q", store=store, run_id="trip", overwrite=True), driver)
        _cut_in_its_child(ran, store, driver, overwrite=True)
        assert ran["look_up"] == 3
        resumed = _finished(_parent(ran).resume(store.load("trip"), store=store, cancel=CancelToken()), driver)
        assert resumed.final == "It is Paris."
        assert ran["look_up"] == 3  # the third start's child was taken over, its look-up not made again
        assert [run.run_id for run in store.list_runs(parent="trip")].count(resumed.steps[0].child) == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_of_a_parent_cut_in_its_second_starts_child_takes_that_childs_calls(
    store_target: str, driver: str
) -> None:
    ran: Counter[str] = Counter()
    cities: Counter[str] = Counter()
    with open_store(store_target) as store:
        first = _parent(ran, city="Rome", cities=cities)  # its child, trip/c1, looks Rome up
        _finished(first.start("q", store=store, run_id="trip"), driver)
        _cut_in_its_child(ran, store, driver, cities, overwrite=True)
        assert cities == Counter({"Rome": 1, "Paris": 1})
        last = len(store.load("trip")["trace"]) - 1
        forked = _parent(ran, cities=cities).fork("trip", last, store=store, run_id="f").finish()
        assert forked.final == "It is Paris."
        assert cities == Counter({"Rome": 1, "Paris": 1})  # the cut child's (second start's) look-up is taken


def test_the_viewer_names_the_in_flight_child_of_the_parents_own_start(tmp_path: Any) -> None:
    from fsm_agent.ui.run_page import run_view

    ran: Counter[str] = Counter()
    with open_store(str(tmp_path / "runs.db")) as store:
        _finished(_parent(ran).start("q", store=store, run_id="trip"), "sync")
        _cut_in_its_child(ran, store, "sync", overwrite=True)
        data = store.load("trip")
        children = [(child["run_id"], child["state"]) for child in run_view(store, "trip", data)["children"]]
    assert len(children) == 1
    (child, state) = children[0]
    assert child.startswith("trip/c1@")  # not trip/c1, the first start's finished child
    assert state != "Done"
