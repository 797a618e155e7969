"""The snapshot's ``cut_children``, ``cut_counted``, ``cut_shares`` and ``cuts_taken_back``: what cut sub-agent runs
had spent, what the cuts counted, each cut's share where it was counted, and where a fork took them back.

docs/concepts/snapshots.md: ``cut_children`` is what the run of each
sub-agent call cut in flight had spent, ``cut_counted`` what every cut of
the call counted, added up.  Both survive a store and a resume in another
process, so a later outcome of the call adds only the rest and its exchange
keeps what the cuts counted; a snapshot from before either existed loads
with none; a tampered count is refused, naming the entry (a negative one
would let the call's outcome add more than its child spent).  Each cut's
share is kept with the number of transitions before it, so a replay or a
fork's rebuild counts it again there; a fork keeps where it took back what
cuts counted of calls unanswered at its fork point.  Both survive a resume
and a recording too; a snapshot or recording from before them has none.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, SnapshotError, ToolRegistry, Usage
from fsm_agent.persist.recording import recording_of
from fsm_agent.persist.recording_format import RecordingError, read_recording
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

SPENT = {
    "run_id": "p/c1",
    "input_tokens": 500,
    "output_tokens": 50,
    "stop": None,
    "tool_calls": 1,
    "cost": 0.00055,
    "cache_read_tokens": 0,
    "cache_write_tokens": 0,
    "reasoning_tokens": 0,
    "priced_calls": 1,
    "unpriced_calls": 0,
}


def _agent(*script: Any) -> Agent:
    """An agent whose model answers ``script`` (by default: one call of ``look``, then an answer)."""
    tools = ToolRegistry()

    def look(text: str) -> str:
        """Look it up."""
        return text

    tools.register(look)
    script = script or (tool_turn(tool_call("look", id="k1", text="a"), usage=Usage(3, 1)), reply("done"))
    return Agent(FakeModel(list(script)), tools, max_steps=1)


def _stopped() -> dict[str, Any]:
    """A run stopped on ``max_steps`` before its next model call: resumable with a larger ``max_steps``."""
    with pytest.raises(AgentLoopError) as stop:
        _agent().run("q")
    data = stop.value.result.snapshot
    assert data is not None
    return data


FIELDS = ["cut_children", "cut_counted"]


@pytest.mark.parametrize("field", FIELDS)
def test_what_a_cut_child_spent_survives_a_resume_and_the_next_snapshot(field: str) -> None:
    data = _stopped()
    assert data[field] == {}
    data[field] = {"c1": SPENT}
    run = _agent().resume(data, max_steps=5)
    assert run.snapshot()[field] == {"c1": SPENT}


@pytest.mark.parametrize(("cost", "calls"), [(0.00055, (1, 0)), (None, (0, 1)), (0.0, (0, 0))])
def test_a_cut_child_kept_before_its_model_calls_were_counted_is_one_call(
    cost: float | None, calls: tuple[int, int]
) -> None:
    """An entry without ``priced_calls`` and ``unpriced_calls`` loads as one call of its cost, as it counted then."""
    data = _stopped()
    older = {key: value for key, value in SPENT.items() if key not in ("priced_calls", "unpriced_calls")}
    data["cut_children"] = {"c1": {**older, "cost": cost}}
    kept = _agent().resume(data, max_steps=5).snapshot()["cut_children"]["c1"]
    assert (kept["priced_calls"], kept["unpriced_calls"]) == calls


@pytest.mark.parametrize("field", FIELDS)
def test_a_snapshot_from_before_the_field_loads_with_none(field: str) -> None:
    data = _stopped()
    del data[field]
    run = _agent(reply("done")).resume(data, max_steps=5)
    assert run.snapshot()[field] == {}
    assert run.finish().final == "done"


BAD = {
    "negative tokens": ({**SPENT, "input_tokens": -500}, r"{field}\['c1'\]\.input_tokens must be a whole number"),
    "fractional calls": ({**SPENT, "tool_calls": 0.5}, r"{field}\['c1'\]\.tool_calls must be a whole number"),
    "negative priced calls": ({**SPENT, "priced_calls": -1}, r"{field}\['c1'\]\.priced_calls must be a whole number"),
    "negative cost": ({**SPENT, "cost": -1.0}, r"{field}\['c1'\]\.cost must be None or a finite number"),
    "a stop": ({**SPENT, "stop": {"reason": "timeout"}}, r"{field}\['c1'\] must name its run and no stop"),
    "an unknown key": ({**SPENT, "tokens": 1}, "unexpected keyword argument 'tokens'"),
    "not an object": ([500, 50], "{field} must map call ids to what their sub-agent runs spent"),
}


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize(("entry", "message"), BAD.values(), ids=BAD)
def test_a_tampered_entry_is_a_snapshot_error_naming_it(field: str, entry: Any, message: str) -> None:
    data = _stopped()
    data[field] = {"c1": entry}
    with pytest.raises(SnapshotError, match=message.format(field=field)):
        _agent().resume(data, max_steps=5)


@pytest.mark.parametrize("field", FIELDS)
def test_a_field_that_is_no_object_is_a_snapshot_error(field: str) -> None:
    data = _stopped()
    data[field] = ["c1"]
    with pytest.raises(SnapshotError, match=f"{field} must map call ids"):
        _agent().resume(data, max_steps=5)


def test_each_share_and_where_cuts_were_taken_back_survive_a_resume_and_a_recording() -> None:
    data = _stopped()
    assert (data["cut_shares"], data["cuts_taken_back"]) == ([], [])
    data["cut_shares"], data["cuts_taken_back"] = [[2, "k1", SPENT]], [3]
    run = _agent(reply("done")).resume(data, max_steps=5)
    kept = run.snapshot()
    assert (kept["cut_shares"], kept["cuts_taken_back"]) == ([[2, "k1", SPENT]], [3])
    recorded = read_recording(recording_of(kept, {}))
    assert (recorded["cut_shares"], recorded["cuts_taken_back"]) == ([[2, "k1", SPENT]], [3])


def test_a_snapshot_from_before_the_fields_loads_with_none_and_records_none() -> None:
    data = _stopped()
    del data["cut_shares"], data["cuts_taken_back"]
    run = _agent(reply("done")).resume(data, max_steps=5)
    assert (run.snapshot()["cut_shares"], run.snapshot()["cuts_taken_back"]) == ([], [])
    assert run.finish().final == "done"
    assert "cut_shares" not in recording_of(data, {})  # its answers bring what the cuts counted, as before


BAD_SPENTS = {
    "not a list": ({"k1": SPENT}, r"cut_shares must list \[transitions before it, call id, share\] triples"),
    "a pair": ([[2, "k1"]], r"cut_shares must list \[transitions before it, call id, share\] triples"),
    "a negative point": ([[-1, "k1", SPENT]], r"cut_shares\[0\] must be \[transitions before it \(>= 0\)"),
    "a point that is no number": ([["2", "k1", SPENT]], r"cut_shares\[0\] must be \[transitions before it"),
    "no call id": ([[2, 7, SPENT]], r"cut_shares\[0\] must be \[transitions before it"),
    "negative tokens": ([[2, "k1", {**SPENT, "input_tokens": -5}]], r"cut_shares\[0\]\.input_tokens must be a whole"),
    "a stop": ([[2, "k1", {**SPENT, "stop": {"reason": "x"}}]], r"cut_shares\[0\] must name its run and no stop"),
    "an unknown key": ([[2, "k1", {**SPENT, "tokens": 1}]], r"cut_shares\[0\]: .*unexpected keyword argument"),
}


@pytest.mark.parametrize(("value", "message"), BAD_SPENTS.values(), ids=BAD_SPENTS)
def test_a_tampered_share_is_a_snapshot_error_and_a_recording_error_naming_it(value: Any, message: str) -> None:
    data = _stopped()
    recording = recording_of(data, {})
    data["cut_shares"] = value
    with pytest.raises(SnapshotError, match=f"snapshot field {message}"):
        _agent().resume(data, max_steps=5)
    bad = {**copy.deepcopy(recording), "cut_shares": value}
    with pytest.raises(RecordingError, match=f"recording field {message}"):
        read_recording(bad)


@pytest.mark.parametrize("value", [[-1], ["3"], [True], {"at": 3}], ids=["negative", "text", "bool", "object"])
def test_a_tampered_point_taken_back_is_a_snapshot_error(value: Any) -> None:
    data = _stopped()
    data["cuts_taken_back"] = value
    with pytest.raises(SnapshotError, match=r"cuts_taken_back must list numbers of transitions \(>= 0\)"):
        _agent().resume(data, max_steps=5)


@pytest.mark.parametrize("field", ["cut_shares", "cuts_taken_back"])
def test_a_point_past_the_trace_contradicts_the_snapshot(field: str) -> None:
    data = _stopped()
    past = len(data["trace"]) + 1
    data[field] = [[past, "k1", SPENT]] if field == "cut_shares" else [past]
    with pytest.raises(SnapshotError, match=rf"name transitions \[{past}\], past the trace's {past - 1}"):
        _agent().resume(data, max_steps=5)
