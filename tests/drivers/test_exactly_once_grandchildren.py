"""Exactly once two sub-agent levels down: a run cut inside its grandchild (Ctrl-C, a killed process) is resumed or
forked, and every completed call at every level is made once.

The agent (``support.exactly_once_audit``): the parent asks ``work("a")`` and
the ``outer`` sub-agent in one reply; the child asks ``work("c")`` and the
``inner`` sub-agent; the grandchild asks ``work("g")``.  docs/how-to/sub-agents.md
"A child belongs to its call": a parent resumed after a crash takes its
stored child, one under way goes on from its own checkpoint; that child in
turn takes its own stored child.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.exactly_once import ataken_over, taken_over
from support.exactly_once_audit import (
    LEASE,
    NESTED_EFFECTS,
    NESTED_FINAL,
    Cutter,
    Tally,
    cut_in_process,
    drive,
    durable_in,
    in_child,
    nested_agent,
)

from fsm_agent import Agent, AgentRun, RunResult
from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
WANTED = {"cut": ["a"], "cut/sub": ["c"]}
"""The calls durable before the grandchild's call is cut: the parent's and the child's own work."""


def _resumed(target: str, driver: str, agent: Agent) -> RunResult:
    """A new owner (a new store object) takes the stored parent over on ``driver`` once its lease lapsed."""
    with open_store(target, lease=LEASE) as store:
        if driver == "sync":
            return taken_over(lambda: agent.resume(store.load("cut"), store=store)).finish()

        async def go() -> RunResult:
            async def claim() -> AgentRun:
                return await agent.aresume(await store.aload("cut"), store=store)

            run = await ataken_over(claim)
            return await run.afinish()

        return asyncio.run(go())


def _every_level_done(target: str) -> None:
    with open_store(target) as store:
        for run_id in ("cut", "cut/sub", "cut/sub/gc"):
            assert store.load(run_id)["state"] == "Done", run_id


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_ctrl_c_inside_the_grandchild_s_call_is_finished_by_a_new_owner_each_completed_call_once(
    store_target: str, tmp_path: Path, cutter: str, resumer: str
) -> None:
    tally = Tally(tmp_path / "tally")
    store = open_store(store_target, lease=LEASE)
    with pytest.raises(KeyboardInterrupt):
        drive(nested_agent(tally, Cutter("g", durable_in(store_target, WANTED))), cutter, store, "cut")
    store.close()
    assert tally.counts("done") == {"a": 1, "c": 1}

    result = _resumed(store_target, resumer, nested_agent(tally))
    assert result.final == NESTED_FINAL
    assert tally.counts("done") == NESTED_EFFECTS
    assert tally.counts("try") == {"a": 1, "c": 1, "g": 2}  # only g, in flight at the cut, was made again
    # No model reply that was stored is asked again: each level's tool turn was kept.
    assert tally.counts("model") == {"parent": 2, "child": 2, "grand": 2}
    _every_level_done(store_target)


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_process_killed_inside_the_grandchild_s_call_is_finished_elsewhere_each_completed_call_once(
    store_target: str, tmp_path: Path, cutter: str, resumer: str
) -> None:
    tally = Tally(tmp_path / "tally")
    code = in_child(cut_in_process, store_target, cutter, str(tally.path), "g", WANTED)
    assert code == 9
    assert tally.counts("done") == {"a": 1, "c": 1}

    result = _resumed(store_target, resumer, nested_agent(tally))
    assert result.final == NESTED_FINAL
    assert tally.counts("done") == NESTED_EFFECTS
    assert tally.counts("try") == {"a": 1, "c": 1, "g": 2}
    assert tally.counts("model") == {"parent": 2, "child": 2, "grand": 2}
    _every_level_done(store_target)


@pytest.mark.slow
@pytest.mark.parametrize("resumer", DRIVERS)
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_ctrl_c_in_the_child_s_answer_after_its_grandchild_finished_reads_the_grandchild_back(
    store_target: str, tmp_path: Path, cutter: str, resumer: str
) -> None:
    """Cut while the child's model writes its answer: the grandchild had finished, and is never run again."""
    tally = Tally(tmp_path / "tally")
    store = open_store(store_target, lease=LEASE)
    with pytest.raises(KeyboardInterrupt):
        drive(nested_agent(tally, Cutter("answer:child")), cutter, store, "cut")
    store.close()
    assert tally.counts("done") == NESTED_EFFECTS

    result = _resumed(store_target, resumer, nested_agent(tally))
    assert result.final == NESTED_FINAL
    assert tally.counts("try") == NESTED_EFFECTS
    assert tally.counts("model") == {"parent": 2, "child": 3, "grand": 2}  # the child's answer was in flight
    _every_level_done(store_target)


@pytest.mark.parametrize("fork_driver", DRIVERS)
def test_a_fork_at_each_transition_of_a_parent_cut_in_its_grandchild_makes_only_the_grandchild_s_call(
    store_target: str, tmp_path: Path, fork_driver: str
) -> None:
    """The source was cut inside the grandchild's call: a fork at each transition of the parent takes a, c from the
    source's runs (two levels down, the child's c included) and makes only g."""
    source_tally = Tally(tmp_path / "source")
    store = open_store(store_target, lease=LEASE)
    with pytest.raises(KeyboardInterrupt):
        drive(nested_agent(source_tally, Cutter("g", durable_in(store_target, WANTED))), "sync", store, "cut")
    store.close()
    with open_store(store_target) as store:
        trace = len(store.load("cut")["trace"])
        for at in range(trace):
            tally = Tally(tmp_path / f"fork{at}")
            assert _fork(nested_agent(tally), store, at, fork_driver).final == NESTED_FINAL, at
            assert tally.counts("done") == {"g": 1}, at


@pytest.mark.parametrize("fork_driver", DRIVERS)
def test_a_fork_of_a_parent_cut_after_its_grandchild_finished_runs_no_call_of_the_grandchild(
    store_target: str, tmp_path: Path, fork_driver: str
) -> None:
    """Cut in the child's answer: the grandchild finished; a fork at each transition makes no tool call at all."""
    store = open_store(store_target, lease=LEASE)
    with pytest.raises(KeyboardInterrupt):
        drive(nested_agent(Tally(tmp_path / "source"), Cutter("answer:child")), "sync", store, "cut")
    store.close()
    with open_store(store_target) as store:
        for at in range(len(store.load("cut")["trace"])):
            tally = Tally(tmp_path / f"fork{at}")
            assert _fork(nested_agent(tally), store, at, fork_driver).final == NESTED_FINAL, at
            assert tally.counts("done") == {}, at
            assert tally.counts("model").get("grand", 0) == 0, at


def _fork(agent: Agent, store: Any, at: int, driver: str) -> RunResult:
    """A fork of the stored run ``cut`` at transition ``at``, as ``f<at>``, finished on ``driver``."""
    if driver == "sync":
        return agent.fork("cut", at, store=store, run_id=f"f{at}").finish()

    async def go() -> RunResult:
        return await (await agent.afork("cut", at, store=store, run_id=f"f{at}")).afinish()

    return asyncio.run(go())


def _made(tally: Tally, *labels: str) -> bool:
    done = tally.counts("done")
    return all(done.get(label, 0) >= 1 for label in labels)


@pytest.mark.slow
@pytest.mark.parametrize("every", ["turn", "transition"])
@pytest.mark.parametrize("cutter", DRIVERS)
def test_a_ctrl_c_inside_the_grandchild_keeps_every_level_s_completed_calls_whatever_the_store_s_every(
    store_target: str, tmp_path: Path, cutter: str, every: str
) -> None:
    """With ``every="turn"`` the outcomes of a and c are written by the Ctrl-C itself, at each level it passes."""
    tally = Tally(tmp_path / "tally")
    store = open_store(store_target, lease=LEASE, every=every)
    with pytest.raises(KeyboardInterrupt):
        drive(nested_agent(tally, Cutter("g", lambda: _made(tally, "a", "c"))), cutter, store, "cut")
    store.close()
    assert tally.counts("done") == {"a": 1, "c": 1}

    with open_store(store_target, lease=LEASE, every=every) as store:
        agent = nested_agent(tally)
        result = taken_over(lambda: agent.resume(store.load("cut"), store=store)).finish()
    assert result.final == NESTED_FINAL
    assert tally.counts("try") == {"a": 1, "c": 1, "g": 2}
    assert tally.counts("model") == {"parent": 2, "child": 2, "grand": 2}


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_model_error_after_a_nested_batch_is_retried_and_a_fork_rerunning_the_child_makes_no_call_again(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """The parent's answer fails (model_error) after every level's calls completed: ``retry=True`` asks the parent's
    model once more and makes no tool call; a fork with ``rerun={"sub"}`` has the child think again, taking c and its
    grandchild's answer from the source's child."""
    with open_store(store_target, lease=LEASE) as store:
        source = Tally(tmp_path / "source")
        stopped = drive(
            nested_agent(source, Cutter("answer:parent", how="error"), on_stop={"model_error": "return"}),
            driver,
            store,
            "cut",
        )
        assert stopped.reason == "model_error"
        assert source.counts("done") == NESTED_EFFECTS

        retried = Tally(tmp_path / "retried")
        agent = nested_agent(retried)
        if driver == "sync":
            result = agent.resume(store.load("cut"), store=store, retry=True).finish()
        else:

            async def go() -> RunResult:
                return await (await agent.aresume(await store.aload("cut"), store=store, retry=True)).afinish()

            result = asyncio.run(go())
        assert result.final == NESTED_FINAL
        assert retried.counts("try") == {}
        assert retried.counts("model") == {"parent": 1}

        forked = Tally(tmp_path / "forked")
        fork = nested_agent(forked).fork("cut", 2, store=store, run_id="f", rerun={"sub"}).finish()
        assert fork.final == NESTED_FINAL
        assert forked.counts("try") == {}
        assert forked.counts("model") == {"parent": 1, "child": 2}  # the child thought again; the grandchild did not
        child = store.load("f/sub")
        assert [s["reused_from"] for s in child["steps"] if s["kind"] == "tool_call"] == ["cut/sub/c", "cut/sub/gc"]
