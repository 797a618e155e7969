"""A compacted run cut by Ctrl-C and finished by a new owner (docs/how-to/long-runs.md, "Nothing is lost").

"The compacted history is part of the run's snapshot, so a resumed run goes
on from it", and "result.messages keeps the whole conversation".  The model
overflows whenever it is sent more than three messages; every tool call,
model call and compaction is counted, on both drivers and both stores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from support.exactly_once import cut_by_interrupt, resumed_by_new_owner

from fsm_agent import Agent, ContextOverflowError, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.testing import edges, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]
LEASE = 0.3
WINDOW = 3


class _Counts:
    def __init__(self) -> None:
        self.tries: list[str] = []
        self.done: list[str] = []
        self.sent: list[list[str]] = []
        self.compacted: list[int] = []


class _Window:
    """Overflows past ``WINDOW`` messages; asks for step1, then step2, by what it reads, then answers."""

    def __init__(self, counts: _Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[Any]) -> ModelResponse:
        self.counts.sent.append([m.content for m in messages])
        if len(messages) > WINDOW:
            raise ContextOverflowError("prompt is too long", tokens=len(messages), limit=WINDOW)
        text = " ".join(m.content for m in messages)
        for step in ("step1", "step2"):
            if f"{step} done" not in text:
                return tool_turn(tool_call("work", id=step, label=step))
        return reply("end")


def _agent(counts: _Counts, cut: dict[str, str | None]) -> Agent:
    tools = ToolRegistry()

    @tools.register
    def work(label: str) -> str:
        """Do one step, counted; cut once (Ctrl-C) when armed for this step."""
        counts.tries.append(label)
        if cut.get("tool") == label:
            cut["tool"] = None
            raise KeyboardInterrupt
        counts.done.append(label)
        return f"{label} done"

    def compact(messages: list[Message]) -> list[Message]:
        counts.compacted.append(len(messages))
        if cut.get("compact"):
            cut["compact"] = None
            raise KeyboardInterrupt
        return [Message("user", "summary: " + " ".join(m.content for m in messages if m.role == "tool"))]

    return Agent(_Window(counts), tools, "SYS", on_stop={"context_overflow": "compact"}, compact=compact)


def _whole(result: RunResult) -> list[str]:
    return [m.content for m in result.messages]


WHOLE = ["SYS", "go", "", '"step1 done"', "", '"step2 done"', "end"]


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_run_cut_after_its_compaction_resumes_from_the_compacted_history(
    store_target: str, cutter: str, resumer: str
) -> None:
    counts = _Counts()
    cut_by_interrupt(store_target, "long", cutter, _agent(counts, {"tool": "step2"}), "go")
    assert counts.done == ["step1"]
    assert counts.compacted == [4]
    assert counts.sent[-1] == ['summary: "step1 done"']

    result = resumed_by_new_owner(store_target, "long", resumer, _agent(counts, {}))
    assert result.final == "end"
    assert counts.tries == ["step1", "step2", "step2"]  # step2 was in flight at the cut
    assert counts.done == ["step1", "step2"]
    assert counts.compacted == [4]  # the new owner never compacted again: it went on from the stored head
    assert counts.sent[3:] == [['summary: "step1 done"', "", '"step2 done"']]
    assert _whole(result) == WHOLE
    assert [step.kind for step in result.steps] == ["tool_call", "compaction", "tool_call", "final"]


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_run_cut_inside_compact_compacts_on_resume_without_asking_the_model_again(
    store_target: str, cutter: str, resumer: str
) -> None:
    """Ctrl-C inside ``compact``: the overflow was recorded, so the new owner compacts and makes the call once."""
    counts = _Counts()
    cut_by_interrupt(store_target, "long", cutter, _agent(counts, {"compact": "yes"}), "go")
    assert counts.done == ["step1"]
    assert len(counts.sent) == 2  # step1's reply, then the call that overflowed

    result = resumed_by_new_owner(store_target, "long", resumer, _agent(counts, {}))
    assert result.final == "end"
    assert counts.done == ["step1", "step2"]
    assert counts.compacted == [4, 4]
    # After the resume: the compacted call (step2) and the answer; the overflowing call was not made again.
    assert counts.sent[2:] == [['summary: "step1 done"'], ['summary: "step1 done"', "", '"step2 done"']]
    assert edges(result).count("AwaitModel->AwaitModel[compacts_history]") == 1
    assert _whole(result) == WHOLE
