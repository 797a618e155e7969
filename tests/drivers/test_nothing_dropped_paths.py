"""Nothing a reply or a tool produced is dropped by a fork, a replay, a Session's next turn, history or to_json.

The rich run of ``support.rich_runs`` (cut output, failure, empty output,
lone surrogate, sub-agent, thinking blocks, full usage) goes through each
path on both drivers, and what comes out is compared field by field with
what went in.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.rich_runs import (
    CALLS,
    QUESTION,
    REASONING,
    THINKING,
    comparable,
    replies_kept,
    results_kept,
    rich_agent,
    script,
)

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, RunResult, Session, SqliteStore
from fsm_agent.testing import FakeModel, reply
from fsm_agent.testing.replay import areplay, replay


def _whole(driver: str) -> tuple[RunResult, dict[str, Any]]:
    run = rich_agent().start(QUESTION)
    result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    return result, run.snapshot()


def _results(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {call_id: comparable(result) for call_id, result in results_kept(snapshot).items()}


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_rich_run_keeps_every_reply_and_result_in_its_messages_and_io(driver: str) -> None:
    """The baseline: the messages hold each reply's text, calls and thinking; io holds each reply whole."""
    result, snapshot = _whole(driver)
    assert replies_kept(snapshot) == script()
    assistants = [m for m in result.messages if m.role == "assistant"]
    assert [m.provider_data for m in assistants] == [THINKING, REASONING]
    assert assistants[0].tool_calls == CALLS
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == [c.id for c in CALLS]
    assert result.usage.input_tokens == 1200 + 1500 + 30
    assert result.usage.cost == pytest.approx(0.0125 + 0.0031 + 0.001)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_to_json_and_back_keeps_every_message_step_usage_and_the_snapshot(driver: str) -> None:
    """RunResult.to_json/from_json: equal, provider payloads byte for byte, the snapshot's io intact."""
    result, _ = _whole(driver)
    back = RunResult.from_json(result.to_json())
    assert back == result
    assert [m.provider_data for m in back.messages if m.provider_data] == [THINKING, REASONING]
    stopped = rich_agent(script()[:1]).start(QUESTION)
    with pytest.raises(AgentLoopError, match="model_error") as caught:  # the script runs out
        stopped.finish() if driver == "sync" else asyncio.run(stopped.afinish())
    partial = caught.value.result
    again = RunResult.from_json(partial.to_json())
    assert again == partial
    assert again.snapshot is not None
    assert partial.snapshot is not None
    assert replies_kept(again.snapshot) == [*script()[:1], None]  # the failed call is kept with its error
    assert _results(again.snapshot) == _results(partial.snapshot)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_at_each_transition_ends_with_the_sources_messages_and_results(tmp_path: Any, driver: str) -> None:
    """Agent.fork/afork at any transition: same messages; a reused result keeps its content, error, cut and child."""
    store = SqliteStore(str(tmp_path / "runs.db"))
    source = rich_agent().run(QUESTION, store=store, run_id="src")
    expected = _results(store.load("src"))
    for at in range(len(source.trace) - 1):
        turns = sum(1 for t in source.trace[: at + 1] if t.source == "AwaitModel" and t.dest == "CheckTruncation")
        agent = rich_agent(script()[turns:])
        if driver == "sync":
            forked = agent.fork("src", at, store=store, run_id=f"f{at}")
            result = forked.finish()
        else:

            async def go(agent: Agent = agent, at: int = at) -> Any:
                forked = await agent.afork("src", at, store=store, run_id=f"f{at}")
                return forked, await forked.afinish()

            forked, result = asyncio.run(go())
        assert result.messages == source.messages, at
        assert _results(forked.snapshot()) == expected, at
        assert replies_kept(store.load(f"f{at}"))[-1] == script()[-1], at
    store.close()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_replay_of_the_export_gives_every_reply_and_result_back(tmp_path: Any, driver: str) -> None:
    """replay/areplay of the exported run: same messages, usage, steps and kept io, nothing called."""
    with SqliteStore(str(tmp_path / "runs.db")) as store:
        source = rich_agent().run(QUESTION, store=store, run_id="src")
        recording = store.export("src")
    unused = Agent(FakeModel(), rich_agent().registry, system=rich_agent().settings.system, max_consecutive_failures=5)
    result = replay(unused, recording) if driver == "sync" else asyncio.run(areplay(unused, recording))
    assert result.messages == source.messages
    assert result.usage == source.usage
    assert [(s.detail, s.truncated) for s in result.steps] == [(s.detail, s.truncated) for s in source.steps]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_sessions_next_turn_sends_the_model_every_earlier_reply_and_result(tmp_path: Any, driver: str) -> None:
    """Turn 2 of a stored Session (read back by a new Session object) sends turn 1's messages as they were."""
    path = str(tmp_path / "runs.db")
    first = Session(rich_agent(), path, "talk")
    turn1 = first.run(QUESTION) if driver == "sync" else asyncio.run(first.arun(QUESTION))
    follow = FakeModel(reply("second"))
    agent = Agent(follow, rich_agent().registry, system=rich_agent().settings.system)
    second = Session(agent, path, "talk")
    assert second.messages == tuple(m for m in turn1.messages if m.role != "system")
    turn2 = second.run("again") if driver == "sync" else asyncio.run(second.arun("again"))
    sent = follow.seen[0]
    assert sent[: len(turn1.messages)] == turn1.messages
    assert [m.provider_data for m in sent if m.provider_data is not None] == [THINKING, REASONING]
    assert turn2.messages[: len(turn1.messages)] == turn1.messages


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_history_from_a_result_read_back_from_json_sends_every_reply_byte_for_byte(driver: str) -> None:
    """history=RunResult.from_json(...): the next run's model gets each thinking payload and tool result unchanged."""
    earlier, _ = _whole(driver)
    model = FakeModel(ModelResponse(Message("assistant", "ok"), "end_turn"))
    agent = Agent(model, rich_agent().registry)
    history = RunResult.from_json(earlier.to_json())
    if driver == "sync":
        agent.run("next", history=history)
    else:
        asyncio.run(agent.arun("next", history=history))
    sent = model.seen[0]
    assert list(sent[:-1]) == [m for m in earlier.messages if m.role != "system"]
    assert [m.provider_data.payload for m in sent if m.provider_data is not None] == [
        THINKING.payload,
        REASONING.payload,
    ]
