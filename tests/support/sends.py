"""A model that sends once per question, then answers: the same reply whichever request or process asks it.

Why shared: the session, AG-UI and request-handler tests race requests on
one conversation and need a model whose reply depends on the conversation
alone, so two owners asking it see the same calls.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

from fsm_agent.records import Message, ModelResponse
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema, ToolRegistry


class SendsPerQuestion:
    """For each user question not yet answered by a tool: ``send`` once (its id names the question), then text."""

    def __init__(self) -> None:
        self.calls: list[tuple[Message, ...]] = []
        """What each model call was sent, in order."""
        self.answered = threading.Event()
        """Set as the model hands back its text answer (the reply after a send)."""
        self._lock = threading.Lock()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self._lock:
            self.calls.append(tuple(messages))
        last = max(i for i, m in enumerate(messages) if m.role == "user")
        asked = sum(1 for m in messages if m.role == "user")
        if not any(m.role == "tool" for m in messages[last:]):
            return tool_turn(tool_call("send", id=f"send-{asked}", to=messages[last].content))
        self.answered.set()
        return reply(f"sent for question {asked}")


def counted_send(
    ran: Counter[str],
    lock: threading.Lock,
    *,
    nap: float = 0.0,
    hold: threading.Event | None = None,
    by_addressee: bool = False,
    started: threading.Event | None = None,
) -> ToolRegistry:
    """A registry whose ``send`` counts each execution in ``ran`` by call id (``to:call_id`` with ``by_addressee``).

    It sets ``started``, if given, as it begins (its worker thread is
    running it: a cut now leaves it running), waits for ``hold``, if given,
    then sleeps ``nap`` seconds (long enough for racing requests to
    overlap) before it sends.
    """
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message (counted per call id)."""
        if started is not None:
            started.set()
        if hold is not None:
            assert hold.wait(30)
        time.sleep(nap)
        with lock:
            ran[f"{to}:{call_id}" if by_addressee else call_id] += 1
        return f"sent to {to}"

    return registry
