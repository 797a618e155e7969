"""Bad arguments to a batch are a clear error raised before anything starts: no model call, no store, no Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.batch_agents import MODEL_LOG, factory, lines

from fsm_agent.batch import iter_batch, run_batch
from fsm_agent.persist import StoreError


def _ray_started() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return bool(ray.is_initialized())


@pytest.mark.parametrize("executor", ["local", "ray"])
@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"max_in_flight": 0}, ValueError, "max_in_flight must be None or an integer >= 1, got 0"),
        ({"max_retries": -1}, ValueError, "max_retries must be an integer >= 0"),
        ({"make_agent": "mymodule:make_agent"}, TypeError, "make_agent must be a callable.*got str"),
        ({"store": "mysql://db/runs"}, StoreError, r"mysql:// is not a kind of store"),
        ({"make_deps": 3}, TypeError, "make_deps must be a function"),
        ({"store": None}, TypeError, "store must be a SQLite file path, a store URL or a store object.*got NoneType"),
    ],
    ids=[
        "max_in_flight-0",
        "max_retries-negative",
        "factory-not-callable",
        "unknown-store-kind",
        "deps-not-callable",
        "store-none",
    ],
)
def test_a_bad_argument_is_a_clear_error_and_nothing_starts(
    executor: str, change: dict[str, Any], error: type[Exception], match: str, tmp_path: Path
) -> None:
    """``run_batch`` raises naming the argument; no model call, no store file, no Ray instance started."""
    assert not _ray_started()
    arguments: dict[str, Any] = {
        "make_agent": factory(tmp_path),
        "store": str(tmp_path / "runs.db"),
        "executor": executor,
        "progress": False,
    }
    arguments.update(change)
    make = arguments.pop("make_agent")
    with pytest.raises(error, match=match):
        run_batch(make, ["question 0", "question 1"], **arguments)
    assert not lines(tmp_path / MODEL_LOG)
    assert not (tmp_path / "runs.db").exists()
    assert not _ray_started()


def test_iter_batch_refuses_a_bad_argument_when_called_not_at_its_first_result(tmp_path: Path) -> None:
    """The checks run as ``iter_batch`` is called, so a caller that never iterates still hears of the mistake."""
    with pytest.raises(ValueError, match="max_in_flight"):
        iter_batch(factory(tmp_path), ["question 0"], store=tmp_path / "runs.db", executor="local", max_in_flight=0)
    with pytest.raises(TypeError, match="make_agent"):
        iter_batch(None, [], store=tmp_path / "runs.db", executor="local")  # type: ignore[arg-type]


@pytest.mark.parametrize("store", [None, object(), {"path": "runs.db"}], ids=["none", "object", "dict"])
def test_a_local_batch_refuses_a_store_that_is_not_a_store_before_any_run(store: object, tmp_path: Path) -> None:
    """Refused up front, as ``agent.run(store=...)`` and the Ray executor refuse it; by ``iter_batch`` when called."""
    make = factory(tmp_path)
    kind = type(store).__name__
    with pytest.raises(TypeError, match=f"store must be .* got {kind}$"):
        run_batch(make, ["question 0", "question 1"], store=store, executor="local", progress=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=f"got {kind}$"):
        iter_batch(make, ["question 0"], store=store, executor="local")  # type: ignore[arg-type]
    assert not lines(tmp_path / MODEL_LOG)
