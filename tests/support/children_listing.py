"""A parent run with several sub-agent runs, one of them held in flight, and a store counting the viewer's reads.

``Family``: the ``boss`` run calls its sub-agent ``helper`` ``done`` times in
its first turn (calls ``h0``, ``h1``, ...), each helper run calling ``note``
once, then once more (call ``hN``) in its second turn, whose helper's
``note`` waits on ``release``: while it waits, the boss's stored record has
that call pending and the child's run is stored, not named by any step yet
(in flight).  Every ``note`` counts its call by the text it was given (each
helper's own), every model counts its calls.

``Counted`` wraps a store: each ``load`` by run id, each ``list_runs`` with
the filters it was given; ``stop_after`` sets an event once a run was loaded
so many times (a stream's ``stopping``, so a test counts whole polls).
``LinksFromSnapshots`` lists a run's children from their snapshots: the oracle.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs

from fsm_agent import Agent, Message, ModelResponse, SnapshotError, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.app_owners import JOIN

BOSS = "boss"


class Counted:
    """The store, counting each ``load`` by run id and each ``list_runs`` call with its filters (thread-safe)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.loads: Counter[str] = Counter()
        self.listings: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop: tuple[str, int, threading.Event] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def stop_after(self, run_id: str, loads: int, event: threading.Event) -> None:
        """Set ``event`` as ``run_id`` is loaded the ``loads``-th time from now."""
        with self._lock:
            self._stop = (run_id, self.loads[run_id] + loads, event)

    def load(self, run_id: str) -> dict[str, Any]:
        with self._lock:
            self.loads[run_id] += 1
            if self._stop is not None and self._stop[0] == run_id and self.loads[run_id] >= self._stop[1]:
                self._stop[2].set()
        data: dict[str, Any] = self.store.load(run_id)
        return data

    def list_runs(self, **filters: Any) -> Any:
        with self._lock:
            self.listings.append(filters)
        return self.store.list_runs(**filters)

    def reset(self) -> None:
        """Forget what was counted so far."""
        with self._lock:
            self.loads.clear()
            self.listings.clear()


class LinksFromSnapshots(Counted):
    """The oracle: a run's sub-agent runs found the old way, by loading every stored run and reading its link.

    Its ``list_runs(parent=...)`` trusts no column: each run the store lists
    is loaded, and kept if its snapshot names ``parent`` its parent run (one
    that cannot be loaded, corrupted, is not kept), with the link its
    snapshot holds.  A page built from it is the page the viewer showed
    when it loaded each child.
    """

    def list_runs(self, **filters: Any) -> Any:
        parent = filters.pop("parent", None)
        runs = super().list_runs(**filters)
        if parent is None:
            return runs
        found = []
        for run in runs:
            try:
                data = self.load(run.run_id)
            except SnapshotError:
                continue
            link = (data.get("parent_run_id"), data.get("parent_call_id"))
            if link[0] == parent:
                found.append(attrs.evolve(run, parent=link))
        return found


class Helper:
    """The sub-agent's model: asks for ``note`` with the text it was given, then answers; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self._lock:
            self.calls += 1
        if any(m.role == "tool" for m in messages):
            return reply("noted")
        text = next(m.content for m in messages if m.role == "user")
        return tool_turn(tool_call("note", id="n1", text=text))


class Family:
    """The ``boss`` run: ``done`` sub-agent calls in its first turn, then one held in flight until ``release``."""

    def __init__(self, done: int) -> None:
        self.done = done
        self.notes: Counter[str] = Counter()
        self.noting, self.release = threading.Event(), threading.Event()
        self.helper = Helper()
        first = tool_turn(*(tool_call("helper", id=f"h{i}", input=f"help {i}") for i in range(done)))
        self.held = f"h{done}"
        second = tool_turn(tool_call("helper", id=self.held, input="hold on"))
        self.boss_turns = [first, second, reply("all helped")]
        self.boss_calls = 0

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """The boss's model: its reply after those the conversation holds (so a fork goes on from it); counted."""
        self.boss_calls += 1
        return self.boss_turns[sum(1 for m in messages if m.role == "assistant")]

    def agent(self) -> Agent:
        """The boss, its one tool the ``helper`` sub-agent, whose one tool ``note`` counts and may wait."""
        family = self

        def note(text: str) -> str:
            """Note something."""
            family.notes[text] += 1
            if text == "hold on":
                family.noting.set()
                assert family.release.wait(JOIN), "the test never let the held note finish"
            return "noted"

        below = ToolRegistry()
        below.register(note)
        tools = ToolRegistry()
        tools.register(Agent(self.helper, below).as_tool("helper", "Helps."))
        return Agent(self, tools)

    def run(self, store: Any, driver: str) -> None:
        """Run the boss to its answer by ``driver`` (in the caller's thread)."""
        agent = self.agent()
        if driver == "sync":
            result = agent.run("get help", store=store, run_id=BOSS)
        else:
            result = asyncio.run(agent.arun("get help", store=store, run_id=BOSS))
        assert (result.reason, result.final) == ("done", "all helped"), result

    def children(self) -> list[str]:
        """Every sub-agent run of the boss, the one held in flight last."""
        return [f"{BOSS}/h{i}" for i in range(self.done + 1)]

    def counts(self) -> tuple[Counter[str], int, int]:
        """Each note's calls by text, the helper model's calls, the boss model's calls."""
        return self.notes, self.helper.calls, self.boss_calls
