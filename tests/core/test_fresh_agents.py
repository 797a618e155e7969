"""A fresh agent per request (a web handler's ``fsm_agent.run``) finds what it derives from its parts already built.

Speed itself is measured by ``make bench`` (the "fresh" column); these tests
check the mechanism: what used to be built again for every agent is shared.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import fsm_agent
from fsm_agent import Agent, StopCondition, ToolRegistry
from fsm_agent.testing import FakeModel, demo_registry, reply


class CountingRegistry(ToolRegistry):
    """A registry that counts how often its schemas are built."""

    def __init__(self) -> None:
        super().__init__()
        self.built = 0

    def schemas(self) -> list[dict[str, Any]]:
        self.built += 1
        return super().schemas()


def test_each_agent_holds_its_settings_in_one_frozen_record() -> None:
    """Equal keywords give equal settings records; the agent's limits are the record's, and neither can be set."""
    first = Agent(FakeModel(), ToolRegistry(), max_steps=5, token_budget=100)
    second = Agent(FakeModel(), ToolRegistry(), max_steps=5, token_budget=100)
    assert second.limits == first.limits
    assert first.limits is first.settings.limits
    with pytest.raises(AttributeError):
        first.limits = second.limits  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        first.settings.limits = second.limits  # type: ignore[misc]
    third = Agent(FakeModel(), ToolRegistry(), max_steps=6, token_budget=100)
    assert third.limits.max_steps == 6


def test_a_bool_is_not_taken_for_the_integer_it_equals() -> None:
    """max_steps=True is refused even after an agent with max_steps=1 was built."""
    Agent(FakeModel(), ToolRegistry(), max_steps=1)
    with pytest.raises(ValueError, match="max_steps must be an integer"):
        Agent(FakeModel(), ToolRegistry(), max_steps=True)


def test_agents_over_one_table_share_one_walker() -> None:
    """Every plain agent finds the built-in table's walker, built once."""
    one, two = Agent(FakeModel(), ToolRegistry()), Agent(FakeModel(), ToolRegistry())
    assert one.settings.walker is two.settings.walker


def test_agents_with_equal_stop_conditions_share_one_walker() -> None:
    """Tables built again with the same stops are found by value: one walker for them all."""

    def never(view: Any) -> bool:
        return False

    stop = StopCondition("never", "Dispatch", never)
    assert (
        Agent(FakeModel(), ToolRegistry(), stop_conditions=[stop]).settings.walker
        is Agent(FakeModel(), ToolRegistry(), stop_conditions=[stop]).settings.walker
    )


def test_the_tool_schemas_are_built_once_per_version_of_the_registry_for_every_agent() -> None:
    """Fresh agents over one registry reuse its schemas; registering a tool builds them again, once."""
    registry = CountingRegistry()
    registry.register(demo_registry().get("echo").function, name="echo")  # type: ignore[union-attr]
    for _ in range(3):
        fsm_agent.run(FakeModel(reply("hi")), registry, "hello")
    assert registry.built == 1

    def ping() -> str:
        """Answer pong."""
        return "pong"

    registry.register(ping)
    for _ in range(2):
        fsm_agent.run(FakeModel(reply("hi")), registry, "hello")
    assert registry.built == 2


def test_each_run_still_gets_its_own_list_of_schemas() -> None:
    """Shared building, not a shared list: what one run's model does to its list reaches no other run."""
    registry = demo_registry()
    offered: list[int] = []

    class Greedy(FakeModel):
        def complete(self, messages: Any, tools: Any, output: Any = None) -> Any:
            offered.append(len(tools))
            tools.clear()  # a model that spoils the list it was handed
            return super().complete(messages, tools, output)

    fsm_agent.run(Greedy(reply("a")), registry, "one")
    fsm_agent.run(Greedy(reply("b")), registry, "two")
    assert offered == [3, 3]


def test_runs_of_one_agent_with_and_without_a_cancel_token_each_walk_their_own_rows() -> None:
    """The rows kept for new runs are kept per set-up: a cancelled token still stops a run after plain runs."""
    from fsm_agent import AgentLoopError, CancelToken
    from fsm_agent.testing import tool_call, tool_turn

    agent = Agent(FakeModel([tool_turn(tool_call("echo", text=str(i))) for i in range(9)]), demo_registry())
    token = CancelToken()
    token.cancel("stop now")
    with pytest.raises(AgentLoopError, match="max_steps"):
        agent.run("first, without a token")
    with pytest.raises(AgentLoopError) as caught:
        agent.run("then with a cancelled one", cancel=token)
    assert caught.value.reason == "cancelled"
