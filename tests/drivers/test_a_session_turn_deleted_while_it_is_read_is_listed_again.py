"""A session's last turn, listed and then deleted before it is read, is listed again: the request goes on.

A turn whose owner was cut while beginning it is deleted by that owner
(``cut_runs.adrop_cut``).  Another request of the same conversation that
listed the turns just before reads a run the store no longer holds; it
answered a chat message with ``RunNotFoundError`` (a ``KeyError``, a 404 in
an app).  The store below lists such a vanished turn once, as the race
does; the request lists again and takes its turn after the real last one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import pytest

from fsm_agent import Agent, PostgresStore, RunStateError, Session, SqliteStore
from fsm_agent.persist import is_url
from fsm_agent.testing import FakeModel, demo_registry, reply


def _vanishing(target: str, times: int) -> Any:
    """The store at ``target``, whose next ``times`` listings name a turn after the last that it no longer holds."""
    base = PostgresStore if is_url(target) else SqliteStore

    class Vanishing(base):  # type: ignore[misc, valid-type]
        left = 0

        def _listed(self, runs: list[Any]) -> list[Any]:
            if not self.left or not runs:
                return runs
            self.left -= 1
            last = max(runs, key=lambda run: int(run.run_id.rsplit("/", 1)[1]))
            gone = attrs.evolve(
                last, run_id=f"{last.run_id.rsplit('/', 1)[0]}/{int(last.run_id.rsplit('/', 1)[1]) + 1}"
            )
            return [*runs, gone]

        def list_runs(self, *args: Any, **kwargs: Any) -> Any:
            return self._listed(list(super().list_runs(*args, **kwargs)))

        async def alist_runs(self, *args: Any, **kwargs: Any) -> Any:
            return self._listed(list(await super().alist_runs(*args, **kwargs)))

    store = Vanishing(target)
    store.left = times
    return store


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_request_lists_the_turns_again_and_takes_its_turn(store_target: str, driver: str) -> None:
    model = FakeModel(reply("one"), reply("two"))
    agent = Agent(model, demo_registry())
    with _vanishing(store_target, 0) as store:
        Session(agent, store, "chat").run("first")
        store.left = 1  # the next listing names chat/2, deleted before it is read
        if driver == "sync":
            result = Session(agent, store, "chat").run("second")
        else:

            async def second() -> Any:
                chat = await Session.aopen(agent, store, "chat")
                return await chat.arun("second")

            result = asyncio.run(second())
        turns = sorted(run.run_id for run in store.list_runs(session="chat"))
    assert result.final == "two"
    assert turns == ["chat/1", "chat/2"]
    assert len(model.seen) == 2


def test_a_store_whose_listing_never_agrees_with_its_runs_is_an_error(tmp_path: Any) -> None:
    with _vanishing(str(tmp_path / "runs.db"), 0) as store:
        Session(Agent(FakeModel(reply("one")), demo_registry()), store, "chat").run("first")
        store.left = 10
        with pytest.raises(RunStateError, match="lists turn 2 of session 'chat' but holds no run 'chat/2', 3 times"):
            Session(Agent(FakeModel(reply("two")), demo_registry()), store, "chat")
