"""A sub-agent call's exchange keeps what cuts of it counted (``cut``): a fork counts its source's figures exactly.

docs/how-to/fork-a-run.md: a cut of a sub-agent call in flight counts what
its child's run spent so far, and the call's later outcome brings only the
rest.  The run adds up what every cut of the call counted
(``cut_counted`` in its snapshot) and, when an outcome answers the call,
moves that total onto the call's exchange, which its recording keeps as
the call's ``cut``.  A fork, which counts no cut, counts the outcome and
its ``cut``: exactly what its source counted of the call, the run's own
``spent`` not needed.  A malformed ``cut`` is refused, naming the field.

The tree is ``support.forkspend_tree``'s; every tool execution and model
call is counted, on both drivers and both stores.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from support.forkcount_cuts import answered_at
from support.forkspend_tree import SPENT, cut, driven, forked_from, parent_agent, spent, stored_cut_then_finished
from support.prepaid_cuts import EVERY_CALL, FIRST_CUT, WHOLE
from support.storeless_children import Counts

from fsm_agent import SnapshotError
from fsm_agent.persist import open_store
from fsm_agent.persist.recording_format import RecordingError, read_recording

DRIVERS = ["sync", "async"]
TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")


def _as_json(data: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(data))
    return loaded


def _without_spent(recording: dict[str, Any]) -> dict[str, Any]:
    """``recording`` with no ``spent`` at any level: its calls' ``cut`` kept."""
    kept = {k: v for k, v in recording.items() if k != "spent"}
    kept["children"] = {call_id: _without_spent(child) for call_id, child in recording["children"].items()}
    return kept


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cut_call_s_total_moves_from_the_run_onto_the_exchange_that_answers_it(
    store_target: str, driver: str
) -> None:
    """Stored at the cut, the run holds what the cut counted of ``c1`` (``cut_counted``); once ``c1`` is answered
    the run holds none and the call's exchange has it, so the parent's counts are its replies' usage plus, for
    ``c1``, the outcome and its ``cut``: each tool call of the tree ran once."""
    counts = Counts()
    with open_store(store_target) as store:
        cut(counts, driver, store=store)
        assert counts.tools == FIRST_CUT
        stopped = _as_json(store.load("p"))
        assert set(stopped["cut_counted"]) == {"c1"}
        counted = stopped["cut_counted"]["c1"]
        assert counted["input_tokens"] > 0
        assert counted["tool_calls"] > 0
        counts.hold = False
        result, _ = driven(parent_agent(counts, driver), driver, "resume", store=store, source=stopped)
        assert result.final == "done"
        assert counts.tools == EVERY_CALL
        final = _as_json(store.load("p"))
        recording = store.export("p")
    assert final["cut_counted"] == {}
    assert final["cut_children"] == {}
    (exchange,) = [item for item in final["io"] if item.get("id") == "c1"]
    assert exchange["cut"] == counted
    (call,) = recording["tool_calls"]
    assert call["cut"] == counted
    brought = call["result"]["child"]
    replies = [model_call["reply"]["usage"] for model_call in recording["model_calls"]]
    whole = spent(final["counters"])
    for name in TOKENS:
        assert whole[name] == sum(usage[name] for usage in replies) + brought[name] + counted[name]
    assert whole["tool_calls"] == WHOLE == 1 + brought["tool_calls"] + counted["tool_calls"]
    assert whole["priced"] == len(replies) + brought["priced_calls"] + counted["priced_calls"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_of_a_recording_without_spent_counts_its_source_exactly_from_the_calls_cut(
    store_target: str, driver: str
) -> None:
    """The stored cut source's recording with no ``spent`` at any level, forked just after ``c1``'s answer: each
    token part, the dollars, the priced model calls and the tool calls are the source's there; it ran no tool and
    asked no sub-agent's model."""
    counts = Counts()
    with open_store(store_target) as store:
        seen = stored_cut_then_finished(counts, driver, store)
        recording = _without_spent(store.export("p"))
    assert recording["tool_calls"][0]["cut"] is not None
    at = answered_at(recording)
    rebuilt, source = spent(forked_from(counts, driver, recording, at)[at]), spent(seen[at])
    assert set(rebuilt) == set(SPENT)
    for name in (*TOKENS, "priced", "unpriced", "tool_calls"):
        assert rebuilt[name] == source[name], name
    assert rebuilt["cost"] == pytest.approx(source["cost"], rel=0, abs=1e-12)


BAD = {
    "a text": ("all of it", "recording field tool_calls[0].cut must be an object of counts or null, got str"),
    "negative tokens": ({"input_tokens": -1}, "tool_calls[0].cut.input_tokens must be a whole number >= 0, got -1"),
    "fractional calls": ({"tool_calls": 0.5}, "tool_calls[0].cut.tool_calls must be a whole number >= 0, got 0.5"),
    "negative cost": ({"cost": -0.5}, "tool_calls[0].cut.cost must be None or a finite number of US dollars"),
    "a stop": ({"stop": {"reason": "timeout"}}, "tool_calls[0].cut must name its run and no stop"),
    "an unknown count": ({"tokens": 3}, "recording field tool_calls[0].cut: "),
}


@pytest.mark.parametrize(("change", "named"), BAD.values(), ids=BAD)
def test_a_recording_whose_cut_is_malformed_is_refused_naming_the_field(
    tmp_path: Path, change: Any, named: str
) -> None:
    """Each malformed ``cut`` of a recorded call is a ``RecordingError`` naming it; the one kept is read."""
    counts = Counts()
    with open_store(str(tmp_path / "runs.db")) as store:
        stored_cut_then_finished(counts, "sync", store)
        assert counts.tools == EVERY_CALL
        top = store.export("p")
    read_recording(copy.deepcopy(top))
    kept = top["tool_calls"][0]["cut"]
    bad = copy.deepcopy(top)
    bad["tool_calls"][0]["cut"] = {**kept, **change} if isinstance(change, dict) else change
    with pytest.raises(RecordingError) as caught:
        read_recording(bad)
    assert named in str(caught.value)


def test_a_snapshot_whose_exchange_cut_is_malformed_is_refused(tmp_path: Path) -> None:
    """A stored run's exchange with a negative ``cut`` count is a ``SnapshotError`` naming the exchange, at a
    resume, before anything runs; the one kept resumes."""
    counts = Counts()
    with open_store(str(tmp_path / "runs.db")) as store:
        stored_cut_then_finished(counts, "sync", store)
        assert counts.tools == EVERY_CALL
        data = _as_json(store.load("p"))
    index = next(i for i, item in enumerate(data["io"]) if item.get("id") == "c1")
    data["io"][index]["cut"]["priced_calls"] = -2
    with pytest.raises(SnapshotError, match=r"cut\.priced_calls must be a whole number >= 0, got -2"):
        parent_agent(counts, "sync").resume(data)
    assert counts.tools == EVERY_CALL
