"""Deps in a batch: one shared object or a factory per item, made where each run executes (on Ray: in the worker)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import deps_agents
from support.deps_agents import Held, deps_agent, held_for, no_deps_for

from fsm_agent import AgentLoopError, CancelToken, SqliteStore
from fsm_agent.batch import batch_items, run_batch

TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_count() -> None:
    deps_agents.EXECUTED.clear()


def test_one_deps_object_is_shared_by_every_run_of_a_local_batch(tmp_path: Path) -> None:
    """deps= reaches the tools of each run, as the same object, in this process."""
    shared = Held("shared")
    results = run_batch(
        deps_agent, ["a", "b", "c"], store=tmp_path / "runs.db", executor="local", progress=False, deps=shared
    )
    assert [r.reason for r in results] == ["done"] * 3
    assert {r.final for r in results} == {f"shared pid={os.getpid()} | shared pid={os.getpid()}"}
    assert sorted(deps_agents.EXECUTED) == ["shared:0"] * 3 + ["shared:1"] * 3


def test_a_deps_factory_gives_each_run_its_own(tmp_path: Path) -> None:
    """make_deps(item) is called for each run: each run's tools see the deps of their own item."""
    results = run_batch(
        deps_agent, ["a", "b"], store=tmp_path / "runs.db", executor="local", progress=False, make_deps=held_for
    )
    assert [r.final.split(" pid=")[0] for r in results] == ["item 0", "item 1"]
    assert sorted(deps_agents.EXECUTED) == ["item 0:0", "item 0:1", "item 1:0", "item 1:1"]


def test_a_deps_factory_that_raises_is_that_runs_error_result(tmp_path: Path) -> None:
    """A factory failing for an item ends that run as an error result naming why; no tool runs."""
    (result,) = run_batch(
        deps_agent, ["a"], store=tmp_path / "runs.db", executor="local", progress=False, make_deps=no_deps_for
    )
    assert result.reason == "error"
    assert result.evidence["type"] == "ConnectionError"
    assert "no database for 'a'" in result.evidence["error"]
    assert deps_agents.EXECUTED == []


def test_a_run_a_batch_resumes_is_given_its_deps_again(tmp_path: Path) -> None:
    """A run cut after its first call is resumed by the batch with fresh deps; no call is made twice."""
    store_path = tmp_path / "runs.db"
    (item,) = batch_items(["a"])
    token = CancelToken()
    with SqliteStore(store_path) as store:
        run = deps_agent().start(item.input, store=store, run_id=item.run_id, cancel=token, deps=Held("before"))
        while not run.steps:
            run.advance()  # up to the first call's outcome
        token.cancel("cut")
        with pytest.raises(AgentLoopError, match="cancelled"):  # a stop the batch resumes by itself
            run.finish()
    assert deps_agents.EXECUTED == ["before:0"]
    (result,) = run_batch(deps_agent, ["a"], store=store_path, executor="local", progress=False, make_deps=held_for)
    assert result.reason == "done"
    assert deps_agents.EXECUTED == ["before:0", "item 0:1"]
    before, after = result.final.split(" | ")
    assert before.startswith("before pid=")
    assert after.startswith("item 0 pid=")


def test_a_shared_deps_object_on_ray_is_refused_before_any_run(tmp_path: Path) -> None:
    """Ray workers are other processes: deps= there is a TypeError pointing at make_deps, and nothing runs."""
    with pytest.raises(TypeError, match="make_deps="):
        run_batch(deps_agent, ["a"], store=tmp_path / "runs.db", progress=False, deps=Held("x"))
    assert not (tmp_path / "runs.db").exists()


def test_deps_and_a_deps_factory_together_are_refused(tmp_path: Path) -> None:
    """One way to give deps: both is a ValueError; a factory that is not callable a TypeError."""
    with pytest.raises(ValueError, match="not both"):
        run_batch(deps_agent, ["a"], store=tmp_path / "r.db", executor="local", deps=Held("x"), make_deps=held_for)
    with pytest.raises(TypeError, match="make_deps must be a function"):
        run_batch(deps_agent, ["a"], store=tmp_path / "r.db", executor="local", make_deps=Held("x"))  # type: ignore[arg-type]


@pytest.mark.ray
@pytest.mark.usefixtures("cluster")
def test_on_ray_each_worker_builds_the_deps_of_its_runs(tmp_path: Path) -> None:
    """make_deps is shipped to the workers and called there: deps that cannot pickle reach tools in other processes."""
    results = run_batch(deps_agent, ["a", "b", "c"], store=tmp_path / "runs.db", progress=False, make_deps=held_for)
    assert [r.reason for r in results] == ["done"] * 3, [r.evidence for r in results]
    for index, result in enumerate(results):
        first, second = result.final.split(" | ")
        assert first.startswith(f"item {index} pid=")
        assert second.startswith(f"item {index} pid=")
        assert first.split("pid=")[1] != str(os.getpid())
    assert deps_agents.EXECUTED == []  # nothing ran in this process
