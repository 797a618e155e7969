"""What the second-hour tests share: a newcomer's custom store, an app's deps and a tool reading them, a bad factory.

Why shared: each is what a user writes after the how-to pages (store.md,
deps.md, ray.md), with the one mistake a test makes; a test module never
imports another, so they live here.
"""

from __future__ import annotations

import json
from typing import Any

from fsm_agent import Agent, RunContext
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


class DictStore:
    """docs/how-to/store.md's minimal store, every run as the JSON text of its latest snapshot."""

    def __init__(self) -> None:
        self.runs: dict[str, str] = {}

    def wants(self, state: Any, paused: bool) -> bool:
        return True

    def save(self, run_id: str, snapshot: dict[str, Any]) -> None:
        self.runs[run_id] = json.dumps(snapshot)

    def load(self, run_id: str) -> dict[str, Any]:
        if run_id not in self.runs:
            raise KeyError(f"no run {run_id!r}")
        loaded: dict[str, Any] = json.loads(self.runs[run_id])
        return loaded


class OneArgumentWantsStore(DictStore):
    """The minimal store with ``wants(state)``: the ``paused`` argument forgotten."""

    def wants(self, state: Any) -> bool:  # type: ignore[override]
        return True


class App:
    """docs/how-to/deps.md's app: a database of orders and the signed-in user."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.orders = {"alice": ["A-17", "A-18"], "bob": ["B-2"]}


def my_orders(ctx: RunContext[App]) -> list[str]:
    """The signed-in user's orders."""
    return ctx.deps.orders[ctx.deps.user]


def asks_for_orders() -> FakeModel:
    """A scripted model: one ``my_orders`` call, then an answer."""
    return FakeModel(tool_turn(tool_call("my_orders")), reply("You have two orders."))


def returns_no_agent() -> Any:
    """A batch factory that returns the agent's name instead of the agent."""
    return "calculator"


def plain_agent() -> Agent:
    """An agent that answers at once."""
    return Agent(FakeModel(reply("ok")), [my_orders])
