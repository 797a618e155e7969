"""Agents for the batch tests: a stateless scripted model, tools that count (and can kill their worker), all importable.

Workers are processes (Ray's, or the batch command's), so every count is
kept outside them: one line appended to a file per model call and per
completed tool call.  A line under ``PIPE_BUF`` written with ``O_APPEND`` is
atomic, so concurrent workers never interleave.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry, Usage
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

MODEL_LOG = "model.log"
TOOL_LOG = "tools.log"


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def lines(path: Path) -> list[str]:
    """The lines of a count file, none if it was never written."""
    return path.read_text().splitlines() if path.exists() else []


def tag(user_input: str) -> str:
    """A short id for a question, used in its tool calls' ids."""
    return hashlib.sha256(user_input.encode()).hexdigest()[:10]


class Script:
    """Asks for ``rounds`` tool calls, one per turn, then answers; stateless, so any process can continue a run.

    A question starting with ``loop`` asks for the same call twice, so its run
    stops with ``repeated_action``.  Each call is one line in ``model.log``.
    """

    def __init__(self, ledger: Path, rounds: int, latency: float) -> None:
        self.ledger = ledger
        self.rounds = rounds
        self.latency = latency

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = next(m.content for m in messages if m.role == "user")
        turn = sum(1 for m in messages if m.role == "assistant")
        _append(self.ledger / MODEL_LOG, f"{tag(question)} {turn}")
        if self.latency:
            time.sleep(self.latency)
        if question.startswith("loop"):
            return tool_turn(tool_call("work", id=f"{tag(question)}-{turn}", step=0))
        if turn < self.rounds:
            return tool_turn(tool_call("work", id=f"{tag(question)}-{turn}", step=turn), usage=Usage(3, 2))
        return reply(f"answer to {question}", usage=Usage(3, 2))


def registry(ledger: Path, kill: frozenset[str], for_good: bool = False, always: bool = False) -> ToolRegistry:
    """``work``: records its call id once it completed; for a call id in ``kill``, ends the process the first time.

    ``for_good``: the Ray actor running the call is killed so that Ray never restarts it.  ``always``: the
    process is ended every time the call is made, not only the first.
    """
    tools = ToolRegistry()

    @tools.register
    def work(step: int, call_id: str) -> str:
        """Do one step of work."""
        if call_id in kill:
            marker = ledger / f"killed-{call_id}"
            if always or not marker.exists():
                with marker.open("a") as deaths:
                    deaths.write("x")
                if for_good:
                    import ray

                    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                    time.sleep(60)  # killed long before: the call never returns
                os._exit(1)  # the worker dies mid-run, with this call in flight
        _append(ledger / TOOL_LOG, call_id)
        return f"step {step} done"

    return tools


def scripted_agent(
    ledger: str,
    rounds: int = 3,
    kill: frozenset[str] = frozenset(),
    latency: float = 0.0,
    for_good: bool = False,
    always: bool = False,
) -> Agent:
    """The agent every batch test runs: the ``Script`` model and the ``work`` tool, counting into ``ledger``."""
    where = Path(ledger)
    # A clock that never moves: results compare equal whatever process, and however fast, ran them.
    tools = registry(where, kill, for_good, always)
    return Agent(Script(where, rounds, latency), tools, max_steps=rounds + 2, clock=ManualClock())


def factory(ledger: Path, **options: object) -> functools.partial[Agent]:
    """A picklable ``make_agent`` for ``run_batch``."""
    return functools.partial(scripted_agent, str(ledger), **options)  # type: ignore[arg-type]


class SlowToRestart:
    """A ``make_agent`` a restarted worker takes ``delay`` s to rebuild: a restart as slow as on a busy machine.

    Ray rebuilds an actor's constructor arguments in each process it starts
    for it; once a ``work`` call has killed a worker (its marker is in the
    ledger), rebuilding this one sleeps first.
    """

    def __init__(self, ledger: Path, delay: float, **options: Any) -> None:
        self.ledger, self.delay, self.options = str(ledger), delay, options

    def __call__(self) -> Agent:
        return scripted_agent(self.ledger, **self.options)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if any(Path(self.ledger).glob("killed-*")):
            time.sleep(self.delay)


def cli_agent() -> Agent:
    """The batch command's ``--agent batch_agents:cli_agent``: counts into ``$BATCH_LEDGER``, 50 ms per model call."""
    return scripted_agent(os.environ["BATCH_LEDGER"], latency=float(os.environ.get("BATCH_LATENCY", "0")))


def counts(path: Path) -> Counter[str]:
    """How many times each line occurs in a count file."""
    return Counter(lines(path))
