"""What the shared-run tests use: an office agent whose two calls wait for a person, each call's side effect counted.

The model asks, in one turn, to read ``secret.txt`` and to mail the boss;
both calls need approval.  Its reply depends only on the conversation, so
any agent built here, in any process, continues a run another one started.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

SECRET = "the launch codes are 0000"
"""What ``read_file`` returns: it must never reach the model unless a person approved the read."""
CALLS = ("read", "mail")
"""The ids of the turn's two calls."""


class Office:
    """Reads a file and mails the boss in one turn, then answers with what the tools said; records what it saw."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        self.calls = 0

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.calls += 1
        self.shown.extend(m.content for m in messages)
        if not any(m.role == "assistant" for m in messages):
            return tool_turn(
                tool_call("read_file", id="read", path="secret.txt"), tool_call("send_email", id="mail", to="boss")
            )
        return reply(" | ".join(m.content for m in messages if m.role == "tool"))


class Effects(Counter[str]):
    """Side effects by call id; with ``path``, each is also appended there, so another process's count shows."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__()
        self.path = path

    def add(self, call_id: str) -> None:
        """Count one call that ran."""
        self[call_id] += 1
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as file:
                file.write(call_id + "\n")


def office_registry(effects: Effects) -> ToolRegistry:
    """``read_file`` and ``send_email``, each counting its calls in ``effects``."""
    registry = ToolRegistry()

    def read_file(path: str, call_id: str) -> str:
        """Read a file."""
        effects.add(call_id)
        return SECRET

    def send_email(to: str, call_id: str) -> str:
        """Send an email."""
        effects.add(call_id)
        return f"mailed {to}"

    registry.register(read_file)
    registry.register(send_email)
    return registry


def office(effects: Effects, *, approve: bool = True, **options: Any) -> tuple[Agent, Office]:
    """The office agent (both tools need approval unless ``approve=False``) and its model."""
    model = Office()
    rule = {"read_file", "send_email"} if approve else None
    return Agent(model, office_registry(effects), approve=rule, **options), model


def counted(path: Path) -> Counter[str]:
    """The side effects another process appended to ``path``."""
    return Counter(path.read_text(encoding="utf-8").split()) if path.exists() else Counter()


def as_json(data: dict[str, Any]) -> dict[str, Any]:
    """Data as it reads back from JSON."""
    return json.loads(json.dumps(data))  # type: ignore[no-any-return]


def make_office() -> Agent:
    """An office agent without ``approve=`` (for ``--agent support.shared_runs:make_office``)."""
    return office(Effects(), approve=False)[0]
