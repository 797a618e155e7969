"""A stored run whose parallel batch was cut mid-way, then resumed to its end: forked at every transition.

The batch (async driver) is ``[a, h, b, r]``: ``a`` returns at once, ``h``
hangs the first time (the cut: the run's timeout, or its task cancelled),
and ``b`` and ``r`` wait for a person, who approves ``b`` and rejects ``r``
after the resume.  The cut's stop keeps ``a``'s outcome.  A fork's rebuild
must take ``a`` back before the stop as the source's did: it used to meet a
timeout's stop with ``a`` still pending, and to count ``r``'s rejection twice
when working out how many calls came back before a cut, so every fork past
the resumed batch was refused.  Counted: every tool execution by call id and
every model call; a fork rebuilds calling nothing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, ForkEdit, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

CUT_AFTER = 0.5
"""The source's timeout, passed while ``h`` hangs (it never returns the first time)."""
LIFTED = 3600.0
"""The timeout the source is resumed (and its forks go on) under: never reached."""
WAIT = 30.0
"""Seconds the task-cut waits at most for ``h`` to start: it starts within milliseconds."""


def _tools(ran: Counter[str], hung: asyncio.Event | None = None) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.register
    async def free(n: int, call_id: str) -> str:
        """Free work."""
        ran[call_id] += 1
        return f"free {n}"

    @tools.register
    async def slow(call_id: str) -> str:
        """Hangs the first time it runs."""
        ran[call_id] += 1
        if ran[call_id] == 1:
            if hung is not None:
                hung.set()
            await asyncio.Event().wait()
        return "slow done"

    @tools.register
    async def send(to: str, call_id: str) -> str:
        """Send something (held for a person)."""
        ran[call_id] += 1
        return f"sent to {to}"

    return tools


def _agent(ran: Counter[str], model: FakeModel, hung: asyncio.Event | None = None, **limits: Any) -> Agent:
    return Agent(model, _tools(ran, hung), approve={"send"}, **limits)


def _source(store: Any, cut: str, ran: Counter[str]) -> Any:
    """The source: cut mid-batch, resumed, decided, resumed to its end."""
    batch = [
        tool_call("free", id="a", n=1),
        tool_call("slow", id="h"),
        tool_call("send", id="b", to="B"),
        tool_call("send", id="r", to="R"),
    ]
    model = FakeModel(tool_turn(*batch), reply("fin"))

    async def go() -> Any:
        hung = asyncio.Event()
        agent = _agent(ran, model, hung, timeout=CUT_AFTER if cut == "timeout" else None)
        task = asyncio.ensure_future(agent.arun("go", store=store, run_id="src"))
        if cut == "task":
            await asyncio.wait_for(hung.wait(), WAIT)
            task.cancel()
        with pytest.raises((AgentLoopError, asyncio.CancelledError)):
            await task
        run = await agent.aresume(store.load("src"), store=store, retry=True, timeout=LIFTED)
        paused = await run.afinish()
        assert paused.reason == "paused"
        store.decide("src", "b", True)
        store.decide("src", "r", "not today")
        run = await agent.aresume(store.load("src"), store=store)
        return await run.afinish()

    return asyncio.run(go())


@pytest.mark.parametrize("cut", ["timeout", "task"])
def test_a_run_whose_batch_was_cut_and_resumed_forks_at_every_transition_calling_nothing(
    store_target: str, cut: str
) -> None:
    ran: Counter[str] = Counter()
    with open_store(store_target) as store:
        source = _source(store, cut, ran)
        assert source.final == "fin"
        assert ran == Counter({"a": 1, "h": 2, "b": 1})  # h was in flight at the cut: made again, as documented
        edit = ForkEdit(limits={"timeout": LIFTED})
        stop = next(i for i, t in enumerate(source.trace) if t.dest == "Failed")
        for at in range(len(source.trace) - 1):
            if at == stop and cut == "timeout":
                continue  # at the stop itself the fork goes on from it: the edit lifts it, c.f. the next test file
            for driver in ("sync", "async"):
                forking = _agent(ran, FakeModel(reply("fin")))
                if driver == "sync":
                    fork = forking.fork("src", at, store=store, run_id=f"f{at}{driver}", edit=edit).finish()
                else:

                    async def both(forking: Agent = forking, at: int = at, driver: str = driver) -> Any:
                        run = await forking.afork("src", at, store=store, run_id=f"f{at}{driver}", edit=edit)
                        return await run.afinish()

                    fork = asyncio.run(both())
                assert fork.reason in ("done", "paused"), (at, driver, fork.reason)
                assert fork.trace[: at + 1] == source.trace[: at + 1]
        assert ran == Counter({"a": 1, "h": 2, "b": 1})  # no fork made a call: each took the source's outcomes
