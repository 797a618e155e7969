"""The snapshot's ``cut_children`` and ``cut_counted``: what cut sub-agent runs had spent, what the cuts counted.

docs/concepts/snapshots.md: ``cut_children`` is what the run of each
sub-agent call cut in flight had spent, ``cut_counted`` what every cut of
the call counted, added up.  Both survive a store and a resume in another
process, so a later outcome of the call adds only the rest and its exchange
keeps what the cuts counted; a snapshot from before either existed loads
with none; a tampered count is refused, naming the entry (a negative one
would let the call's outcome add more than its child spent).
"""

from __future__ import annotations

from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, SnapshotError, ToolRegistry, Usage
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
