"""Agents and checks for the batch audit tests: a tool that exits its process's loop, approvals, deps that fail once.

Importable by Ray's workers (the batch tests put ``tests/`` on their path).
Every count is a line appended with ``O_APPEND`` to a file in the ledger
folder, as ``support.batch_agents`` keeps them, so workers in other
processes never interleave.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fsm_agent import Agent, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.batch import BatchItem
from fsm_agent.testing import ManualClock, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.batch_agents import TOOL_LOG, Script, _append, registry, tag
from support.deps_agents import Held

EXITED = "exited"
"""The marker the exiting call writes just before ``sys.exit``: the other runs' calls wait for it."""

WAIT = 60.0
"""Only a bound on a hang: the exiting call is made within a second of the batch starting."""


class Paired(Script):
    """``Script``, except that each tool turn asks for two calls at once: ``<tag>-<turn>`` and ``<tag>-<turn>b``."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        response = super().complete(messages, tools)
        if not response.message.tool_calls:
            return response
        [call] = response.message.tool_calls
        twin = tool_call("work", id=f"{call.id}b", **call.arguments, twin=True)  # not the same call twice
        return tool_turn(call, twin, usage=response.usage)


def exiting_agent(ledger: str, who: str, paired: bool = False) -> Agent:
    """``work`` (sync): the second call of question ``who`` calls ``sys.exit(3)``; the other second calls wait for it.

    So when the exit comes, every other run of the batch is in flight,
    holding its lease, its call waiting in a thread of the loop.
    ``paired``: each turn asks for two calls at once (``Paired``), so the
    exit comes from one task of a parallel batch of calls.  The twins do
    not wait: eight waiting calls would fill the loop's executor (six
    threads on two cores), the exiting call would queue behind them and
    come only once they gave up (``WAIT``: a minute measured in CI).
    """
    where = Path(ledger)
    tools = ToolRegistry()

    @tools.register
    def work(step: int, call_id: str, twin: bool = False) -> str:
        """Do one step of work (``twin``: the second call of a turn, for ``Paired``)."""
        if call_id == f"{tag(who)}-1":
            (where / EXITED).touch()
            sys.exit(3)
        deadline = time.monotonic() + WAIT
        while step == 1 and not twin and not (where / EXITED).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        _append(where / TOOL_LOG, call_id)
        return f"step {step} done"

    model = (Paired if paired else Script)(where, 3, 0.0)
    return Agent(model, tools, max_steps=5, clock=ManualClock())


class Paced(Script):
    """``Script``, except that a question starting with ``quick`` is one call and an answer, at once.

    The other questions take ``rounds`` calls of ``latency`` seconds each:
    still in flight, whatever the load, when the quick run's result is read.
    """

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = next(m.content for m in messages if m.role == "user")
        if question.startswith("quick"):
            return Script(self.ledger, 1, 0.0).complete(messages, tools)
        return super().complete(messages, tools)


def paced_agent(ledger: str, rounds: int, latency: float) -> Agent:
    """The ``Paced`` model and ``support.batch_agents``' counting ``work`` tool."""
    where = Path(ledger)
    return Agent(Paced(where, rounds, latency), registry(where, frozenset()), max_steps=rounds + 2, clock=ManualClock())


def approving_agent(ledger: str) -> Agent:
    """The ``Script`` model and a counting ``work`` tool that needs a person's approval for every call."""
    where = Path(ledger)
    tools = ToolRegistry()

    @tools.register
    def work(step: int, call_id: str) -> str:
        """Do one step of work."""
        _append(where / TOOL_LOG, call_id)
        return f"step {step} done"

    return Agent(Script(where, 2, 0.0), tools, max_steps=4, clock=ManualClock(), approve=["work"])


def held_unless_broken(item: BatchItem) -> Held:
    """A ``make_deps`` that fails for the one question starting with ``broken``, and gives the others their own."""
    if item.input.startswith("broken"):
        msg = f"no database for {item.input!r}"
        raise ConnectionError(msg)
    return Held(f"item {item.index}")


def first_question(result: RunResult) -> str:
    """The question a result's run asked (its first user message)."""
    return next(m.content for m in result.messages if m.role == "user")
