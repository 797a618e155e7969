"""Workers of one stored conversation asking turns by request id, on either driver, every call counted.

Each ``ask`` is another worker: a ``Session`` and a store object of its own,
as a web app's request handlers build them.  The model and the tool of
``ledger_agent`` append each call to one ledger file, so threads, event
loops and child processes count into the same place: ``model <q><a|b>``
per model call (``a``: the call that asks to send, ``b``: the one after
it) and ``tool <call id>`` per tool call.  The model answers from the
conversation alone (``support.sends.SendsPerQuestion``'s replies), so any
owner can go on with a turn another one started.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, RunLeasedError, Session, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.session_compaction_owners import WAIT, note

__all__ = ["WAIT", "LedgerSends", "ask", "ask_until_free", "ledger_agent"]


class LedgerSends:
    """``send`` once per question (its id ``send-<q>``), then ``sent for question <q>``; each call in the ledger.

    ``hold``: a flag path; the model call ``2b`` (the answer of question 2)
    makes ``<hold>.entered`` and waits for ``<hold>.go`` before it answers.
    """

    def __init__(self, ledger: str, hold: str | None = None) -> None:
        self.ledger = ledger
        self.hold = hold

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        last = max(i for i, m in enumerate(messages) if m.role == "user")
        asked = sum(1 for m in messages if m.role == "user")
        sent = any(m.role == "tool" for m in messages[last:])
        note(self.ledger, f"model {asked}{'b' if sent else 'a'}")
        if not sent:
            return tool_turn(tool_call("send", id=f"send-{asked}", to=messages[last].content))
        if self.hold is not None and asked == 2:
            Path(self.hold + ".entered").touch()
            deadline = time.monotonic() + WAIT
            while not Path(self.hold + ".go").exists():
                assert time.monotonic() < deadline, "the held model call was never released"
                time.sleep(0.01)
        return reply(f"sent for question {asked}")


def ledger_agent(ledger: str, hold: str | None = None, **options: Any) -> Agent:
    """An agent over ``LedgerSends`` whose ``send`` tool writes ``tool <call id>`` to the ledger as it runs."""
    tools = ToolRegistry()

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted per call id)."""
        note(ledger, f"tool {call_id}")
        return f"sent to {to}"

    return Agent(LedgerSends(ledger, hold), tools, **options)


def ask(target: str, agent: Agent, text: str, request_id: str | None, driver: str, **store: Any) -> Any:
    """One worker's turn: a fresh ``Session`` over a fresh store object at ``target``, ``run`` or ``arun``.

    ``store`` are ``open_store``'s options (``lease=``).
    """
    if driver == "sync":
        with open_store(target, **store) as opened:
            return Session(agent, opened, "chat").run(text, request_id=request_id)

    async def go() -> Any:
        opened = open_store(target, **store)
        try:
            session = await Session.aopen(agent, opened, "chat")
            return await session.arun(text, request_id=request_id)
        finally:
            await opened.aclose()
            opened.close()

    return asyncio.run(go())


def ask_until_free(
    target: str, agent: Agent, text: str, request_id: str | None, driver: str, dead: int, lease: float
) -> Any:
    """``ask``, asked again while the turn is refused because the owner ``dead`` (a pid) still holds its lease."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return ask(target, agent, text, request_id, driver, lease=lease)
        except RunLeasedError as refusal:
            if f":{dead}:" not in refusal.holder:
                raise
        assert time.monotonic() < deadline, "the stalled owner's lease never lapsed"
        time.sleep(0.02)
