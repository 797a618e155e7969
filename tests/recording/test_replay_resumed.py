"""Replaying a stored run that was stopped by a limit and resumed under a lifted one, past the resume.

The source stops on ``max_steps`` (or ``token_budget``), is resumed with a
higher limit by ``Agent.resume`` and runs to ``Done``, in a real store
(SQLite, then PostgreSQL); its recording keeps the limits before the resume
(``earlier_limits``).  The agents count their model and tool calls, so "the
replay called nothing" is counted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.resumed_runs import LIFTS, Counts, make_agent

from fsm_agent import RunResult, Transition
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply
from fsm_agent.testing.replay import ReplayDivergence, areplay, replay


def recorded(store_target: str, limit: str = "max_steps", *lifts: int) -> tuple[dict[str, Any], RunResult]:
    """The source stored as ``src``: stopped on ``limit``, resumed under each of ``lifts`` in turn, finished."""
    agent = make_agent(Counts(), limit)
    with open_store(store_target) as store:
        result = agent.start("go", store=store, run_id="src").finish()
        for value in lifts or LIFTS[limit][1:]:
            assert result.reason == limit
            lifted: dict[str, Any] = {limit: value}
            result = agent.resume(result, store=store, **lifted).finish()
        return store.export("src"), result


def trace_of(recording: dict[str, Any]) -> tuple[Transition, ...]:
    """The recorded trace as transitions."""
    return tuple(Transition(**entry) for entry in recording["trace"])


def resumes_in(recording: dict[str, Any]) -> list[int]:
    """The indexes of the recorded ``resume`` edges."""
    return [i for i, entry in enumerate(recording["trace"]) if entry["trigger"] == "resume"]


@pytest.mark.parametrize("limit", sorted(LIFTS))
def test_a_resumed_run_replays_past_the_resume_with_no_model_or_tool_call(store_target: str, limit: str) -> None:
    """Stopped, resumed higher, finished: ``replay`` and ``areplay`` end in Done on its trace, calling nothing."""
    recording, source = recorded(store_target, limit)
    assert source.reason == "done"
    assert [at for at, _ in recording["earlier_limits"]] == resumes_in(recording) != []
    counts = Counts()
    agent = make_agent(counts, limit)
    for result in (replay(agent, recording), asyncio.run(areplay(agent, recording))):
        assert (result.reason, result.final) == ("done", "6")
        assert result.trace == trace_of(recording) == source.trace
    assert (counts.model, counts.tool) == (0, 0)


def test_a_run_resumed_twice_replays_past_both_resumes(tmp_path: Path) -> None:
    """Each resume lifts the limit again (2, then 4, then 10): the replay takes both, calling nothing."""
    recording, source = recorded(str(tmp_path / "runs.db"), "max_steps", 4, 10)
    assert [(at, was["max_steps"]) for at, was in recording["earlier_limits"]] == list(
        zip(resumes_in(recording), (2, 4), strict=True)
    )
    counts = Counts()
    assert replay(make_agent(counts), recording).trace == source.trace
    assert (counts.model, counts.tool) == (0, 0)


def test_a_tool_changed_past_the_resume_departs_at_the_next_model_call(store_target: str) -> None:
    """Live tools, ``add`` now wrong from a=3 (after the resume): the model call that sees its result departs."""
    recording, _ = recorded(store_target)
    replied = [i for i, entry in enumerate(recording["trace"]) if entry["trigger"] == "replied"]
    assert replied[4] > resumes_in(recording)[0]  # the fifth model call, after add(3, 1), comes after the resume
    counts = Counts()
    for run in (replay, lambda *a, **k: asyncio.run(areplay(*a, **k))):
        with pytest.raises(ReplayDivergence) as caught:
            run(make_agent(counts, off_by_one_from=3), recording, tools="live")
        found = caught.value
        assert (found.index, found.expected) == (replied[4], trace_of(recording)[replied[4]])
        assert found.actual is not None
        assert (found.actual.dest, found.actual.reason) == ("Failed", "model_error")
        assert '-      "content": "4",' in found.diff
        assert '+      "content": "5",' in found.diff
    assert (counts.model, counts.tool) == (0, 8)  # a0 to a3, live, on each driver


def test_a_limit_changed_past_the_resume_departs_where_it_acts_beside_the_lifted_one(tmp_path: Path) -> None:
    """The agent's own limits stay on across the resume: ``max_tool_calls=4`` stops the replay after the lift."""
    recording, _ = recorded(str(tmp_path / "runs.db"))
    counts = Counts()
    with pytest.raises(ReplayDivergence) as caught:
        replay(make_agent(counts, max_tool_calls=4), recording)
    found = caught.value
    assert found.index > resumes_in(recording)[0]
    assert found.expected == trace_of(recording)[found.index]
    assert found.actual is not None
    assert (found.actual.dest, found.actual.reason) == ("Failed", "max_tool_calls")
    diff = [line for line in found.diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert diff == ['-  "max_tool_calls": null,', '+  "max_tool_calls": 4,']  # max_steps is the lifted 10 in both
    assert (counts.model, counts.tool) == (0, 0)


def test_a_limit_changed_before_the_resume_departs_at_the_stop_diffed_against_the_limits_then(tmp_path: Path) -> None:
    """``max_steps=3`` does not stop where ``max_steps=2`` did; the diff is against 2, not the 10 resumed under."""
    recording, _ = recorded(str(tmp_path / "runs.db"))
    stop = resumes_in(recording)[0] - 1
    with pytest.raises(ReplayDivergence) as caught:
        replay(make_agent(Counts(), max_steps=3), recording)
    found = caught.value
    assert found.expected is not None
    assert found.actual is not None
    assert (found.index, found.expected.reason, found.actual.dest) == (stop, "max_steps", "AwaitModel")
    assert '-  "max_steps": 2,' in found.diff
    assert '+  "max_steps": 3,' in found.diff


def test_a_recording_without_earlier_limits_departs_at_the_resume_edge(store_target: str) -> None:
    """An older recording keeps no limits for its resume: the replay stops where the source stopped, and says so."""
    recording, _ = recorded(store_target)
    older = {key: value for key, value in recording.items() if key != "earlier_limits"}
    resumed_at = resumes_in(recording)[0]
    counts = Counts()
    with pytest.raises(ReplayDivergence) as caught:
        replay(make_agent(counts), older)
    found = caught.value
    assert (found.index, found.actual) == (resumed_at, None)
    assert found.expected is not None
    assert (found.expected.trigger, found.expected.source) == ("resume", "Failed")
    assert '-  "max_steps": 10,' in found.diff
    assert '+  "max_steps": 2,' in found.diff
    assert (counts.model, counts.tool) == (0, 0)


def test_not_strict_replays_the_resume_then_goes_on_with_the_live_model(tmp_path: Path) -> None:
    """With ``strict=False`` the resume is taken again before the divergence; the new recording keeps its limits."""
    recording, _ = recorded(str(tmp_path / "runs.db"))
    live = FakeModel(reply("7"))
    counts = Counts()
    changed = make_agent(counts, off_by_one_from=3)
    fresh = replay(changed, recording, strict=False, model=live, tools="live")
    assert (fresh["final"], len(live.seen), counts.tool) == ("7", 1, 4)
    assert fresh["earlier_limits"] == recording["earlier_limits"]
    assert fresh["trace"][: resumes_in(recording)[0] + 1] == recording["trace"][: resumes_in(recording)[0] + 1]
    again = replay(changed, fresh)
    assert (again.reason, again.final, again.trace) == ("done", "7", trace_of(fresh))
    assert (counts.model, counts.tool, len(live.seen)) == (0, 4, 1)
