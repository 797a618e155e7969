"""What the store conformance checks share: leases to wait out, a scripted agent, snapshots and entries, a race.

Kept apart from the checks (``store_writes``, ``store_owners``) so each
module holds one thing; ``fsm_agent.testing.stores`` puts them together.
Importing it imports pytest.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from fsm_agent import Agent, Message, ModelResponse
from fsm_agent.persist.summary import Entry, Summary
from fsm_agent.testing import ManualClock, demo_registry, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

MakeStore = Callable[[float], Any]
"""``make_store(lease)``: a store on this test's fresh, empty location, leasing runs for ``lease`` seconds."""

LoseEntry = Callable[[str, int], None]
"""``lose_entry(run_id, seq)``: delete one journal entry behind the store's back, as a damaged database would."""

ReopenStore = Callable[[float], Any]
"""``reopen_store(lease)``: one more store object on the location ``make_store`` opened in this test.

As another process would open it: two such objects share the runs, and
nothing but the store's own transactions keeps their owners apart.
"""

LONG = 60.0
"""A lease no test outlives, however loaded the machine: a run leased for it is held for the whole test."""

SHORT = 0.3
"""A lease a test waits out (it sleeps ``LAPSE``) to see a run whose owner went quiet taken over."""

LAPSE = 3 * SHORT
"""How long a test waits for a ``SHORT`` lease to lapse: past it for sure, on a machine however loaded."""

RACERS = 8
"""Threads that race for one run at the same moment."""

START = 0.01
"""Seconds from the moment every racer is ready to the moment they all start: time for each to fall asleep."""

ROUNDS = 50
"""Races between store objects of their own in one check: two owners winning one race shows only in some rounds."""

TRIES = 3
"""Tries of a check that a stalled machine can leave undecided (a whole lease between two writes) before it skips."""

BAD_SNAPSHOTS: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], str]] = {
    "steps not objects": (
        lambda s: {**s, "steps": [1, 2]},
        "snapshot field steps must be a list of objects, got \\[1, 2\\]",
    ),
    "a bogus step": (lambda s: {**s, "steps": [{"bogus": 1}]}, "snapshot field steps\\[0\\] is malformed"),
    "a bogus message": (lambda s: {**s, "messages": [{"bogus": 1}]}, "snapshot field messages\\[0\\] is malformed"),
    "trace not objects": (lambda s: {**s, "trace": [1, 2]}, "snapshot field trace must be a list of objects"),
    "a bogus trace entry": (lambda s: {**s, "trace": [{"bogus": 1}]}, "snapshot field trace\\[0\\] is malformed"),
    "state Bogus": (lambda s: {**s, "state": "Bogus"}, "snapshot state 'Bogus' is not a state"),
    "negative tokens": (
        lambda s: {**s, "counters": {**s["counters"], "input_tokens": -5}},
        "counters.input_tokens must be a whole number >= 0, got -5",
    ),
    "evidence a list": (lambda s: {**s, "evidence": [["a", 1]]}, "snapshot field evidence must be an object"),
    "run_id a number": (lambda s: {**s, "run_id": 7}, "snapshot field run_id must be a string or null, got 7"),
}
"""Snapshots a store's ``save`` must refuse (``SnapshotError`` matching the text), each made from a good one."""


class Script:
    """A stateless scripted model: its reply is the one after as many as the conversation already holds.

    So any agent, in any process, resumes a stored run of it where it stopped.
    """

    def __init__(self, *responses: ModelResponse) -> None:
        self.responses = responses

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """The reply after those already given."""
        return self.responses[sum(1 for m in messages if m.role == "assistant")]


def adding_agent(calls: int = 2, **options: Any) -> Agent:
    """An agent that adds ``calls`` times (calls ``c0``, ``c1``, ...) and then answers ``"added"``."""
    turns = [tool_turn(tool_call("add", id=f"c{i}", a=i, b=1)) for i in range(calls)]
    return Agent(Script(*turns, reply("added")), demo_registry(), clock=ManualClock(), **options)


def plain(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as it reads back from JSON (tuples become lists), as a store gives a snapshot back."""
    return json.loads(json.dumps(value))  # type: ignore[no-any-return]


def fresh_snapshot(run_id: str, text: str = "go") -> dict[str, Any]:
    """The whole snapshot of a run just started (nothing called yet), as a store is given one to create."""
    return plain(adding_agent().start(text, run_id=run_id).snapshot())


def entry(run_id: str, seq: int, base: dict[str, Any], mark: object = None, *, release: bool = False) -> Entry:
    """A journal entry for version ``seq`` that sets the run's ``evidence`` to ``{"mark": mark}`` and adds nothing."""
    text = json.dumps({"add": {}, "set": {"evidence": {"mark": mark}}})
    return Entry(run_id, seq, text, Summary.of(base), release)


def race(attempts: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run each attempt in a thread of its own, all let go at the same moment; what each returned or raised.

    Once every thread is ready (a barrier), each sleeps until one moment a
    little later: the clock wakes them together, where a barrier alone
    would let its last thread run ahead while it wakes the others.
    """
    go = [0.0]

    def at_once() -> None:
        go[0] = time.monotonic() + START

    start = threading.Barrier(len(attempts), action=at_once)
    outcomes: list[Any] = [None] * len(attempts)

    def attempt(i: int) -> None:
        start.wait()
        time.sleep(max(0.0, go[0] - time.monotonic()))
        try:
            outcomes[i] = attempts[i]()
        except Exception as exc:  # noqa: BLE001 - every refusal is an outcome the test then checks
            outcomes[i] = exc

    threads = [threading.Thread(target=attempt, args=(i,), name=f"racer {i}") for i in range(len(attempts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return outcomes


def need(store: object, method: str) -> None:
    """Skip the check, naming ``method``, unless ``store`` has it (a ``FullStore`` method the engine does without)."""
    if not callable(getattr(store, method, None)):
        pytest.skip(f"{type(store).__name__} has no {method}() (a FullStore method; the engine does without it)")


def need_twin(store: object, method: str) -> None:
    """Skip the check, naming the twin, unless ``store`` has the async twin of ``method`` (each twin is optional)."""
    if not has_twin(store, method):
        pytest.skip(f"{type(store).__name__} has no a{method}() (an async twin, each optional on its own)")


def has_twin(store: object, name: str) -> bool:
    """Whether ``store`` has the async twin of ``name`` (``a`` + name)."""
    return callable(getattr(store, f"a{name}", None))


async def closed(store: object) -> None:
    """Close what the store opened on this event loop (``aclose``), where it has that, before the loop ends."""
    aclose = getattr(store, "aclose", None)
    if aclose is not None:
        await aclose()


def without_version(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` without the stored version a loaded one carries."""
    return {k: v for k, v in snapshot.items() if k != "stored_seq"}
