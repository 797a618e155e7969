"""A cancel that comes after the guards cleared a call, and before the call starts: the call is not made.

The token is read by the guards at the edge into the call's state, but
hooks, observers, a pause for a person's decision or the time between two
``advance()`` calls come between that edge and the call.  A cancel there
stops the run ``cancelled`` with the call left unmade (the interrupted
edge, no ``unfinished`` call), as a deadline passed there stops it
``timeout``; a resume with a fresh token makes it once.  A cancel in the
``after_tool`` hook of a turn's last call is read by the edge that leads to
the next model call, so that call is not made either.  Each hook cancels
the token itself: the cancel is certain to come exactly there.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.counted_calls import drive, finish

from fsm_agent import Agent, AgentLoopError, CancelToken, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.persist import store_for
from fsm_agent.testing import edge_id, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class Sender:
    """Asks for ``n`` sends in one reply, then answers once their results are back; counts its calls."""

    def __init__(self, ran: Counter[str], n: int = 1) -> None:
        self.ran, self.n = ran, n

    def complete(self, messages: Sequence[Message], tools: Any) -> ModelResponse:
        self.ran["model"] += 1
        if not any(message.role == "tool" for message in messages):
            return tool_turn(*(tool_call("send", id=f"s{i}", to=str(i)) for i in range(1, self.n + 1)))
        return reply("all sent")


def _agent(ran: Counter[str], n: int = 1, **options: Any) -> Agent:
    tools = ToolRegistry()

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a message: the side effect counted."""
        ran[call_id] += 1
        return f"sent to {to}"

    return Agent(Sender(ran, n), tools, **options)


def _cancelling(token: CancelToken, when: Any = None) -> Any:
    def hook(event: Any) -> None:
        if when is None or when(event):
            token.cancel("the user pressed stop")

    return hook


def _resumed(stopped: RunResult, ran: Counter[str], driver: str, store: str | None, n: int = 1) -> RunResult:
    """The stopped run resumed with a fresh token by a new agent, to its end."""
    source = stopped if store is None else store_for(store).load("r1")
    resumed = _agent(ran, n).resume(source, cancel=CancelToken(), **({} if store is None else {"store": store}))
    return finish(resumed, driver)


def _store(kind: str, tmp_path: Path) -> str | None:
    return None if kind == "none" else str(tmp_path / "runs.db")


@pytest.mark.parametrize("store_kind", ["none", "sqlite"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_ExecuteTool_to_Failed_cancelled_on_a_cancel_in_the_last_calls_after_tool_hook(
    driver: str, store_kind: str, tmp_path: Path
) -> None:
    ran: Counter[str] = Counter()
    token, store = CancelToken(), _store(store_kind, tmp_path)
    agent = _agent(ran)
    agent.on("after_tool", _cancelling(token))
    stopped = drive(agent, driver, cancel=token, run_id="r1", **({} if store is None else {"store": store}))
    assert (stopped.reason, stopped.trace[-1].trigger) == ("cancelled", "tool_done")
    assert ran == Counter({"model": 1, "s1": 1})  # the next model call was not made
    assert _resumed(stopped, ran, driver, store).final == "all sent"
    assert ran == Counter({"model": 2, "s1": 1})


def test_a_cancel_in_the_after_tool_hook_of_a_parallel_batchs_last_call_makes_no_model_call() -> None:
    ran: Counter[str] = Counter()
    token = CancelToken()
    agent = _agent(ran, n=3)
    agent.on("after_tool", _cancelling(token, lambda event: event.tool_call.id == "s3"))
    stopped = drive(agent, "async", cancel=token)
    assert stopped.reason == "cancelled"
    assert ran == Counter({"model": 1, "s1": 1, "s2": 1, "s3": 1})
    assert _resumed(stopped, ran, "async", None, n=3).final == "all sent"
    assert ran == Counter({"model": 2, "s1": 1, "s2": 1, "s3": 1})


HOOKS = {
    "before_tool": ("before_tool", None),
    "enter:ExecuteTool": ("enter:ExecuteTool", None),
    "transition into ExecuteTool": ("transition", lambda event: event.dest == "ExecuteTool"),
    "before_model of turn 2": ("before_model", lambda event: event.turn == 2),
    "enter:AwaitModel": ("enter:AwaitModel", None),
}


@pytest.mark.parametrize("store_kind", ["none", "sqlite"])
@pytest.mark.parametrize("hook", list(HOOKS))
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cancel_in_a_hook_before_a_call_leaves_the_call_unmade(
    driver: str, hook: str, store_kind: str, tmp_path: Path
) -> None:
    ran: Counter[str] = Counter()
    token, store = CancelToken(), _store(store_kind, tmp_path)
    agent = _agent(ran, timeout=60)
    name, when = HOOKS[hook]
    agent.on(name, _cancelling(token, when))
    stopped = drive(agent, driver, cancel=token, run_id="r1", **({} if store is None else {"store": store}))
    assert (stopped.reason, stopped.trace[-1].trigger) == ("cancelled", "interrupted")
    assert "unfinished" not in stopped.evidence  # left unmade, not cut in flight
    before_the_model = "Model" in hook or "turn 2" in hook
    assert ran == (Counter({"model": 1, "s1": 1}) if before_the_model else Counter({"model": 1}))
    assert _resumed(stopped, ran, driver, store).final == "all sent"
    assert ran == Counter({"model": 2, "s1": 1})


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cancel_between_two_advance_calls_leaves_the_tool_call_unmade(driver: str) -> None:
    ran: Counter[str] = Counter()
    token = CancelToken()
    run = _agent(ran).start("q", cancel=token)

    def advance() -> Any:
        return run.advance() if driver == "sync" else asyncio.run(run.aadvance())

    while advance().dest != "ExecuteTool":
        pass
    token.cancel("between two advance() calls")
    assert edge_id(advance()) == "ExecuteTool->Failed[cancelled]"
    assert ran == Counter({"model": 1})


@pytest.mark.parametrize("store_kind", ["none", "sqlite"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_paused_run_resumed_with_a_cancelled_token_makes_no_approved_call(
    driver: str, store_kind: str, tmp_path: Path
) -> None:
    ran: Counter[str] = Counter()
    store = _store(store_kind, tmp_path)
    where = {} if store is None else {"store": store}
    paused = _agent(ran, approve={"send"}).run("q", run_id="r1", **where)
    assert paused.reason == "paused"
    token = CancelToken()
    token.cancel("the user left")
    if store is None:
        source, decided = paused, {"approvals": {"s1": True}}
    else:
        store_for(store).decide("r1", "s1", True)
        source, decided = store_for(store).load("r1"), {}
    agent = _agent(ran, approve={"send"})

    async def aresumed() -> RunResult:
        return await (await agent.aresume(source, cancel=token, **where, **decided)).afinish()

    with pytest.raises(AgentLoopError) as stop:
        agent.resume(source, cancel=token, **where, **decided).finish() if driver == "sync" else asyncio.run(aresumed())
    assert stop.value.reason == "cancelled"
    assert ran == Counter({"model": 1})  # the approved send was not made after the cancel
    again = stop.value.result if store is None else store_for(store).load("r1")
    resumed = _agent(ran, approve={"send"}).resume(again, cancel=CancelToken(), **where)
    assert finish(resumed, driver).final == "all sent"
    assert ran == Counter({"model": 2, "s1": 1})


@pytest.mark.parametrize("max_concurrency", [None, 1])
def test_a_cancel_in_a_parallel_batch_calls_before_tool_hook_leaves_it_and_the_rest_unmade(
    max_concurrency: int | None,
) -> None:
    ran: Counter[str] = Counter()
    token = CancelToken()
    agent = _agent(ran, n=3, max_concurrency=max_concurrency)
    agent.on("before_tool", _cancelling(token, lambda event: event.tool_call.id == "s1"))
    stopped = drive(agent, "async", cancel=token)
    assert (stopped.reason, stopped.trace[-1].trigger) == ("cancelled", "interrupted")
    assert ran == Counter({"model": 1})
    assert _resumed(stopped, ran, "async", None, n=3).final == "all sent"
    assert ran == Counter({"model": 2, "s1": 1, "s2": 1, "s3": 1})
