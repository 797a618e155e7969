"""Nothing a reply or a tool produced is dropped by a store: each journal entry written and read back, on both stores.

The rich run (``support.rich_runs``) asks for five calls at once (a cut huge
output, a failure, an empty output, a lone surrogate, a sub-agent) with text,
thinking blocks and a full ``Usage``, then answers with provider data only.
Each test drives it into a SQLite file and a PostgreSQL database, on both
drivers, and compares what ``load``, ``export`` and a resume from every
stored checkpoint give back with what went in, field by field.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.rich_runs import (
    CALLS,
    CHILD_ANSWER,
    QUESTION,
    REASONING,
    THINKING,
    comparable,
    replies_kept,
    results_kept,
    rich_agent,
    script,
)

from fsm_agent import RunResult
from fsm_agent.persist import open_store
from fsm_agent.records import plain


def _drive(agent: Any, store: Any, run_id: str, driver: str) -> tuple[RunResult, dict[str, Any]]:
    """Run ``agent`` stored under ``run_id`` on ``driver``: its result and the in-memory snapshot at its end."""
    if driver == "sync":
        run = agent.start(QUESTION, store=store, run_id=run_id)
        return run.finish(), run.snapshot()

    async def go() -> tuple[RunResult, dict[str, Any]]:
        run = await agent.astart(QUESTION, store=store, run_id=run_id)
        return await run.afinish(), run.snapshot()

    return asyncio.run(go())


@pytest.mark.parametrize("every", ["call", "transition"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stored_run_loads_every_reply_and_tool_result_as_they_came(
    store_target: str, driver: str, every: str
) -> None:
    """load() gives back each reply (text, calls, thinking byte for byte, usage, stop reason) and each tool result."""
    store = open_store(store_target, every=every)
    try:
        result, live = _drive(rich_agent(), store, "rich", driver)
        stored = store.load("rich")
    finally:
        store.close()
    assert replies_kept(stored) == script()
    kept = replies_kept(stored)
    assert kept[0] is not None
    assert kept[0].message.provider_data is not None
    assert kept[0].message.provider_data.payload == THINKING.payload
    assert stored["messages"] == live["messages"] == [plain(m) for m in result.messages]
    assert [m["provider_data"] for m in stored["messages"] if m["role"] == "assistant"] == [
        plain(THINKING),
        plain(REASONING),
    ]
    assert results_kept(stored) == results_kept(live)
    results = results_kept(stored)
    assert list(results) == [c.id for c in CALLS]
    assert results["c1"].truncated > 0
    assert "[truncated:" in results["c1"].content
    assert results["c2"].error is not None
    assert results["c3"].content == '""'
    child = results["c5"].child
    assert child is not None
    assert (child.run_id, child.input_tokens, child.output_tokens, child.cost) == ("rich/c5", 30, 7, 0.001)
    assert stored["steps"] == [plain(s) for s in result.steps]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_exported_recording_holds_every_reply_result_and_the_sub_agent_run(store_target: str, driver: str) -> None:
    """export(): each model call's reply as sent, each tool result, and the sub-agent's recording under its call."""
    store = open_store(store_target)
    try:
        _drive(rich_agent(), store, "rich", driver)
        recording = store.export("rich")
    finally:
        store.close()
    replies = [call["reply"] for call in recording["model_calls"]]
    assert replies == [plain(r) for r in script()]
    assert [call["id"] for call in recording["tool_calls"]] == [c.id for c in CALLS]
    assert [call["arguments"] for call in recording["tool_calls"]] == [c.arguments for c in CALLS]
    by_id = {call["id"]: call["result"] for call in recording["tool_calls"]}
    assert by_id["c1"]["truncated"] > 0
    assert by_id["c2"]["error"]
    assert by_id["c5"]["child"]["run_id"] == "rich/c5"
    child = recording["children"]["c5"]
    assert [call["reply"]["message"]["content"] for call in child["model_calls"]] == [CHILD_ANSWER]
    assert child["model_calls"][0]["reply"]["usage"]["reasoning_tokens"] == 3


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_run_resumed_from_each_stored_checkpoint_ends_with_everything_the_whole_run_kept(
    store_target: str, driver: str
) -> None:
    """Loaded after n transitions and resumed elsewhere, a run ends with the messages, steps and io of a whole run."""
    whole = rich_agent().start(QUESTION)
    expected = whole.finish()
    expected_replies = replies_kept(whole.snapshot())
    expected_results = {k: comparable(v) for k, v in results_kept(whole.snapshot()).items()}
    transitions = len(expected.trace)
    store = open_store(store_target, every="transition")
    try:
        for cut in range(1, transitions):
            run_id = f"cut-{cut}"
            run = rich_agent().start(QUESTION, store=store, run_id=run_id)
            for _ in range(cut):
                run.advance()
            stored = store.load(run_id)  # what another process reads: resumed there, without the store
            turns = stored["counters"]["turns"]
            again = rich_agent(script()[turns:]).resume(stored)
            result = again.finish() if driver == "sync" else asyncio.run(again.afinish())
            assert result.messages == expected.messages, cut
            assert [(s.detail, s.truncated) for s in result.steps] == [(s.detail, s.truncated) for s in expected.steps]
            kept = again.snapshot()
            assert replies_kept(kept) == expected_replies, cut
            assert {k: comparable(v) for k, v in results_kept(kept).items()} == expected_results, cut
    finally:
        store.close()
