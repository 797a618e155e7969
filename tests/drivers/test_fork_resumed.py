"""Forking a run that was stopped by a limit and resumed under a lifted one, before and past the resume.

The source stops on ``max_steps`` (or ``token_budget``), is resumed with a
higher limit and runs to ``Done``; its snapshot keeps the limits it ran
under before the resume (``earlier_limits``), so a fork rebuilds it through
the stop and the resume.  The model and the tool count their calls, so "the
rebuild calls nothing" is counted; the model answers by the conversation it
is sent (as a model at temperature 0 would), so a fork that goes on asks it
again and gets the source's answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.resumed_runs import LIFTS, Counts, make_agent

from fsm_agent import (
    Agent,
    AgentRun,
    ForkEdit,
    ForkError,
    RunResult,
    SnapshotError,
)
from fsm_agent.persist import open_store


def source_run(limit: str, driver: str, store: Any) -> tuple[RunResult, dict[str, Any]]:
    """The source, stored as ``src``: stopped on ``limit``, resumed higher, finished, with its snapshot."""
    agent = make_agent(Counts(), limit)
    lifted = {limit: LIFTS[limit][1]}
    if driver == "sync":
        stopped = agent.start("go", store=store, run_id="src").finish()
        assert stopped.reason == limit
        run = agent.resume(stopped, store=store, **lifted)
        return run.finish(), run.snapshot()

    async def go() -> tuple[RunResult, dict[str, Any]]:
        stopped = await agent.start("go", store=store, run_id="src").afinish()
        assert stopped.reason == limit
        run = await agent.aresume(stopped, store=store, **lifted)
        return await run.afinish(), run.snapshot()

    return asyncio.run(go())


def forked(agent: Agent, driver: str, source: Any, at: int, store: Any) -> AgentRun:
    """``agent.fork`` or ``agent.afork`` of ``source`` at ``at`` (a stored run's id is read from ``store``)."""
    stored = {"store": store, "run_id": f"f{at}"} if isinstance(source, str) else {}
    if driver == "sync":
        return agent.fork(source, at, **stored)
    return asyncio.run(agent.afork(source, at, **stored))


def finished(run: AgentRun, driver: str) -> RunResult:
    """The run driven to its end on ``driver``."""
    return run.finish() if driver == "sync" else asyncio.run(run.afinish())


def replies_after(result: RunResult, at: int) -> int:
    """The model calls the run made after its transition ``at``."""
    return sum(1 for entry in result.trace[at + 1 :] if entry.trigger == "replied")


@pytest.mark.parametrize("limit", sorted(LIFTS))
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_past_the_resume_is_rebuilt_through_the_stop_without_a_call(
    store_target: str, driver: str, limit: str
) -> None:
    """Forked after the resume, from the snapshot or the stored run: nothing called to rebuild, the source's trace."""
    with open_store(store_target) as store:
        source, snapshot = source_run(limit, driver, store)
        assert source.reason == "done"
        resumed_at = [entry.trigger for entry in source.trace].index("resume")
        assert [at for at, _ in snapshot["earlier_limits"]] == [resumed_at]
        assert snapshot["earlier_limits"][0][1][limit] == LIFTS[limit][0]
        for kind in (snapshot, "src"):
            for at in range(resumed_at, len(source.trace) - 1):
                counts = Counts()
                run = forked(make_agent(counts, limit), driver, kind, at, store)
                assert (counts.model, counts.tool) == (0, 0), at
                assert tuple(run.trace) == source.trace[: at + 1]
                assert run.snapshot()["limits"][limit] == LIFTS[limit][1]
                result = finished(run, driver)
                assert result.trace == source.trace, at
                assert result.final == "6"
                assert (counts.model, counts.tool) == (replies_after(source, at), 0), at  # each call reused
        assert store.load(f"f{resumed_at}")["forked_from"] == ["src", resumed_at]


@pytest.mark.parametrize("limit", sorted(LIFTS))
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_before_the_stop_runs_under_the_limits_of_its_time(store_target: str, driver: str, limit: str) -> None:
    """Forked before the stop, the fork stops where the source did, and resumed as the source was it ends the same."""
    with open_store(store_target) as store:
        source, snapshot = source_run(limit, driver, store)
        stop = next(i for i, entry in enumerate(source.trace) if entry.dest == "Failed")
        for kind in (snapshot, "src"):
            counts = Counts()
            agent = make_agent(counts, limit)
            run = forked(agent, driver, kind, stop - 2, store)
            assert (counts.model, counts.tool) == (0, 0)
            stopped = finished(run, driver)
            assert (stopped.reason, stopped.trace) == (limit, source.trace[: stop + 1])
            assert (counts.model, counts.tool) == (replies_after(source, stop - 2) - replies_after(source, stop), 0)
            result = finished(agent.resume(stopped, **{limit: LIFTS[limit][1]}), driver)
            assert result.trace == source.trace
            assert counts.tool == 0  # the fork's own calls: the source's results, reused


def test_a_fork_at_the_stop_lifts_it_with_its_edit_as_the_source_was_lifted(tmp_path: Any) -> None:
    """At the stop the fork has the limits of its time; ``ForkEdit(limits=...)`` lifts them as the resume did."""
    with open_store(str(tmp_path / "runs.db")) as store:
        source, snapshot = source_run("max_steps", "sync", store)
    stop = next(i for i, entry in enumerate(source.trace) if entry.dest == "Failed")
    counts = Counts()
    agent = make_agent(counts, "max_steps")
    with pytest.raises(ForkError, match="do not lift"):
        agent.fork(snapshot, stop)
    run = agent.fork(snapshot, stop, edit=ForkEdit(limits={"max_steps": 10}))
    result = run.finish()
    assert result.trace == source.trace
    assert [at for at, _ in run.snapshot()["earlier_limits"]] == [stop + 1]
    assert counts.tool == 0


def test_a_run_resumed_twice_forks_past_both_and_so_does_a_fork_of_its_fork() -> None:
    """Each resume keeps the limits before it: forks between and after the two rebuild as the source ran."""
    agent = make_agent(Counts(), "max_steps")
    run = agent.resume(agent.run("go"), max_steps=4)
    run = agent.resume(run.finish(), max_steps=10)
    source, snapshot = run.finish(), run.snapshot()
    resumes = [i for i, entry in enumerate(source.trace) if entry.trigger == "resume"]
    assert [(at, was["max_steps"]) for at, was in snapshot["earlier_limits"]] == list(zip(resumes, (2, 4), strict=True))
    counts = Counts()
    agent = make_agent(counts, "max_steps")
    between = agent.fork(snapshot, resumes[0] + 2).finish()  # under max_steps=4 it stops where the source stopped again
    assert (between.reason, between.trace) == ("max_steps", source.trace[: resumes[1]])
    first = agent.fork(snapshot, resumes[1] + 2)
    assert first.finish().trace == source.trace
    second = agent.fork(first.snapshot(), resumes[1] + 4).finish()
    assert second.trace == source.trace
    assert counts.tool == 0


def test_a_snapshot_from_before_earlier_limits_were_kept_forks_only_up_to_the_stop(tmp_path: Any) -> None:
    """Without ``earlier_limits`` (an old snapshot, a finished ``RunResult``) a fork is taken before the stop only."""
    with open_store(str(tmp_path / "runs.db")) as store:
        source, snapshot = source_run("max_steps", "sync", store)
    old = {k: v for k, v in snapshot.items() if k != "earlier_limits"}
    stop = next(i for i, entry in enumerate(source.trace) if entry.dest == "Failed")
    counts = Counts()
    agent = make_agent(counts, "max_steps")
    assert tuple(agent.fork(old, stop - 1).trace) == source.trace[:stop]
    for at in (stop, stop + 1, len(source.trace) - 2):
        with pytest.raises(ForkError, match=f"at transition {stop} it took ExecuteTool->Failed\\[max_steps\\]"):
            agent.fork(old, at)
    assert source.snapshot is None  # ended in Done: forked from its messages, under the agent's limits, none kept
    assert tuple(agent.fork(source, stop - 1).trace) == source.trace[:stop]
    with pytest.raises(
        ForkError, match=r"resumed at transition .* RunResult that ended in Done: fork run.snapshot\(\)"
    ):
        agent.fork(source, stop + 1)
    assert (counts.model, counts.tool) == (0, 0)


@pytest.mark.parametrize(
    ("earlier", "match"),
    [
        ([[3, None]], "earlier_limits must list"),
        ([["8", "LIMITS"]], "earlier_limits must list"),
        ([[3, "LIMITS"]], "not the trace's resume edges"),
        ([[99, "LIMITS"]], "not the trace's resume edges"),
    ],
)
def test_a_snapshot_whose_earlier_limits_are_malformed_or_misplaced_is_refused(
    tmp_path: Any, earlier: list[list[Any]], match: str
) -> None:
    """Each entry is the index of a resume edge of the trace and whole limits; anything else is a ``SnapshotError``."""
    with open_store(str(tmp_path / "runs.db")) as store:
        _, snapshot = source_run("max_steps", "sync", store)
    entries = [[at, snapshot["limits"] if was == "LIMITS" else was] for at, was in earlier]
    agent = make_agent(Counts(), "max_steps")
    with pytest.raises(SnapshotError, match=match):
        agent.resume({**snapshot, "earlier_limits": entries})
    if "must list" in match:  # a fork reads the limits before it loads a snapshot: it refuses them as well
        with pytest.raises(SnapshotError, match=match):
            agent.fork({**snapshot, "earlier_limits": entries}, 0)
