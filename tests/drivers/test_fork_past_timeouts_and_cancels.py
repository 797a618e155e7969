"""A fork taken past a ``timeout`` or ``cancelled`` stop of its source: the stop rebuilt where it was, nothing called.

Each source (``support.fork_past_cuts``) is stored (SQLite, then
PostgreSQL), cut by its timeout while ``c1`` runs (sync or async driver), by
its cancel token (sync or async), or by a bare ``task.cancel()`` with ``c1``
or its second model call in flight, then resumed to its end.  Forks on both
drivers, taken after the cut and at the stop itself, must rebuild the
source calling no tool and no model (fresh counters, read before the fork
is driven), make each call past the fork point once, leave the source as
stored, and hold the source's trace up to the fork point; a fork of such a
fork too.  The command line's ``runs fork`` on such a source:
``tests/cli/test_runs_fork_past_cuts.py``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from support.fork_past_cuts import ANSWER, LIFTED, SOURCES, Model, Tool, after_the_cut, agent, cut_source

from fsm_agent import ForkEdit, ForkError, RunResult, Transition
from fsm_agent.persist import open_store

DRIVERS = ("sync", "async")

CUT_BY = [pytest.param(how, marks=pytest.mark.slow) if how.startswith("timeout") else how for how in SOURCES]
"""``SOURCES``, those cut by their timeout marked ``slow``: each waits its 0.5 s deadline out."""

CUT_IN_FLIGHT = {"timeout-sync", "timeout-async", "task-cut-tool"}
"""The sources whose ``c1`` was cut in flight (its result lost), so their resume made it again."""


def forked_and_finished(driver: str, store: Any, source: str, at: int, **keywords: Any) -> RunResult:
    """``source`` forked at ``at`` on ``driver`` by a fresh counting agent, checked to have called nothing, finished."""
    model, tool = keywords.pop("model"), keywords.pop("tool")
    forking = agent(model, tool)
    if driver == "sync":
        run = forking.fork(source, at, store=store, **keywords)
        assert (model.asked, tool.ran) == (0, Counter()), "the rebuild called the fork's model or tools"
        return run.finish()

    async def both() -> RunResult:
        run = await forking.afork(source, at, store=store, **keywords)
        assert (model.asked, tool.ran) == (0, Counter()), "the rebuild called the fork's model or tools"
        return await run.afinish()

    return asyncio.run(both())


def replied_after(trace: tuple[Transition, ...], at: int) -> int:
    """How many model calls came back with a reply after transition ``at``."""
    return sum(1 for t in trace[at + 1 :] if t.source == "AwaitModel" and t.trigger == "replied")


def stop_of(cut: dict[str, Any]) -> tuple[int, str]:
    """The index and reason of the stop a source was cut with."""
    return len(cut["trace"]) - 1, cut["reason"]


@pytest.mark.parametrize("how", CUT_BY)
def test_a_fork_after_the_cut_rebuilds_the_stop_and_its_resume_calling_nothing_then_makes_each_later_call_once(
    store_target: str, how: str
) -> None:
    """Forked where c2 came back (rerun all): no call rebuilding; c3 and the last two model calls once; same trace."""
    with open_store(store_target) as store:
        cut, source, source_model, source_tool = cut_source(how, store)
        stop, reason = stop_of(cut)
        assert (source.reason, source.final, reason) == ("done", ANSWER, "timeout" if "timeout" in how else "cancelled")
        assert source.trace[stop + 1].trigger == "resume"
        again = 2 if how in CUT_IN_FLIGHT else 1
        assert source_tool.ran == Counter({"c1": again, "c2": 1, "c3": 1})
        assert source_model.asked == (5 if how == "task-cut-model" else 4)
        stored = store.export("src")
        at = after_the_cut(source.trace)
        assert at > stop + 1
        for driver in DRIVERS:
            model, tool = Model(), Tool()
            fork = forked_and_finished(
                driver, store, "src", at, model=model, tool=tool,
                run_id=f"fork-{driver}", rerun="all",
            )  # fmt: skip
            assert (fork.reason, fork.final) == ("done", ANSWER)
            assert (model.asked, tool.ran) == (2, Counter({"c3": 1}))
            assert fork.trace[: at + 1] == source.trace[: at + 1]
            assert fork.trace == source.trace
            assert fork.messages == source.messages
            assert store.export("src") == stored
            assert store.load(f"fork-{driver}")["forked_from"] == ["src", at]


@pytest.mark.parametrize("how", CUT_BY)
def test_a_fork_of_such_a_fork_taken_at_the_inherited_resume_rebuilds_both_calling_nothing(
    store_target: str, how: str
) -> None:
    """The fork's history holds the source's stop and resume: forking it there reuses every call; models asked once."""
    with open_store(store_target) as store:
        cut, source, _, _ = cut_source(how, store)
        stop, _ = stop_of(cut)
        at = after_the_cut(source.trace)
        for driver in DRIVERS:
            model, tool = Model(), Tool()
            first = forked_and_finished(driver, store, "src", at, model=model, tool=tool, run_id=f"fork-{driver}")
            assert (model.asked, tool.ran) == (2, Counter())  # c3 taken from the source (its step says reused_from)
            stored = store.export(f"fork-{driver}")
            model, tool = Model(), Tool()
            second = forked_and_finished(
                driver, store, f"fork-{driver}", stop + 1, model=model, tool=tool,
                run_id=f"again-{driver}",
            )  # fmt: skip
            assert (second.reason, second.final) == ("done", ANSWER)
            assert (model.asked, tool.ran) == (replied_after(source.trace, stop + 1), Counter())
            assert second.trace[: stop + 2] == first.trace[: stop + 2] == source.trace[: stop + 2]
            assert second.trace == source.trace
            assert store.export(f"fork-{driver}") == stored
            assert store.load(f"again-{driver}")["forked_from"] == [f"fork-{driver}", stop + 1]


@pytest.mark.parametrize("how", CUT_BY)
def test_a_fork_at_the_stop_itself_goes_on_from_it_making_each_later_call_once(store_target: str, how: str) -> None:
    """At a timeout stop the fork goes on when its edit lifts the timeout; at a cancelled one with a token not
    cancelled (here none); each call past the stop made once (rerun all), the cut one too."""
    with open_store(store_target) as store:
        cut, source, _, _ = cut_source(how, store)
        stop, reason = stop_of(cut)
        stored = store.export("src")
        edit = ForkEdit(limits={"timeout": LIFTED}) if reason == "timeout" else None
        expected = Counter({"c1": 1, "c2": 1, "c3": 1} if how in CUT_IN_FLIGHT else {"c2": 1, "c3": 1})
        for driver in DRIVERS:
            model, tool = Model(), Tool()
            fork = forked_and_finished(
                driver, store, "src", stop, model=model, tool=tool,
                run_id=f"fork-{driver}", rerun="all", edit=edit,
            )  # fmt: skip
            assert (fork.reason, fork.final) == ("done", ANSWER)
            assert (model.asked, tool.ran) == (replied_after(source.trace, stop), expected)
            assert fork.trace[: stop + 1] == source.trace[: stop + 1]
            assert fork.trace == source.trace
            assert store.export("src") == stored
            # Its own resume at the stop (under the lifted timeout) is rebuilt as recorded by a fork of it.
            model, tool = Model(), Tool()
            at = after_the_cut(fork.trace)
            again = forked_and_finished(driver, store, f"fork-{driver}", at, model=model, tool=tool)
            assert (again.reason, again.final, again.trace) == ("done", ANSWER, source.trace)
            assert (model.asked, tool.ran) == (2, Counter())  # c3 taken from the fork, its step says reused_from
            assert [step.reused_from for step in again.steps if step.kind == "tool_call"][-1] == f"fork-{driver}/c3"


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_at_a_timeout_stop_its_edit_does_not_lift_says_so_and_stores_nothing(
    store_target: str, driver: str
) -> None:
    """The rebuilt stop is the source's, under the source's timeout: without a higher one, a ForkError naming what
    a fork at a stop goes on from (timeout and cancelled among them); nothing called, nothing stored."""
    with open_store(store_target) as store:
        cut, _, _, _ = cut_source(f"timeout-{driver}", store)
        stop, _ = stop_of(cut)
        model, tool = Model(), Tool()
        with pytest.raises(ForkError) as refused:
            forked_and_finished(driver, store, "src", stop, model=model, tool=tool, run_id="fork")
        said = str(refused.value)
        assert "stopped with 'timeout', which these limits do not lift" in said
        assert "goes on from timeout, " in said
        assert "from cancelled with a cancel token not cancelled" in said
        assert (model.asked, tool.ran) == (0, Counter())
        assert [run.run_id for run in store.list_runs()] == ["src"]


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_just_before_a_timeout_stop_starts_with_no_seconds_and_goes_on(store_target: str, driver: str) -> None:
    """Forked at the transition that sent the cut ``c1``: the source's deadline is past the fork point, not met.

    The rebuild used to meet the stop recorded at the next transition as soon
    as the fork point was taken, so the fork started with the source's whole
    timeout spent and stopped at once, calling nothing.
    """
    with open_store(store_target) as store:
        cut, source, _, _ = cut_source(f"timeout-{driver}", store)
        stop, _ = stop_of(cut)
        model, tool = Model(), Tool()
        fork = forked_and_finished(driver, store, "src", stop - 1, model=model, tool=tool, run_id="fork")
    assert (fork.reason, fork.final) == ("done", ANSWER)
    assert fork.trace[:stop] == source.trace[:stop]
    assert fork.steps[0].counters["seconds"][0] < cut["limits"]["timeout"]
