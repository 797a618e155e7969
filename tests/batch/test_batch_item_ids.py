"""A batch's inputs get their run ids before anything runs: clashes refused, any text an id.

``derive_run_id`` is what makes a batch resumable: every ``str`` input
(half an emoji included, which the store keeps) needs one, and an explicit
``run_id`` that clashes with a derived one is a clash like any other.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.batch import batch_items, derive_run_id, run_batch
from fsm_agent.testing import reply
from fsm_agent.tools import JSONSchema


class _Echo:
    def complete(self, messages: list[Message], tools: list[JSONSchema]) -> ModelResponse:
        return reply("heard " + next(m.content for m in messages if m.role == "user"))


def _echo_agent() -> Agent:
    return Agent(_Echo(), ToolRegistry())


def test_an_explicit_run_id_equal_to_another_inputs_derived_id_is_refused_before_any_run(tmp_path: Path) -> None:
    """Input 1 asks for the id input 0 derives: a ValueError naming both, no store opened."""
    clash = [{"input": "b", "run_id": derive_run_id(0, "a")}]
    with pytest.raises(ValueError, match="inputs 0 and 1 share run_id"):
        run_batch(_echo_agent, ["a", *clash], store=tmp_path / "runs.db", executor="local", progress=False)
    assert not (tmp_path / "runs.db").exists()


@pytest.mark.parametrize("run_id", ["a\x00b", "half\ud83d", "x" * 1025], ids=["nul", "half-an-emoji", "too-long"])
def test_a_run_id_no_store_can_hold_is_refused_before_any_run(tmp_path: Path, run_id: str) -> None:
    """Input 2's run id is one every store refuses: a ValueError naming it, before the first run, no store opened."""
    inputs = ["a", "b", {"input": "c", "run_id": run_id}, "d"]
    with pytest.raises(ValueError, match=r"^input 2: run_id"):
        run_batch(_echo_agent, inputs, store=tmp_path / "runs.db", executor="local", progress=False)
    assert not (tmp_path / "runs.db").exists()


def test_a_null_run_id_is_derived_as_if_absent() -> None:
    """``"run_id": null`` is no run id: the input gets the id of its position and text."""
    assert batch_items([{"input": "q", "run_id": None}]) == batch_items(["q"])


def test_an_input_with_half_an_emoji_gets_a_run_id_and_runs(tmp_path: Path) -> None:
    """A lone surrogate in a str input: the store keeps such text (with a run_id given it runs), so it gets an id."""
    given = run_batch(_echo_agent, [{"input": "half \ud83d", "run_id": "mine"}], store=tmp_path / "given.db",
                      executor="local", progress=False)  # fmt: skip
    assert [r.final for r in given] == ["heard half \ud83d"]
    derived = run_batch(_echo_agent, ["half \ud83d"], store=tmp_path / "runs.db", executor="local", progress=False)
    assert [r.final for r in derived] == ["heard half \ud83d"]
