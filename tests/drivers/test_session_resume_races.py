"""Two owners of one conversation: one resumes its stopped last turn as the other takes the next turn.

Turn 1 asks for ``send`` and stops on ``max_steps`` after it ran.  Owner A
resumes it (``Session.resume``, a higher ``max_steps``), owner B takes turn
2 on another ``Session`` object, and B's whole turn lands at one of the
points where the two can cross: after A read the session, between B's
read and its store write, or after B stored turn 2 and before it checked
turn 1 again.  Whatever the order, every reply a caller is given is in the
conversation read back afterwards, a refused owner is told why, and
``send`` ran once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from support.turn_models import sender

from fsm_agent import Agent, Message, ModelResponse, RunLeasedError, RunStateError, Session
from fsm_agent.persist import PostgresStore, SqliteStore, is_url
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class _Mailer:
    """Asked to mail Ada, calls ``send`` once, then says so; any other question is answered at once."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = [m for m in messages if m.role == "user"][-1].content
        if question == "mail ada":
            if messages[-1].role == "user":
                return tool_turn(tool_call("send", id="c1", to="ada"))
            return reply("Mailed Ada.")
        return reply(f"ok: {question}")

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        return self.complete(messages, tools)


def _hooked_store(target: str) -> Any:
    """A store of ``target``'s kind that runs ``hooks[n]`` (another owner acting) around its n-th load of turn 1.

    A hook keyed ``(n, "before")`` runs before that load reads the store, one keyed ``(n, "after")`` once it has.
    """
    base: type = PostgresStore if is_url(target) else SqliteStore

    class Hooked(base):  # type: ignore[misc,valid-type]
        hooks: dict[tuple[int, str], Callable[[], Any]]
        loads = 0

        def _hooks(self, run_id: str) -> tuple[Callable[[], Any] | None, Callable[[], Any] | None]:
            if run_id != "chat/1":
                return None, None
            self.loads += 1
            return self.hooks.pop((self.loads, "before"), None), self.hooks.pop((self.loads, "after"), None)

        def load(self, run_id: str) -> dict[str, Any]:
            before, after = self._hooks(run_id)
            if before is not None:
                before()
            data = super().load(run_id)
            if after is not None:
                after()
            return data

        async def aload(self, run_id: str) -> dict[str, Any]:
            before, after = self._hooks(run_id)
            if before is not None:
                await before()
            data = await super().aload(run_id)
            if after is not None:
                await after()
            return data

    store = Hooked(target)
    store.hooks = {}
    return store


# Where the other owner's whole action lands: (whose store runs it, at which of its loads of turn 1, who acts).
CROSSINGS = {
    # A read the session and turn 1 (to resume it); B takes turn 2 before A claims turn 1.
    "B's turn between A's read and A's claim": ("a", (1, "after"), "b"),
    # B read the session and turn 1; A resumes turn 1 whole before B stores turn 2 on what it read.
    "A's resume between B's read and B's store write": ("b", (1, "after"), "a"),
    # B stored turn 2 and reads turn 1 again: A's resume reads the session then, and finds turn 2 taken.
    "A's resume between B's store write and B's check": ("b", (2, "before"), "a"),
}


@pytest.mark.parametrize("crossing", sorted(CROSSINGS))
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stopped_turn_resumed_as_another_owner_takes_the_next_turn_loses_no_reply(
    store_target: str, driver: str, crossing: str
) -> None:
    """Each reply a caller got is in the conversation; a refused owner gets ``RunStateError``/``RunLeasedError``."""
    made: Counter[str] = Counter()
    agent = Agent(_Mailer(), sender(made), max_steps=1, on_stop={"max_steps": "return"})
    stores = {"a": _hooked_store(store_target), "b": _hooked_store(store_target)}
    a = Session(agent, store=stores["a"], session_id="chat")
    b = Session(agent, store=stores["b"], session_id="chat")
    first = a.run("mail ada")
    assert (first.reason, made) == ("max_steps", Counter({"c1": 1}))
    for store in stores.values():
        store.loads = 0
    given: list[str] = []  # the replies the callers were shown
    refused: dict[str, BaseException] = {}
    whose, at, actor = CROSSINGS[crossing]  # the owner who acts first is the other one

    if driver == "sync":

        def act(who: str) -> None:
            try:
                given.append(a.resume(max_steps=4).final if who == "a" else b.run("thanks").final)
            except (RunStateError, RunLeasedError) as exc:
                refused[who] = exc

        stores[whose].hooks[at] = lambda: act(actor)
        act("a" if actor == "b" else "b")
    else:

        async def aact(who: str) -> None:
            try:
                result = await (a.aresume(max_steps=4) if who == "a" else b.arun("thanks"))
                given.append(result.final)
            except (RunStateError, RunLeasedError) as exc:
                refused[who] = exc

        stores[whose].hooks[at] = lambda: aact(actor)
        asyncio.run(aact("a" if actor == "b" else "b"))

    assert not stores[whose].hooks, "the other owner never acted: the crossing was not reached"
    assert made == Counter({"c1": 1})
    said = [m.content for m in Session(agent, store=store_target, session_id="chat").messages if m.role == "assistant"]
    lost = [text for text in given if text not in said]
    assert not lost, f"replies given to a caller but in no turn of the conversation: {lost} (refused: {refused})"
    assert len(given) + len(refused) == 2
    assert "b" not in refused or crossing != "B's turn between A's read and A's claim"
    turn_1 = Session(agent, store=store_target, session_id="chat").store.load("chat/1")  # type: ignore[union-attr]
    if "a" in refused:  # a refused resume leaves turn 1 as it stopped, free: nothing half-done
        assert (turn_1["state"], turn_1["reason"]) == ("Failed", "max_steps")
        if isinstance(refused["a"], RunStateError):
            assert "another owner took turn 2" in str(refused["a"])
    else:
        assert (turn_1["state"], turn_1["final"]) == ("Done", "Mailed Ada.")
    with _hooked_store(store_target) as store:
        store.claim("chat/1", turn_1, owner="a third owner")  # free: no lease of a refused owner kept
