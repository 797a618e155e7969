"""Runs whose sub-agent run changes while the parent's stored record stays put, and a store counting the stream's reads.

The viewer's stream (``fsm_agent/ui/live.py``) reads the followed run every
``poll`` seconds; the run page shows where each sub-agent run stands (its
state, reason, whether it is paused), read from the child's own record.  Two
ways a child changes under a parent that writes nothing meanwhile:

- ``Paused``: the parent paused for a person (``mail`` needs approval) after
  its sub-agent ``clerk`` paused too (``file`` needs approval); a person
  resumes the child, which ends, while the parent stays paused.
- ``InFlight``: the parent waits on its sub-agent call ``research``; the child
  runs ``dig``, which waits on ``dug``, then its model waits on ``answer``: its
  stored state moves on while the parent is in the middle of one call.

Every tool counts its calls by call id (``Effects``) and every model its calls.
``ReadsCounted`` wraps the store the viewer reads, so a test knows when the
stream has read the run again after a write (``past``), instead of sleeping.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.app_owners import JOIN
from support.held_viewer_store import Wrapped
from support.shared_runs import Effects

PARENT = "boss"
CHILD = "boss/c1"


class ReadsCounted(Wrapped):
    """The store, counting each read of ``run_id`` as it starts; ``past(n)`` waits for ``n`` more than now.

    Counted as a read starts: a read counted after a write began after it.
    The stream reads the run, builds its page, sends it and only then waits
    and reads again, so once two reads began after a write, the page built on
    the first of them (which saw the write) was handed to the connection.
    """

    def __init__(self, store: Any, run_id: str) -> None:
        super().__init__(store)
        self.run_id = run_id
        self.reads = 0
        self._read = threading.Condition()

    def load(self, run_id: str) -> dict[str, Any]:
        if run_id == self.run_id:
            with self._read:
                self.reads += 1
                self._read.notify_all()
        data: dict[str, Any] = self.store.load(run_id)
        return data

    def past(self, more: int) -> None:
        """Wait (up to ``JOIN``) until ``more`` reads of the run began after this call."""
        with self._read:
            until = self.reads + more
            assert self._read.wait_for(lambda: self.reads >= until, JOIN), "the stream stopped reading the run"


def counted_reads(kept: list[ReadsCounted], run_id: str = PARENT) -> Any:
    """A ``wrap`` for ``viewer_clients.served``: the store with its reads of ``run_id`` counted, kept in ``kept``."""

    def wrap(store: Any) -> ReadsCounted:
        kept.append(ReadsCounted(store, run_id))
        return kept[0]

    return wrap


def _counted_tool(
    registry: ToolRegistry, name: str, effects: Effects, gates: tuple[threading.Event, threading.Event] | None = None
) -> None:
    """Register ``name(call_id, to)``, counting its call in ``effects``; with ``gates``: set one, wait on the other."""

    def tool(call_id: str, to: str = "") -> str:
        effects.add(call_id)
        if gates is not None:
            gates[0].set()
            assert gates[1].wait(JOIN), f"the test never let {name} finish"
        return f"{name} done"

    tool.__name__ = name
    tool.__doc__ = f"{name.capitalize()} something."
    registry.register(tool)


class Paused:
    """The ``boss`` run paused at ``mail`` (call ``m1``) after its sub-agent ``clerk`` (``c1``) paused at ``file``."""

    def __init__(self, effects: Effects) -> None:
        self.effects = effects
        self.clerk_model = FakeModel(tool_turn(tool_call("file", id="k1", to="cabinet")))
        self.boss_model = FakeModel(
            tool_turn(tool_call("clerk", id="c1", input="file it")), tool_turn(tool_call("mail", id="m1", to="boss"))
        )
        self.clerk_again = FakeModel(reply("Filed."))
        self.boss_again = FakeModel(reply("Mailed and filed."))

    def _clerk(self, model: FakeModel) -> Agent:
        registry = ToolRegistry()
        _counted_tool(registry, "file", self.effects)
        return Agent(model, registry, approve={"file"})

    def _boss(self, model: FakeModel) -> Agent:
        registry = ToolRegistry()
        _counted_tool(registry, "mail", self.effects)
        registry.register(self._clerk(self.clerk_model).as_tool("clerk", "Files things."))
        return Agent(model, registry, approve={"mail"})

    def start(self, store: Any) -> None:
        """Run ``boss`` to its pause: the clerk paused (a tool error to the boss), the boss paused at ``m1``."""
        result = self._boss(self.boss_model).run("file it, then mail the boss", store=store, run_id=PARENT)
        assert (result.reason, [call.id for call in result.pending]) == ("paused", ["m1"]), result
        assert store.load(CHILD)["paused"] is True

    def resume_clerk(self, store: Any, driver: str) -> None:
        """A person approves ``k1`` and resumes the clerk's run by ``driver``: it files, answers, and ends."""
        run = self._clerk(self.clerk_again).resume(store.load(CHILD), approvals={"k1": True}, store=store)
        result = run.finish() if driver == "sync" else _run_async(run.afinish())
        assert (result.reason, result.final) == ("done", "Filed."), result

    def resume_boss(self, store: Any, driver: str) -> None:
        """The boss resumed (``m1`` decided on the viewer) by ``driver``: it mails and answers."""
        run = self._boss(self.boss_again).resume(store.load(PARENT), store=store)
        result = run.finish() if driver == "sync" else _run_async(run.afinish())
        assert (result.reason, result.final) == ("done", "Mailed and filed."), result

    def model_calls(self) -> tuple[int, int, int, int]:
        """Calls made of the clerk's model, the boss's, and each one's model after its resume."""
        return tuple(len(m.seen) for m in (self.clerk_model, self.boss_model, self.clerk_again, self.boss_again))  # type: ignore[return-value]


class Digging:
    """The sub-agent's model: asks for ``dig`` once, then (its second call) waits on ``answer`` before answering."""

    def __init__(self, asking: threading.Event, answer: threading.Event) -> None:
        self.asking, self.answer = asking, answer
        self.calls = 0

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.calls += 1
        if not any(m.role == "tool" for m in messages):
            return tool_turn(tool_call("dig", id="d1"))
        self.asking.set()
        assert self.answer.wait(JOIN), "the test never let the sub-agent's model answer"
        return reply("Paris")


class InFlight:
    """The ``boss`` run in the middle of its sub-agent call ``c1``; the child's run moves on as the test says.

    ``digging`` is set once the child's ``dig`` runs (it waits on ``dug``);
    ``asking`` once the child's model is asked again (it waits on ``answer``).
    """

    def __init__(self, effects: Effects) -> None:
        self.effects = effects
        self.digging, self.dug, self.asking, self.answer = (threading.Event() for _ in range(4))
        self.child_model = Digging(self.asking, self.answer)
        self.boss_model = FakeModel(tool_turn(tool_call("research", id="c1", input="capital?")), reply("It is Paris."))

    def agent(self) -> Agent:
        """The boss: its one tool is the sub-agent, whose one tool ``dig`` counts its call and waits on ``dug``."""
        child_tools = ToolRegistry()
        _counted_tool(child_tools, "dig", self.effects, (self.digging, self.dug))
        registry = ToolRegistry()
        registry.register(Agent(self.child_model, child_tools).as_tool("research", "Answers one question."))
        return Agent(self.boss_model, registry)

    def run(self, store: Any, driver: str) -> None:
        """Run the boss to its answer by ``driver`` (in the caller's thread)."""
        agent = self.agent()
        if driver == "sync":
            result = agent.run("capital?", store=store, run_id=PARENT)
        else:
            result = _run_async(agent.arun("capital?", store=store, run_id=PARENT))
        assert (result.reason, result.final) == ("done", "It is Paris."), result


def _run_async(awaitable: Any) -> Any:
    """``asyncio.run`` of a coroutine: the async driver, on an event loop of this thread."""
    return asyncio.run(awaitable)
