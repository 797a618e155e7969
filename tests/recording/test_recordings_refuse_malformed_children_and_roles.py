"""A recorded sub-agent outcome or message of the wrong kind is a ``RecordingError`` naming it, before anything runs.

A child's counts are added to its parent's counters, and a message's role
decides where it goes: either of the wrong kind failed in the middle of the
replay, far from the field (``TypeError`` in the ledger, ``ValueError``
about ``history[0]``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, SqliteStore, ToolRegistry
from fsm_agent.persist.recording import RecordingError
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn
from fsm_agent.testing.replay import replay


def _registry_with_a_sub_agent() -> ToolRegistry:
    registry = demo_registry()
    registry.register(Agent(FakeModel(reply("kid")), demo_registry()).as_tool("kid", "a sub-agent"))
    return registry


def _recording(tmp_path: Path) -> dict[str, Any]:
    """A recording of a run that called ``add`` and a sub-agent ``kid``, then answered."""
    model = FakeModel(tool_turn(tool_call("add", id="c1", a=2, b=3), tool_call("kid", id="k1", input="hi")), reply("5"))
    with SqliteStore(tmp_path / "runs.db") as store:
        Agent(model, _registry_with_a_sub_agent(), system="s").run("q", store=store, run_id="x")
        return store.export("x")


def test_a_recorded_child_outcome_of_the_wrong_kind_is_a_recording_error_before_anything_runs(tmp_path: Path) -> None:
    recording = _recording(tmp_path)
    bad = copy.deepcopy(recording)
    kid = next(call for call in bad["tool_calls"] if call["id"] == "k1")
    kid["result"]["child"]["input_tokens"] = "many"  # a count that is text
    unused = FakeModel()
    with pytest.raises(RecordingError, match=r"tool_calls\[\d\]\.result"):
        replay(Agent(unused, _registry_with_a_sub_agent(), system="s"), bad)


def test_a_recorded_message_with_an_unknown_role_is_a_recording_error_naming_the_field(tmp_path: Path) -> None:
    recording = _recording(tmp_path)
    bad = copy.deepcopy(recording)
    bad["messages"][0]["role"] = "narrator"  # the system prompt, under a role no message has
    with pytest.raises(RecordingError, match=r"messages\[0\]"):
        replay(Agent(FakeModel(), _registry_with_a_sub_agent(), system="s"), bad)
