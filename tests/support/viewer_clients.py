"""Several clients of one served run viewer at once: a barrier releases them, httpx sends, every answer is kept.

The viewer is served by uvicorn on a loopback port (``support.ui_runs.Viewer``)
over a real store; ``served`` also collects what the server logged at
warning or above, so a test can say that nothing failed inside it.  A run
advanced by another process (``advance``, a ``spawn`` target) writes each
model and tool call it makes to a file, one line each, so the test counts
them after the process is gone; it waits for the test at its first model
call and again half-way, and before each turn for one more answer to the
readers, so the readers are known to read while it writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.app_owners import JOIN, at_once
from support.ui_runs import Viewer

TURNS = 24
"""Tool turns of the run another process advances; the model waits for the test at turn ``TURNS // 2``."""


class Logged(logging.Handler):
    """Every record at warning or above that the server's loggers (uvicorn, Starlette, the viewer) emitted."""

    NAMES = ("uvicorn", "uvicorn.error", "uvicorn.access", "starlette", "fsm_agent")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))


@contextlib.contextmanager
def served(
    target: str, *, wrap: Callable[[Any], Any] | None = None, **options: Any
) -> Iterator[tuple[Any, Viewer, Logged]]:
    """The store at ``target``, a viewer over it built with ``options``, and what the server logged meanwhile.

    With ``wrap``, the viewer is served over ``wrap(store)`` (a store that holds
    some of its answers, ``support.held_viewer_store``); the test is handed the
    store itself.
    """
    logged = Logged()
    loggers = [logging.getLogger(name) for name in Logged.NAMES]
    for logger in loggers:
        logger.addHandler(logged)
    try:
        with open_store(target) as store:
            viewer = Viewer(store if wrap is None else wrap(store), **options)
            try:
                yield store, viewer, logged
            finally:
                viewer.close()
    finally:
        for logger in loggers:
            logger.removeHandler(logged)


def post(url: str, path: str, run_id: str, body: Any, *, raw: bytes | None = None) -> tuple[int, Any]:
    """POST ``body`` as JSON (or ``raw`` bytes as JSON's content type) to the viewer, as its page does."""
    content = raw if raw is not None else json.dumps(body).encode()
    with httpx.Client(base_url=url, timeout=JOIN) as http:
        response = http.post(path, params={"id": run_id}, content=content, headers={"content-type": "application/json"})
    return response.status_code, response.json()


def decide_all(url: str, run_id: str, bodies: Sequence[dict[str, Any]]) -> list[tuple[int, Any]]:
    """Each decision of ``bodies`` posted by a client of its own, all released at once by one barrier."""
    answers = at_once(*(lambda body=body: post(url, "/api/decide", run_id, body) for body in bodies))
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return answers


def get(url: str, path: str, **params: str) -> tuple[int, Any]:
    """GET ``path`` of the viewer: the status and the JSON answer."""
    with httpx.Client(base_url=url, timeout=JOIN) as http:
        response = http.get(path, params=params)
    return response.status_code, response.json()


def follow(url: str, run_id: str, seen: Callable[[dict[str, Any]], None]) -> list[str]:
    """Read ``/api/events`` for ``run_id`` to its end, handing each page to ``seen``; the events' names, in order."""
    names: list[str] = []
    with (
        httpx.Client(base_url=url, timeout=JOIN) as http,
        http.stream("GET", "/api/events", params={"id": run_id}) as r,
    ):
        assert r.status_code == 200, r.read()
        event = "message"
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                names.append(event)
                if event == "message":
                    seen(json.loads(line.removeprefix("data: ")))
                if event != "message":
                    break
                event = "message"
    return names


class Shown:
    """The pages a follower was shown (``follow``'s ``seen``), in order, and a wait for one that shows something.

    Why: the tab that decides may hear back after the follower was already
    shown its decision (the stream reads the store on its own clock; the
    answer to the POST is built after the write and, on a busy machine, comes
    late).  Counting the pages once the answer came and waiting for one more
    then waits for a page that came already, and the test sat out its whole
    deadline; waiting for a page that *shows* the decision holds in either order.
    """

    def __init__(self) -> None:
        self.pages: list[dict[str, Any]] = []
        self._changed = threading.Condition()

    def __call__(self, page: dict[str, Any]) -> None:
        with self._changed:
            self.pages.append(page)
            self._changed.notify_all()

    def wait_for(self, showing: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The first page shown (or to be shown, within ``JOIN``) for which ``showing`` holds; fails naming ``what``."""

        def first() -> dict[str, Any] | None:
            return next((page for page in self.pages if showing(page)), None)

        with self._changed:
            assert self._changed.wait_for(lambda: first() is not None, JOIN), (what, self.pages)
            found = first()
        assert found is not None
        return found


def consistent(page: dict[str, Any]) -> None:
    """One run page read at one version: its counters, timeline and messages agree (``advance``'s run)."""
    roles = Counter(m["role"] for m in page["messages"])
    assert page["steps"] == roles["assistant"], page["version"]
    assert page["tool_calls"] == roles["tool"], page["version"]
    assert roles["tool"] in (roles["assistant"], roles["assistant"] - 1), page["version"]
    if page["moments"]:  # none yet in the version stored as the run started
        assert page["moments"][-1]["counters"] == page["counters"], page["version"]
    assert page["counters"]["steps"][0] == page["steps"], page["version"]
    assert page["counters"]["tool_calls"][0] == page["tool_calls"], page["version"]


class Stepping:
    """``TURNS`` turns of one ``tick`` call each, then an answer; waits on the test's events, logs each call.

    Before each turn it also waits until the readers have been answered once
    more since the turn before (``reads``, a count they share), so their
    reads fall all along the run, however fast this machine writes it.
    """

    def __init__(self, log: Path, started: Any, midway: Any, go_on: Any, reads: Any) -> None:
        self.log, self.started, self.midway, self.go_on, self.reads = log, started, midway, go_on, reads
        self.read_before = 0

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        done = sum(1 for m in messages if m.role == "tool")
        with self.log.open("a", encoding="utf-8") as file:
            file.write(f"model {done}\n")
        if done == 0:
            self.started.set()
        deadline = time.monotonic() + JOIN
        while self.reads.value <= self.read_before and time.monotonic() < deadline:
            time.sleep(0.001)
        self.read_before = self.reads.value
        if done == TURNS // 2:
            self.midway.set()
            assert self.go_on.wait(JOIN), "the test never let the run go on"
        if done < TURNS:
            return tool_turn(tool_call("tick", id=f"tick_{done}", n=done))
        return reply(f"ticked {done} times")


def advance(target: str, run_id: str, log: str, started: Any, midway: Any, go_on: Any, reads: Any) -> None:
    """In a process of its own: run the ticking agent as ``run_id`` in the store at ``target``, every call logged."""
    path = Path(log)
    registry = ToolRegistry()

    def tick(n: int, call_id: str) -> int:
        """Tick once."""
        with path.open("a", encoding="utf-8") as file:
            file.write(f"tool {call_id}\n")
        return n + 1

    registry.register(tick)
    with open_store(target, every="transition") as store:
        result = Agent(Stepping(path, started, midway, go_on, reads), registry, max_steps=TURNS + 1).run(
            "tick", store=store, run_id=run_id
        )
    assert result.reason == "done", result.reason


def calls_of(log: Path) -> Counter[str]:
    """What ``advance`` logged: ``model N`` once per model call, ``tool tick_N`` once per execution."""
    return Counter(log.read_text(encoding="utf-8").splitlines())


class CountedModel:
    """A model that counts its calls (under a lock: forks call it from threads of their own) and asks another."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.calls = 0
        self._lock = threading.Lock()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self._lock:
            self.calls += 1
        return self.model.complete(messages, tools)  # type: ignore[no-any-return]
