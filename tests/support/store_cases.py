"""What the store tests share: a long scripted run any process can resume, and a look inside a store's tables."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sqlite3
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry, Usage
from fsm_agent.persist import is_url, open_store
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Ticks:
    """K tool turns of ``tick``, then an answer; the reply depends only on the conversation, so it resumes anywhere."""

    def __init__(self, k: int, text: str = "tick") -> None:
        self.k = k
        self.text = text

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        given = sum(1 for m in messages if m.role == "assistant")
        if given < self.k:
            return tool_turn(tool_call("tick", id=f"t{given}", n=given), content=self.text, usage=Usage(3, 2))
        return reply(f"{self.text}: done after {given}", usage=Usage(3, 2))


def tick_registry(counter: str | None = None) -> ToolRegistry:
    """A registry with ``tick(n)``; with ``counter``, every call that ran appends its call id to that file."""
    registry = ToolRegistry()

    def tick(n: int, call_id: str) -> dict[str, int]:
        """Count one call."""
        if counter is not None:
            with Path(counter).open("a", encoding="utf-8") as file:
                file.write(call_id + "\n")
        return {"n": n}

    registry.register(tick)
    return registry


def tick_agent(k: int, counter: str | None = None, text: str = "tick", **options: Any) -> Agent:
    """An agent for ``Ticks(k)`` with room for all its turns."""
    options.setdefault("max_steps", k + 1)
    return Agent(Ticks(k, text), tick_registry(counter), clock=ManualClock(), **options)


def journal(target: str, run_id: str) -> list[dict[str, Any]]:
    """The run's journal entries, read straight from the store's tables."""
    if is_url(target):
        import psycopg

        with psycopg.connect(target) as conn:
            rows = conn.execute("SELECT entry FROM fsm_agent_journal WHERE run_id = %s ORDER BY seq", (run_id,))
            texts = [text for (text,) in rows.fetchall()]
    else:
        with contextlib.closing(sqlite3.connect(target)) as db:
            texts = [t for (t,) in db.execute("SELECT entry FROM journal WHERE run_id = ? ORDER BY seq", (run_id,))]
    return [json.loads(text) for text in texts]


LONE = "half an emoji \ud83d and a lone low \udc00"
"""Text with lone surrogates, as providers do send it."""


def as_json(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(snapshot))  # type: ignore[no-any-return]


def dying_store(target: str, lease: float, kill_at: int, every: str = "call") -> Any:
    """A store at ``target`` whose process dies (``os._exit(9)``: no cleanup, no lease let go) right after its
    ``kill_at``-th checkpoint."""
    store: Any = open_store(target, lease=lease, every=every)
    real_append = store.append
    written = [0]

    def append(entry: Any, *, owner: str) -> None:
        real_append(entry, owner=owner)
        written[0] += 1
        if written[0] == kill_at:
            os._exit(9)

    store.append = append
    return store


def durable_calls(snapshot: dict[str, Any]) -> set[str]:
    """The tool calls whose outcome a stored snapshot holds: answered in its messages, or kept by id in ``ran``."""
    answered = {m["tool_call_id"] for m in snapshot["messages"] if m.get("role") == "tool" and m.get("tool_call_id")}
    return answered | set(snapshot.get("ran", {}))


CHILDREN = multiprocessing.get_context("forkserver")
"""How the tests start a process they kill, race or resume in: each child is forked from a server process that
started once, from nothing, and imported only what ``PRELOAD`` names.  So a child shares nothing with the test that
started it (no thread, no open store, no connection, no lease), as a spawned one would, without starting and
importing an interpreter of its own (0.3 s a child here, a few hundred children a suite).  The child runs
``prepare`` as a spawned one does (the parent's ``sys.path``, working directory and main module) and, by
``child_process``, in the parent's environment of that moment."""
PRELOAD = ["fsm_agent", "fsm_agent.persist", "fsm_agent.testing", "fsm_agent.batch", "psycopg", "support.store_cases"]
"""What the server imports before it forks a child (a module not installed is left out)."""
CHILDREN.set_forkserver_preload(PRELOAD)


def _in_environment(environment: dict[str, str], target: Callable[..., object], *args: Any) -> None:
    os.environ.clear()
    os.environ.update(environment)
    target(*args)


def child_process(target: Callable[..., object], *args: Any) -> BaseProcess:
    """A process (not started) that runs ``target(*args)``, in this process's environment (``CHILDREN``)."""
    return CHILDREN.Process(target=_in_environment, args=(dict(os.environ), target, *args))


def in_child(target: Any, *args: Any) -> int | None:
    """Run ``target(*args)`` in a new process (``child_process``) and return its exit code."""
    process = child_process(target, *args)
    process.start()
    process.join(120)
    return process.exitcode
