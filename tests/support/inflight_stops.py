"""What the tests of stops landing while calls are in flight share: a counted batch, a call held in flight, owners.

The model (``support.exactly_once.ByHistory``) asks, in one reply, for
``work(label)`` once per label, then answers with every tool result it got
back, so any agent built here continues a run another one started.  Each
``work`` call counts its try and its side effect (``Effects``).  A ``Hold``
keeps the first try of one label in flight, after the labels it waits for
are done: an async tool waits there until its task is cancelled (by the
run's deadline, or the test); a sync one until the test releases it, with
or without its side effect (an abandoned call that never completes, or one
that completes after the run stopped without it).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.testing import tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.exactly_once import WAIT, ByHistory, Effects

DEADLINE = 1.0
"""A run's ``timeout`` (real seconds) when a held call must be cut by it: the other calls of the batch are trivial
and start at once, so they finish far inside it even beside a CPU hog; only the held call is still in flight.
From the ``Hold``'s making to the held call in flight, its siblings done: at most 0.12 s in 92 tests of
test_exactly_once_stops.py and test_exactly_once_stop_policies.py under ``.ci/under-load`` (two CPU hogs on two
cores, other work running; 0.02 s in half of them), so 1 s leaves eight times the worst seen."""


class Hold:
    """Holds the first try of ``at`` in flight once every label of ``after`` is done; ``then()`` runs once there.

    ``in_flight`` is set when the call is held.  An async call waits until it
    is cancelled; a sync one until ``release(complete)``: with
    ``complete`` it goes on to its side effect, else it returns without one.
    With ``stay`` false the call is not held after ``then()``: it goes on.
    """

    def __init__(
        self,
        effects: Effects,
        at: str,
        after: Iterable[str] = (),
        then: Callable[[], None] | None = None,
        *,
        stay: bool = True,
    ) -> None:
        self.effects, self.at, self.after, self.then, self.stay = effects, at, tuple(after), then, stay
        self.armed = True
        self.in_flight = threading.Event()
        self._released = threading.Event()
        self._complete = False

    def _arms(self, label: str) -> bool:
        with self.effects.lock:
            if not self.armed or label != self.at:
                return False
            self.armed = False
            return True

    def _siblings_done(self) -> bool:
        with self.effects.lock:
            return all(self.effects.done[label] >= 1 for label in self.after)

    def _held(self) -> None:
        self.in_flight.set()
        if self.then is not None:
            self.then()

    async def ahold(self, label: str) -> None:
        """In an async tool: held for ever (until cancelled) if this is the armed label's first try."""
        if not self._arms(label):
            return
        deadline = time.monotonic() + WAIT
        while not self._siblings_done():
            assert time.monotonic() < deadline, "the siblings never finished"
            await asyncio.sleep(0.01)
        self._held()
        if self.stay:
            await asyncio.Event().wait()  # nobody sets it: only a cancel ends the wait

    def hold(self, label: str) -> bool:
        """In a sync tool: held until released if this is the armed label's first try; whether to do the effect."""
        if not self._arms(label):
            return True
        deadline = time.monotonic() + WAIT
        while not self._siblings_done():
            assert time.monotonic() < deadline, "the siblings never finished"
            time.sleep(0.01)
        self._held()
        if not self.stay:
            return True
        assert self._released.wait(WAIT), "the held call was never released"
        return self._complete

    def release(self, *, complete: bool) -> None:
        """Let a held sync call go on: to its side effect (``complete``), or to a return without one."""
        self._complete = complete
        self._released.set()


def registry(effects: Effects, hold: Hold | None = None) -> ToolRegistry:
    """``work(label)`` (async) and ``swork(label)`` (sync), each counting its tries and side effects in ``effects``."""
    tools = ToolRegistry()

    async def work(label: str) -> str:
        """Do one piece of work (async)."""
        with effects.lock:
            effects.tries[label] += 1
        if hold is not None:
            await hold.ahold(label)
        effects.add(label)
        return f"{label} ok"

    def swork(label: str) -> str:
        """Do one piece of work (sync)."""
        with effects.lock:
            effects.tries[label] += 1
        if hold is not None and not hold.hold(label):
            return f"{label} abandoned"  # released without its side effect: the run already stopped without it
        effects.add(label)
        return f"{label} ok"

    tools.register(work)
    tools.register(swork)
    return tools


def batch(labels: Sequence[str], tool: str = "work") -> ModelResponse:
    """One reply asking for ``tool(label)`` once per label, each call's id its label."""
    return tool_turn(*(tool_call(tool, id=label, label=label) for label in labels))


def answer(labels: Iterable[str]) -> str:
    """The model's answer once every label's call came back."""
    return "done: " + ", ".join(f'"{label} ok"' for label in sorted(labels))


class FailsOnce(ByHistory):
    """``ByHistory`` whose first call after a tool result raises (counted as a call): a ``model_error`` there."""

    def __init__(self, first: ModelResponse, effects: Effects) -> None:
        super().__init__(first, "done", effects, "parent_model")
        self.armed = True

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        response = super().complete(messages, tools)
        if self.armed and any(m.role == "tool" for m in messages):
            self.armed = False
            raise ConnectionError("the provider went away")
        return response


def make_agent(
    effects: Effects,
    labels: Sequence[str],
    hold: Hold | None = None,
    *,
    tool: str = "work",
    model: Any = None,
    **options: Any,
) -> Agent:
    """An agent whose first reply is the batch ``labels`` of ``tool``; its answer names every result."""
    first = batch(labels, tool)
    chosen = model if model is not None else ByHistory(first, "done", effects, "parent_model")
    options.setdefault("max_concurrency", len(labels))
    return Agent(chosen, registry(effects, hold), **options)
