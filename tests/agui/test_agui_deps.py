"""``app(..., deps_factory=...)``: each request's deps, built from the request, reach its turn's tools.

The audit's test (``test_embedding_audit_agui``) covers two users' new
turns; here the factory is async, a resumed turn gets the deps of the
request that resumes it, and a factory that fails or is no callable is told.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from starlette.testclient import TestClient
from support.agui_apps import post, run_input

from fsm_agent import Agent, Message, ModelResponse, RunContext
from fsm_agent.agui import app
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


def whoami(ctx: RunContext[str]) -> str:
    """The signed-in user's name."""
    return ctx.deps


class AsksWhoAmI:
    """Asks for ``whoami`` until a tool answered after the user's last message."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        last = max(i for i, m in enumerate(messages) if m.role == "user")
        if not any(m.role == "tool" for m in messages[last:]):
            return tool_turn(tool_call("whoami", id=f"w{len(messages)}"))
        return reply("Hello.")


def _results(events: list[dict[str, Any]]) -> list[str]:
    return [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]


def test_an_async_deps_factory_is_awaited_and_a_resumed_turn_gets_the_resuming_request_s_deps() -> None:
    """The paused turn's call runs with the deps of the request whose answer resumes it."""

    async def signed_in(run_input: Any) -> str:
        return str(run_input.forwarded_props["user"])

    def make_agent(run_input: Any) -> Agent:
        return Agent(AsksWhoAmI(), [whoami], approve=run_input.forwarded_props.get("approve", ()))

    with TestClient(app(make_agent, deps_factory=signed_in)) as client:
        first = post(client, {**run_input("t", "tool"), "forwardedProps": {"user": "ada"}})
        assert _results(first) == ['"ada"']
        paused = post(
            client, {**run_input("t", "tool", run_id="r2"), "forwardedProps": {"user": "ada", "approve": ["whoami"]}}
        )
        interrupt = paused[-1]["outcome"]["interrupts"][0]["id"]
        answer = [{"interruptId": interrupt, "status": "resolved", "payload": True}]
        body = {
            **run_input("t", "tool", run_id="r3", resume=answer),
            "forwardedProps": {"user": "bob", "approve": ["whoami"]},
        }
        resumed = post(client, body)
    assert _results(resumed) == ['"bob"']
    assert resumed[-1]["type"] == "RUN_FINISHED"


def test_a_deps_factory_that_raises_ends_the_request_with_run_error_naming_its_exception() -> None:
    """As an agent factory's failure: ``RUN_ERROR``, its ``code`` the exception's class; nothing is called."""

    def no_session(run_input: Any) -> str:
        raise PermissionError("no signed-in user")

    with TestClient(app(lambda _: Agent(AsksWhoAmI(), [whoami]), deps_factory=no_session)) as client:
        events = post(client, run_input("t", "tool"))
    assert (events[-1]["type"], events[-1]["code"], events[-1]["message"]) == (
        "RUN_ERROR",
        "PermissionError",
        "no signed-in user",
    )
    assert _results(events) == []


def test_a_deps_factory_that_is_not_callable_is_refused_when_the_app_is_made() -> None:
    """A ``TypeError`` at ``app()``, not on the first request."""
    with pytest.raises(TypeError, match="deps_factory must be callable"):
        app(lambda _: Agent(AsksWhoAmI(), [whoami]), deps_factory="ada")  # type: ignore[arg-type]
