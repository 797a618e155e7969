"""A recording keeps what its run spent as its counters say (``spent``), checked as it is read, optional.

docs/how-to/test-from-recordings.md: ``spent`` holds the run's tokens and
each part, its cost (null where a model call was unpriced), its priced and
unpriced model calls and its tool calls, for every nested run too; a fork
reads it to count a cut sub-agent call's whole run (fork-a-run.md).  A
malformed one is a ``RecordingError`` naming the field; a recording
exported before it (and each call's ``cut``) was kept has none, and a fork
of it counts what each outcome brought of tokens, dollars and model calls,
as before (its tool calls still whole, counted from the recorded calls).

The tree is ``support.forkspend_tree``'s; every tool execution and model
call is counted, on both drivers and both stores.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.forkcount_cuts import answered_at
from support.forkspend_tree import PRICES, SPENT, driven, forked_from, parent_agent, spent, stored_cut_then_finished
from support.prepaid_cuts import EVERY_CALL, WHOLE
from support.storeless_children import Counts

from fsm_agent import Usage
from fsm_agent.persist import open_store
from fsm_agent.persist.recording import RecordingError, read_recording

DRIVERS = ["sync", "async"]


def _without_spent(recording: dict[str, Any]) -> dict[str, Any]:
    """``recording`` as exported before ``spent``, its calls' ``cut`` and its ``cut_shares`` were kept: none at any
    level."""
    older = {k: v for k, v in recording.items() if k not in ("spent", "cut_shares")}
    older["tool_calls"] = [{k: v for k, v in call.items() if k != "cut"} for call in recording["tool_calls"]]
    older["children"] = {call_id: _without_spent(child) for call_id, child in recording["children"].items()}
    return older


@pytest.mark.parametrize("unpriced", [False, True], ids=["priced", "unpriced"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_an_exported_recording_keeps_what_each_run_spent_as_its_counters_say(
    store_target: str, driver: str, unpriced: bool
) -> None:
    """The parent's, the helper's and the deep run's recordings each hold their stored counters' spend: every
    token part, the priced and unpriced model calls, the tool calls, the cost (null where the deep run's model
    was unpriced, up to the parent's)."""
    counts = Counts()
    counts.hold = False
    with open_store(store_target) as store:
        agent = parent_agent(counts, driver, unpriced=unpriced)
        result, _ = driven(agent, driver, "start", store=store, source="go", run_id="p")
        assert result.final == "done"
        assert counts.tools == EVERY_CALL  # nothing cut: each tool call once
        assert counts.child == Counter({"parent": 2, "c1": 5, "deep c1": 4})
        recording = read_recording(store.export("p"))
        helper = recording["children"]["c1"]
        (deep_call,) = helper["children"]
        deep = helper["children"][deep_call]
        deep_id = next(c["result"]["child"]["run_id"] for c in helper["tool_calls"] if c["id"] == deep_call)
        for kept, run_id in ((recording, "p"), (helper, "p/c1"), (deep, deep_id)):
            assert kept["spent"] == spent(store.load(run_id)["counters"])
            assert set(kept["spent"]) == set(SPENT)
    assert recording["spent"]["tool_calls"] == WHOLE
    assert recording["spent"]["priced"] == (2 + 5 if unpriced else 11)
    assert recording["spent"]["unpriced"] == (4 if unpriced else 0)
    assert (recording["spent"]["cost"] is None) is unpriced
    assert (deep["spent"]["cost"] is None) is unpriced


@pytest.mark.parametrize(
    ("spent_value", "named"),
    [
        ("all of it", "recording field spent must be an object of counts, got str"),
        ({"tokens": 3}, "recording field spent has counts a run has not: tokens"),
        ({"input_tokens": -1}, "recording field spent.input_tokens must be a whole number >= 0, got -1"),
        ({"output_tokens": 2.5}, "recording field spent.output_tokens must be a whole number >= 0, got 2.5"),
        ({"priced": True}, "recording field spent.priced must be a whole number >= 0, got True"),
        ({"unpriced": None}, "recording field spent.unpriced must be a whole number >= 0, got None"),
        ({"cost": "0.1"}, "recording field spent.cost must be US dollars >= 0 or null, got '0.1'"),
        ({"cost": -0.5}, "recording field spent.cost must be US dollars >= 0 or null, got -0.5"),
        ({"cost": float("inf")}, "recording field spent.cost must be US dollars >= 0 or null, got inf"),
    ],
)
def test_a_recording_whose_spent_is_malformed_is_refused_naming_the_field(
    tmp_path: Path, spent_value: Any, named: str
) -> None:
    """Each malformed ``spent``, at the top and in a nested sub-agent's recording, is a ``RecordingError`` naming
    the field (and the call whose run it is); a well-formed one, a null cost, or none at all is read."""
    counts = Counts()
    counts.hold = False
    with open_store(str(tmp_path / "runs.db")) as store:
        result, _ = driven(parent_agent(counts, "sync"), "sync", "start", store=store, source="go", run_id="p")
        assert result.final == "done"
        assert counts.tools == EVERY_CALL
        top = store.export("p")
        assert read_recording(copy.deepcopy(top))["spent"] == spent(store.load("p")["counters"])
    child = top["children"]["c1"]
    for where, bad in (
        ("", {**top, "spent": spent_value}),
        ("c1", {**top, "children": {"c1": {**child, "spent": spent_value}}}),
    ):
        with pytest.raises(RecordingError) as caught:
            read_recording(copy.deepcopy(bad))
        assert named in str(caught.value)
        assert (f"the recording of sub-agent call {where!r}" in str(caught.value)) is bool(where)
    read_recording({**top, "spent": {**top["spent"], "cost": None}})
    read_recording(_without_spent(top))


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_of_a_recording_exported_before_spent_was_kept_counts_what_each_outcome_brought(
    store_target: str, driver: str
) -> None:
    """A stored cut source's recording with no ``spent`` at any level, forked just after ``c1``'s answer: its
    tokens, dollars and model calls are the parent's reply's and what the outcome brought (a cut's share short of
    the source, as before ``spent``), its tool calls the whole run's; it ran no tool, asked no sub-agent's model."""
    counts = Counts()
    with open_store(store_target) as store:
        seen = stored_cut_then_finished(counts, driver, store)
        recording = _without_spent(store.export("p"))
    at = answered_at(recording)
    fork_seen = forked_from(counts, driver, recording, at)
    reply = recording["model_calls"][0]["reply"]["usage"]
    brought = recording["tool_calls"][0]["result"]["child"]
    rebuilt, source = spent(fork_seen[at]), spent(seen[at])
    for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
        assert rebuilt[name] == reply[name] + brought[name] < source[name]
    priced = PRICES["parent"].cost(Usage(**{k: v for k, v in reply.items() if k != "cost"}))  # priced as rebuilt
    assert rebuilt["cost"] == pytest.approx(priced + brought["cost"], rel=0, abs=1e-12)
    assert rebuilt["cost"] < source["cost"]
    assert rebuilt["priced"] == 1 + brought["priced_calls"] < source["priced"]
    assert rebuilt["tool_calls"] == source["tool_calls"] == WHOLE
