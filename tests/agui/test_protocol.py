"""Reading an AG-UI request (the user's text, the answers to interrupts) and telling a turn's end (usage, cost)."""

from __future__ import annotations

import pytest
from ag_ui.core import ResumeEntry, RunAgentInput

from fsm_agent import Message, RunResult, Usage
from fsm_agent.agui.protocol import RequestError, decisions, finished, less, token_usage, user_text


def _input(*messages: dict[str, object]) -> RunAgentInput:
    return RunAgentInput.model_validate({"threadId": "t", "runId": "r", "messages": list(messages)})


def test_the_turns_text_is_the_last_user_message_its_text_parts_joined() -> None:
    """Plain content is taken as it is; text parts become paragraphs; earlier messages are the store's business."""
    earlier = {"id": "0", "role": "assistant", "content": "ignored"}
    assert user_text(_input(earlier, {"id": "1", "role": "user", "content": "hello"})) == "hello"
    parts = [{"type": "text", "text": "two "}, {"type": "text", "text": "parts"}]
    assert user_text(_input({"id": "1", "role": "user", "content": parts})) == "two \n\nparts"
    with pytest.raises(RequestError, match="the last is none"):
        user_text(_input())


def test_each_kind_of_answer_becomes_the_decision_it_means() -> None:
    """true/false, {"approved": ...} with a reason, and a cancelled interrupt (a rejection) all read as decisions."""
    answers = [
        ResumeEntry(interrupt_id="a", status="resolved", payload=True),
        ResumeEntry(interrupt_id="b", status="resolved", payload=False),
        ResumeEntry(interrupt_id="c", status="resolved", payload={"approved": True}),
        ResumeEntry(interrupt_id="d", status="resolved", payload={"approved": False, "reason": "too costly"}),
        ResumeEntry(interrupt_id="e", status="cancelled"),
    ]
    assert decisions(answers) == {
        "a": True,
        "b": False,
        "c": True,
        "d": "too costly",
        "e": "the person dismissed the request for approval",
    }
    with pytest.raises(RequestError, match="interrupt 'x' must be true, false"):
        decisions([ResumeEntry(interrupt_id="x", status="resolved", payload={"ok": 1})])


def test_usage_is_the_protocols_counts_and_none_when_nothing_was_reported() -> None:
    """Cached and reasoning tokens are parts of the totals in both accountings; zero usage is left out."""
    usage = Usage(input_tokens=100, output_tokens=40, cache_read_tokens=60, cache_write_tokens=10, reasoning_tokens=30)
    (entry,) = token_usage(usage) or []
    assert entry.model_dump(by_alias=True) == {
        "inputTokens": 100,
        "outputTokens": 40,
        "totalTokens": 140,
        "reasoningTokens": 30,
        "cachedInputTokens": 60,
        "cacheWriteInputTokens": 10,
    }
    assert token_usage(Usage()) is None


def test_a_resumed_run_reports_what_it_spent_after_the_pause_its_cost_too() -> None:
    """The paused run's usage is taken off; a cost is kept only where both are known."""
    after, before = Usage(30, 12, cost=0.5), Usage(10, 2, cost=0.2)
    spent = less(after, before)
    assert (spent.input_tokens, spent.output_tokens, spent.cost) == (20, 10, pytest.approx(0.3))
    assert less(after, Usage(10, 2)).cost is None


def test_the_cost_travels_in_the_metadata_the_protocol_has_no_field_for_it() -> None:
    """RUN_FINISHED carries the cost under metadata["fsm_agent"]; the usage entry has only token counts."""
    result = RunResult(messages=[Message("user", "q"), Message("assistant", "a")], steps=[], final="a")
    event = finished("t", "r", result, Usage(5, 5, cost=0.25), None)
    wire = event.model_dump(by_alias=True)
    assert wire["metadata"] == {"fsm_agent": {"reason": "done", "cost": 0.25}}
    assert wire["usage"] == [{"inputTokens": 5, "outputTokens": 5, "totalTokens": 10}]
    assert wire["result"] == "a"
