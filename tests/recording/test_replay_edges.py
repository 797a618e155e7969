"""Replays of runs with a parallel batch beside a sub-agent, and of a run whose model reused a call id.

Every tool (the sub-agent's too) counts its executions by call id, so "the
replay called nothing" and "live tools ran each call once" are counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from support.by_turn import ByTurn

from fsm_agent import Agent, ModelResponse, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.testing.replay import areplay, replay

BATCH = [
    tool_turn(
        tool_call("research", id="r1", input="who?"),
        tool_call("send", id="s1", to="bob"),
        tool_call("send", id="s2", to="eve"),
    ),
    reply("done"),
]
REUSED_ID = [
    tool_turn(tool_call("send", id="call_1", to="bob")),
    tool_turn(tool_call("send", id="call_1", to="eve")),  # the provider reuses the id: the run renames it
    reply("done"),
]


def make_agent(made: Counter[str], script: Sequence[ModelResponse]) -> Agent:
    child_tools = ToolRegistry()

    @child_tools.register
    def lookup(q: str, call_id: str) -> str:
        """Look a question up."""
        made[call_id] += 1
        return "ada"

    child = Agent(ByTurn([tool_turn(tool_call("lookup", id="l1", q="who")), reply("ada")]), child_tools)
    tools = ToolRegistry()
    tools.register(child.as_tool("research", "Research a question."))

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a message."""
        made[call_id] += 1
        return f"sent to {to}"

    return Agent(ByTurn(script), tools, max_concurrency=4)


def replayed(agent: Agent, recording: dict[str, Any], driver: str, **keywords: Any) -> Any:
    if driver == "sync":
        return replay(agent, recording, **keywords)
    return asyncio.run(areplay(agent, recording, **keywords))


@pytest.mark.parametrize("replay_driver", ["sync", "async"])
@pytest.mark.parametrize("source_driver", ["sync", "async"])
def test_a_batch_beside_a_sub_agent_replays_with_no_call_and_live_tools_make_each_call_once(
    store_target: str, source_driver: str, replay_driver: str
) -> None:
    """Recorded results: nothing runs, the sub-agent neither; live tools: each call (the sub-agent's too) once."""
    with open_store(store_target) as store:
        made: Counter[str] = Counter()
        agent = make_agent(made, BATCH)
        if source_driver == "sync":
            source = agent.run("go", store=store, run_id="src")
        else:
            source = asyncio.run(agent.arun("go", store=store, run_id="src"))
        assert dict(made) == {"l1": 1, "s1": 1, "s2": 1}
        recording = store.export("src")
        made.clear()
        result = replayed(make_agent(made, BATCH), recording, replay_driver)
        assert (result.trace, result.messages) == (source.trace, source.messages)
        assert dict(made) == {}
        result = replayed(make_agent(made, BATCH), recording, replay_driver, tools="live")
        assert result.messages == source.messages
        assert dict(made) == {"l1": 1, "s1": 1, "s2": 1}


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_run_whose_model_reused_a_call_id_replays_and_forks_with_no_call(store_target: str, driver: str) -> None:
    """The renamed call (call_1-2) takes its own recorded result, in a replay and in a fork at every index."""
    with open_store(store_target) as store:
        made: Counter[str] = Counter()
        source = make_agent(made, REUSED_ID).run("go", store=store, run_id="src")
        assert dict(made) == {"call_1": 1, "call_1-2": 1}
        made.clear()
        result = replayed(make_agent(made, REUSED_ID), store.export("src"), driver)
        assert (result.messages, dict(made)) == (source.messages, {})
        for at in range(len(source.trace) - 1):
            agent = make_agent(made, REUSED_ID)
            if driver == "sync":
                forked = agent.fork("src", at, store=store, run_id=f"f{at}").finish()
            else:

                async def go(agent: Agent = agent, at: int = at) -> Any:
                    return await (await agent.afork("src", at, store=store, run_id=f"f{at}")).afinish()

                forked = asyncio.run(go())
            assert (forked.messages, dict(made)) == (source.messages, {}), at
