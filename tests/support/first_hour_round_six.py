"""What the sixth first-hour round shares: a user's agent module for the command line, a counted tool, adapters.

Why shared: each test checks the same things of a newcomer's mistake: the
tool that sends something was never called, the model was never asked,
nothing was written to a store or a file.  The command line is driven
in-process (``main([...])``) with a user's module written to a fresh
directory under a name no other test imported.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Message, ModelResponse, ToolCall
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

AGENT_MODULE = textwrap.dedent(
    '''
    from fsm_agent import Agent
    from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

    calls = []


    def send(to: str) -> str:
        """Send a message."""
        calls.append(to)
        return "sent"


    def make():
        return Agent(FakeModel(tool_turn(tool_call("send", id="s1", to="ada")), reply("Sent.")), [send])
    '''
)
"""A user's module: ``make`` asks for one ``send`` call, then answers; ``calls`` lists the sends made."""


def user_module(directory: Path, monkeypatch: pytest.MonkeyPatch, text: str = AGENT_MODULE) -> str:
    """Write ``text`` as a module in ``directory``, the working directory from now on; return its (fresh) name."""
    name = f"round_six_{uuid.uuid4().hex[:8]}"
    (directory / f"{name}.py").write_text(text, encoding="utf-8")
    monkeypatch.chdir(directory)
    monkeypatch.setattr(sys, "path", [str(directory), *sys.path])  # the loader adds the working directory too
    return name


def sends(module: str) -> list[str]:
    """The sends the user's module made."""
    found: list[str] = importlib.import_module(module).calls
    return found


class Sends:
    """One tool, ``send``, that counts its calls in ``calls``."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def tools(self) -> list[Any]:
        calls = self.calls

        def send(to: str) -> str:
            """Send a message."""
            calls.append(to)
            return "sent"

        return [send]


def asks_to_send() -> FakeModel:
    """A scripted model: one ``send`` call (id ``s1``), then an answer."""
    return FakeModel(tool_turn(tool_call("send", id="s1", to="ada")), reply("Sent."))


class UserRoleAdapter:
    """A newcomer's adapter that builds its reply as ``Message("user", ...)`` (the role copied from the request)."""

    def complete(self, messages: Sequence[Message], tools: list[dict[str, Any]]) -> ModelResponse:
        return ModelResponse(Message("user", "Sent."), "end_turn")


class JsonTextArgumentsAdapter:
    """A newcomer's adapter that passes the provider's argument text as it came, forgetting ``json.loads``."""

    def complete(self, messages: Sequence[Message], tools: list[dict[str, Any]]) -> ModelResponse:
        if messages[-1].role == "tool":
            return reply("Sent.")
        call = ToolCall("s1", "send", '{"to": "ada"}')  # type: ignore[arg-type]
        return ModelResponse(Message("assistant", "", (call,)), "tool_use")
