"""What the exactly-once combination tests share: a parallel batch whose every side effect is counted, and a cut.

The parent's model asks, in one reply, for ``work`` twice, the ``research``
sub-agent (whose own model asks for one ``work`` call) and ``finish_up``; then
answers with every tool result it got back.  Each model answers by the
conversation it is sent, so any agent built here continues a run another
one started.  ``finish_up`` can be armed to *cut* the run: it waits until
every sibling's outcome is durable in the store (so the test knows exactly
which calls completed), then raises ``KeyboardInterrupt`` (an in-process cut,
as a Ctrl-C in the middle of a batch), once.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from fsm_agent import Agent, AgentRun, Message, ModelResponse, RunLeasedError, RunResult, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.store_cases import durable_calls

T = TypeVar("T")

LEASE = 0.5
"""A cut owner's lease: short, so a new owner takes the run over soon; a live owner's heartbeat keeps it."""
WAIT = 60.0
"""How long anything here waits for a store or a lease; measured well under 2 s on a loaded machine."""


class Effects:
    """Side effects by label, counted across threads (``done``); ``tries`` counts every call made, cut or not."""

    def __init__(self) -> None:
        self.done: Counter[str] = Counter()
        self.tries: Counter[str] = Counter()
        self.parent_model = 0
        self.child_model = 0
        self.lock = threading.Lock()

    def add(self, label: str) -> None:
        with self.lock:
            self.done[label] += 1


class Cut:
    """Arms the call with label ``at`` to be cut once, after ``ready()`` holds (e.g. a sibling's outcome is durable),
    before its side effect; ``z`` is ``finish_up``, ``sub.w`` the sub-agent's own call.  ``how``: ``"ctrl_c"``
    raises ``KeyboardInterrupt``, ``"kill"`` ends the process at once (``os._exit(9)``: no cleanup, no lease given
    up), ``"error"`` raises ``ConnectionError`` (in a model call: a ``model_error`` stop)."""

    def __init__(self, ready: Callable[[], bool] | None = None, at: str = "z", *, how: str = "ctrl_c") -> None:
        self.armed = True
        self.ready = ready
        self.at = at
        self.how = how

    def fire(self, label: str) -> None:
        if not self.armed or label != self.at:
            return
        self.armed = False
        deadline = time.monotonic() + WAIT
        while self.ready is not None and not self.ready():
            assert time.monotonic() < deadline, "the outcomes the cut waits for never reached the store"
            time.sleep(0.02)
        if self.how == "kill":
            os._exit(9)
        if self.how == "error":
            raise ConnectionError("the provider went away")
        raise KeyboardInterrupt


class ByHistory:
    """A model whose reply depends only on the history: the scripted turn first, then an answer naming the results."""

    def __init__(self, first: ModelResponse, answer: str, effects: Effects, attribute: str) -> None:
        self.first, self.answer, self.effects, self.attribute = first, answer, effects, attribute

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.effects.lock:
            setattr(self.effects, self.attribute, getattr(self.effects, self.attribute) + 1)
        results = [m.content for m in messages if m.role == "tool"]
        if not any(m.role == "assistant" for m in messages):
            return self.first
        return reply(f"{self.answer}: " + ", ".join(sorted(results)))


BATCH = ("a", "b", "sub", "z")
"""The call ids of the parent's one batch: two ``work`` calls, the sub-agent, and ``finish_up`` (the cut one)."""
SIBLINGS = ("a", "b", "sub")
"""The calls that complete before the cut."""
SIDE_EFFECTS = {"a": 1, "b": 1, "sub.w": 1, "z": 1}
"""Each side effect of a finished run made exactly once: the parent's tools and the sub-agent's own tool."""
FINAL = 'done: "a ok", "b ok", "child: \\"sub.w ok\\"", "z ok"'
"""The parent's answer once every call of the batch came back."""


def registry(effects: Effects, cut: Cut | None) -> ToolRegistry:
    """``work(label)`` and ``finish_up()``, each counting its side effect in ``effects``."""
    tools = ToolRegistry()

    def work(label: str) -> str:
        """Do one piece of work: cut here once when armed for this label, before the side effect."""
        with effects.lock:
            effects.tries[label] += 1
        if cut is not None:
            cut.fire(label)
        effects.add(label)
        return f"{label} ok"

    def finish_up() -> str:
        """Wrap up: cut here once when armed, before the side effect."""
        with effects.lock:
            effects.tries["z"] += 1
        if cut is not None:
            cut.fire("z")
        effects.add("z")
        return "z ok"

    tools.register(work)
    tools.register(finish_up)
    return tools


def batch_agent(
    effects: Effects, cut: Cut | None = None, *, approve: Iterable[str] | None = None, **options: Any
) -> Agent:
    """The parent agent whose first reply is the parallel batch ``BATCH`` (see the module)."""
    child_turn = tool_turn(tool_call("work", id="w", label="sub.w"))
    child = Agent(ByHistory(child_turn, "child", effects, "child_model"), registry(effects, cut))
    tools = registry(effects, cut)
    tools.register(child.as_tool("research", "A helper agent."))
    first = tool_turn(
        tool_call("work", id="a", label="a"),
        tool_call("work", id="b", label="b"),
        tool_call("research", id="sub", input="help"),
        tool_call("finish_up", id="z"),
    )
    model = ByHistory(first, "done", effects, "parent_model")
    rule = set(approve) if approve is not None else None
    return Agent(model, tools, approve=rule, max_steps=4, max_concurrency=4, **options)


def durable_in(target: str, run_id: str, calls: Iterable[str]) -> Callable[[], bool]:
    """A check that ``calls``' outcomes are in the stored run ``run_id`` (read through a store of its own)."""
    wanted = set(calls)

    def ready() -> bool:
        with open_store(target) as store:
            return wanted <= durable_calls(store.load(run_id))

    return ready


def taken_over(claim: Callable[[], T]) -> T:
    """``claim()`` (a resume from the store) once the cut owner's lease lapsed: retried while it is leased."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return claim()
        except RunLeasedError:
            assert time.monotonic() < deadline, "the cut owner's lease never lapsed"
            time.sleep(0.05)


async def ataken_over(claim: Callable[[], Awaitable[T]]) -> T:
    """``taken_over`` awaited: ``await claim()`` retried while the run is leased."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return await claim()
        except RunLeasedError:
            assert time.monotonic() < deadline, "the cut owner's lease never lapsed"
            await asyncio.sleep(0.05)


def resumed_by_new_owner(target: str, run_id: str, driver: str, agent: Agent, **options: Any) -> RunResult:
    """A new owner (``agent``, a new store object) takes the stored run over on ``driver`` and finishes it."""
    store = open_store(target, lease=LEASE)
    try:
        if driver == "sync":
            run = taken_over(lambda: agent.resume(store.load(run_id), store=store, **options))
            return run.finish()

        async def go() -> RunResult:
            async def claim() -> AgentRun:
                return await agent.aresume(await store.aload(run_id), store=store, **options)

            return await (await ataken_over(claim)).afinish()

        return asyncio.run(go())
    finally:
        store.close()


def cut_by_interrupt(target: str, run_id: str, driver: str, agent: Agent, question: str = "q") -> None:
    """``agent``'s run ``run_id`` on ``driver``, cut by the ``KeyboardInterrupt`` one of its parts raises.

    The owner that cut it is gone once this returns (its store object
    closed); ``resumed_by_new_owner`` takes the run over.
    """
    store = open_store(target, lease=LEASE)
    try:
        if driver == "sync":
            agent.run(question, store=store, run_id=run_id)
        else:
            asyncio.run(agent.arun(question, store=store, run_id=run_id))
    except KeyboardInterrupt:
        return
    finally:
        store.close()
    msg = f"run {run_id!r} on {driver} ended without the KeyboardInterrupt that was to cut it"
    raise AssertionError(msg)
