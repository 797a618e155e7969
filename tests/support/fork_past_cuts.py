"""Stored sources cut by their timeout, a cancel token or a bare task cancel, then resumed to their end: to fork.

Every source asks ``lookup`` three times (calls ``c1``, ``c2``, ``c3``),
one call a turn, then answers.  Its model and its tool count every call
(the model every request, the tool every run by call id), so a test can
say that a fork's rebuild called nothing and its continuation made each
call past the fork point once.  ``SOURCES`` names the ways a source is cut:
on which driver, and by what.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from fsm_agent import (
    Agent,
    CancelToken,
    Message,
    ModelResponse,
    RunContext,
    RunResult,
    ToolRegistry,
    Transition,
    Usage,
)
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

WAIT = 30.0
"""Seconds any wait for milliseconds of work may take (under 5 ms idle, under 50 ms beside two CPU hogs): 600x."""
DEADLINE = 0.5
"""The source's timeout, passed while ``c1`` is held: a whole source run without the hold (four scripted model calls,
three tool calls, a resume, their store writes) measured 6 to 19 ms idle and up to 36 ms beside two CPU hogs, so
0.5 s is 14x the worst of them (each source waits it out: 2 s cost the suite half a minute)."""
LIFTED = 600.0
"""The timeout a source is resumed (or a fork at its timeout stop goes on) under: 300x its first, never reached."""

U = Usage(10, 3)
SCRIPT = [
    tool_turn(tool_call("lookup", id="c1", x=1), usage=U),
    tool_turn(tool_call("lookup", id="c2", x=2), usage=U),
    tool_turn(tool_call("lookup", id="c3", x=3), usage=U),
    reply("found 1, 2 and 3", usage=U),
]
ANSWER = "found 1, 2 and 3"

SOURCES = ("timeout-sync", "timeout-async", "token-sync", "token-async", "task-cut-tool", "task-cut-model")
"""How a source is cut: its timeout in ``c1`` (sync or async driver), its cancel token cancelled by ``c1`` (sync or
async), its task cancelled with ``c1`` in flight, or with its second model call in flight (async only: a sync
driver has no task to cancel)."""


class Model:
    """Answers the n-th reply of ``SCRIPT`` to a conversation holding n assistant messages; counts every request.

    ``hold_at``: the request of that number (async) waits until its task is cancelled, answering nothing.
    """

    def __init__(self, hold_at: int | None = None) -> None:
        self.asked = 0
        self.hold_at = hold_at
        self.entered = threading.Event()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema], output: Any = None) -> ModelResponse:
        self.asked += 1
        return SCRIPT[sum(1 for m in messages if m.role == "assistant")]

    async def acomplete(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: Any = None
    ) -> ModelResponse:
        self.asked += 1
        if self.asked == self.hold_at:
            self.entered.set()
            await asyncio.Event().wait()  # cut here by the test's task.cancel()
        return SCRIPT[sum(1 for m in messages if m.role == "assistant")]


class Tool:
    """``lookup(x)``, counting its runs by call id.

    ``hold``: the first run of that call blocks (on a worker) until ``gate``
    is set, telling ``entered`` first; ``cancel``: the first run of ``c1``
    cancels that token, then returns.
    """

    def __init__(self, hold: str | None = None, cancel: CancelToken | None = None) -> None:
        self.ran: Counter[str] = Counter()
        self.hold = hold
        self.cancel = cancel
        self.entered = threading.Event()
        self.gate = threading.Event()

    def registry(self) -> ToolRegistry:
        registry = ToolRegistry()

        @registry.register
        def lookup(x: int, ctx: RunContext[None]) -> str:
            """Look a number up."""
            call_id = str(ctx.call_id)
            self.ran[call_id] += 1
            first = self.ran[call_id] == 1
            if call_id == self.hold and first:
                self.entered.set()
                self.gate.wait(WAIT)  # the run is cut meanwhile (its deadline, its task): this result reaches nobody
            if call_id == "c1" and first and self.cancel is not None:
                self.cancel.cancel("cancelled by the test")
            return f"found {x}"

        return registry


def agent(model: Model, tool: Tool, timeout: float | None = None) -> Agent:
    """The source's (and a fork's) agent: stops return their result rather than raise."""
    return Agent(model, tool.registry(), timeout=timeout, on_stop={"timeout": "return", "cancelled": "return"})


def make() -> Agent:
    """For ``--agent support.fork_past_cuts:make``: a fresh counting agent, its counters in ``CLI``."""
    CLI[:] = [Model(), Tool()]
    return agent(CLI[0], CLI[1])


CLI: list[Any] = []
"""The model and tool of the last agent ``make()`` built (the command line builds its own)."""


def cut_source(how: str, store: Any) -> tuple[dict[str, Any], RunResult, Model, Tool]:
    """The source ``src`` cut as ``how`` says, then resumed to its end (a task cut one resumed on the sync driver
    after a tool call was cut, on the async after a model call was): its snapshot at the cut, its result, model, tool.
    """
    driver = how.rsplit("-", 1)[1]
    if how.startswith("timeout"):
        model, tool = Model(), Tool(hold="c1")
        source = agent(model, tool, timeout=DEADLINE)
        if driver == "sync":
            source.run("find 1, 2 and 3", store=store, run_id="src")
        else:
            asyncio.run(source.arun("find 1, 2 and 3", store=store, run_id="src"))
        tool.gate.set()  # the abandoned c1 returns to nobody
        again = {"timeout": LIFTED}
    elif how.startswith("token"):
        token = CancelToken()
        model, tool = Model(), Tool(cancel=token)
        source = agent(model, tool)
        if driver == "sync":
            source.run("find 1, 2 and 3", store=store, run_id="src", cancel=token)
        else:
            asyncio.run(source.arun("find 1, 2 and 3", store=store, run_id="src", cancel=token))
        again = {"cancel": CancelToken()}
    else:
        model, tool = (Model(), Tool(hold="c1")) if how == "task-cut-tool" else (Model(hold_at=2), Tool())
        source = agent(model, tool)
        entered = tool.entered if how == "task-cut-tool" else model.entered
        asyncio.run(_task_cut(source, store, entered, tool.gate))
        again = {"cancel": CancelToken()}
    cut = store.load("src")
    if driver == "sync" or how == "task-cut-tool":
        last = source.resume(store.load("src"), store=store, **again).finish()
    else:
        last = asyncio.run(_aresumed(source, store, again))
    return cut, last, model, tool


async def _task_cut(source: Agent, store: Any, entered: threading.Event, gate: threading.Event) -> None:
    """The source started and its task cancelled once ``entered`` is set, then ``gate`` let go (its result lost)."""
    task = asyncio.create_task(source.arun("find 1, 2 and 3", store=store, run_id="src"))
    assert await asyncio.to_thread(entered.wait, WAIT)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        gate.set()  # the cut tool call returns to nobody (before the loop ends: it waits for its worker threads)
        return
    msg = "the source's task ended without being cut"
    raise AssertionError(msg)


async def _aresumed(source: Agent, store: Any, again: dict[str, Any]) -> RunResult:
    return await (await source.aresume(store.load("src"), store=store, **again)).afinish()


def after_the_cut(trace: Sequence[Transition]) -> int:
    """The transition where ``c2``'s result came in: after every cut of every source, and after its resume."""
    back = [
        i for i, t in enumerate(trace) if (t.source, t.dest, t.trigger) == ("ExecuteTool", "AwaitModel", "tool_done")
    ]
    return back[-2]
