"""A compaction that failed, then a retried run that compacts: evidence and record (docs/how-to/long-runs.md).

"On context_overflow, the evidence says whether a compaction was tried
(``compacted``), and why it did not help (``blocked_by``, ``compact_error``)";
"result.messages keeps the whole conversation".  Both drivers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, ContextOverflowError, Message
from fsm_agent.testing import FakeModel, demo_registry, edges

DRIVERS = ["sync", "async"]
TOO_LONG = ContextOverflowError("prompt is too long", tokens=10, limit=5)


def _go(driver: str, agent: Agent, source: Any) -> None:
    if source is None:
        if driver == "sync":
            agent.run("Read the log.")
        else:
            asyncio.run(agent.arun("Read the log."))
    elif driver == "sync":
        agent.resume(source, retry=True).finish()
    else:

        async def go() -> None:
            await (await agent.aresume(source, retry=True)).afinish()

        asyncio.run(go())


def _stopped(driver: str, agent: Agent, source: Any = None) -> AgentLoopError:
    with pytest.raises(AgentLoopError) as stop:
        _go(driver, agent, source)
    return stop.value


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_compaction_that_worked_after_one_that_failed_is_reported_as_compacted(driver: str) -> None:
    """The first compaction raises; the retried run's compaction works, and its call overflows again.

    The second stop's evidence must say a compaction was made (``compacted``)
    and carry no ``compact_error``: the error was the earlier attempt's.
    """
    broken = {"yes": True}
    calls: list[int] = []

    def compact(messages: list[Message]) -> list[Message]:
        calls.append(len(messages))
        if broken["yes"]:
            msg = "summariser down"
            raise RuntimeError(msg)
        return [Message("user", "summary")]

    model = FakeModel(TOO_LONG, TOO_LONG, TOO_LONG)
    agent = Agent(model, demo_registry(), on_stop={"context_overflow": "compact"}, compact=compact)
    first = _stopped(driver, agent)
    assert first.evidence["compacted"] is False
    assert "summariser down" in first.evidence["compact_error"]

    broken["yes"] = False
    second = _stopped(driver, agent, first.result)
    assert calls == [1, 1]
    assert [m.content for m in model.seen[-1]] == ["summary"]  # the model was sent the compacted history
    assert edges(second.result)[-2:] == [
        "AwaitModel->AwaitModel[compacts_history]",
        "AwaitModel->Failed[context_overflow]",
    ]
    assert second.evidence["compacted"] is True
    assert "compact_error" not in second.evidence


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_failed_compaction_keeps_the_whole_record_and_a_retry_compacts_from_it(driver: str) -> None:
    """The run that stopped on a failed compaction loses nothing; the retry compacts it and answers."""
    broken = {"yes": True}

    def compact(messages: list[Message]) -> list[Message]:
        if broken["yes"]:
            return []  # a history no provider takes
        return [Message("user", f"summary of {len(messages)}")]

    from fsm_agent.testing import reply, tool_call, tool_turn

    model = FakeModel(tool_turn(tool_call("echo", id="c1", text="log")), TOO_LONG, TOO_LONG, reply("Done."))
    agent = Agent(model, demo_registry(), "SYS", on_stop={"context_overflow": "compact"}, compact=compact)
    first = _stopped(driver, agent)
    assert "non-empty list" in first.evidence["compact_error"]
    assert [m.content for m in first.result.messages] == ["SYS", "Read the log.", "", '"log"']

    broken["yes"] = False
    if driver == "sync":
        result = agent.resume(first.result, retry=True).finish()
    else:

        async def go() -> Any:
            return await (await agent.aresume(first.result, retry=True)).afinish()

        result = asyncio.run(go())
    assert result.final == "Done."
    assert [m.content for m in model.seen[-1]] == ["summary of 4"]
    assert [m.content for m in result.messages] == ["SYS", "Read the log.", "", '"log"', "Done."]
    assert [s.kind for s in result.steps] == ["tool_call", "compaction", "final"]
