"""A store's arguments of the wrong type are errors naming the argument, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fsm_agent import Agent
from fsm_agent.persist import PostgresStore, open_store
from fsm_agent.testing import FakeModel, reply


def test_list_runs_since_a_text_is_a_type_error_naming_since(store_target: str) -> None:
    """``since="2h"`` (the command line's form, not the API's): a TypeError naming since, as limit/offset do."""
    store = open_store(store_target)
    try:
        Agent(FakeModel(reply("hi")), []).run("q", store=store, run_id="r1")
        with pytest.raises(TypeError, match="since"):
            store.list_runs(since="2h")  # type: ignore[arg-type]
    finally:
        store.close()


def test_list_runs_paging_values_are_refused_naming_them(store_target: str) -> None:
    """A negative, fractional or textual limit or offset is a ValueError naming it (not an empty or whole list)."""
    store = open_store(store_target)
    try:
        Agent(FakeModel(reply("hi")), []).run("q", store=store, run_id="r1")
        for name, value in (("limit", -1), ("limit", 1.5), ("limit", "3"), ("offset", -1), ("offset", True)):
            with pytest.raises(ValueError, match=f"{name} must be"):
                store.list_runs(**{name: value})
        with pytest.raises(ValueError, match="older_than must be >= 0"):
            store.delete_finished(older_than=-1)
        assert [run.run_id for run in store.list_runs()] == ["r1"]
    finally:
        store.close()


CASES: list[tuple[str, Callable[[], Any], str]] = [
    ("PostgresStore(3)", lambda: PostgresStore(3), "dsn"),  # type: ignore[arg-type]
    ("delete_finished('x')", lambda: open_store(":memory:").delete_finished(older_than="x"), "older_than"),
]


@pytest.mark.parametrize(("given", "call", "named"), CASES, ids=[case[0] for case in CASES])
def test_a_store_argument_of_the_wrong_type_names_the_argument(given: str, call: Callable[[], Any], named: str) -> None:
    """``PostgresStore(3)`` says "argument of type 'int' is not iterable"; the message must name the argument."""
    with pytest.raises((TypeError, ValueError)) as refused:
        call()
    assert named in str(refused.value), f"{given}: {refused.value!r}"
