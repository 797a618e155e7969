"""What ``check`` says of a bare table, of a per-tool cap's open bound, and of a limit it does not know."""

from __future__ import annotations

import pytest
from support.proof_audit import ended, ending

from fsm_agent import TABLE, Agent
from fsm_agent.proof import check
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_table_is_not_refuted_by_a_real_run_of_an_agent_on_it(driver: str) -> None:
    """An agent with the default limits walks TABLE itself; under a finalize policy its run ends on
    finalize_failed, so check(TABLE) must not call that reason unreachable (nor its row dead)."""
    script = (
        tool_turn(tool_call("add", a=1, b=1), tool_call("add", a=1, b=1)),  # the second repeats the first
        tool_turn(tool_call("add", a=2, b=2)),  # the finalize call asks for a tool anyway
    )
    agent = Agent(FakeModel(*script), demo_registry(), on_stop={"repeated_action": "finalize"})
    assert agent.settings.table is TABLE
    result = ended(agent, driver)
    assert ending(result) == "finalize_failed"
    proof = check(TABLE)
    assert "finalize_failed" in proof.reachable
    assert result.trace[-1] not in {row.entry for row in proof.dead_rows}


def test_a_table_is_checked_under_every_policy_an_agent_may_set() -> None:
    """Compaction and finalize calls are parts an agent on the table may have: their rows are not dead, the stops
    they answer stay reachable too (another agent ends on them), and the bound counts the finalize call."""
    proof = check(TABLE, max_steps=3)
    dead = {row.guard_name for row in proof.dead_rows}
    assert "compacts_history" not in dead
    assert "finalize_on_max_steps" not in dead
    assert {"finalize_failed", "max_steps", "context_overflow"} <= set(proof.reachable)
    assert proof.model_calls == 3 + 1


def test_the_same_run_is_within_the_agents_own_proof() -> None:
    """Checked as the agent it is (its policy read), the same ending is reachable."""
    script = (
        tool_turn(tool_call("add", a=1, b=1), tool_call("add", a=1, b=1)),
        tool_turn(tool_call("add", a=2, b=2)),
    )
    agent = Agent(FakeModel(*script), demo_registry(), on_stop={"repeated_action": "finalize"})
    proof = check(agent)
    result = ended(agent, "sync")
    assert ending(result) in proof.reachable
    assert result.reason == "repeated_action"
    assert "repeated_action" in proof.unreachable  # the policy finalizes instead of ending on it


def test_the_open_bound_note_names_what_would_close_it() -> None:
    """A per-tool cap leaves the bound open; the note must point at the total cap, not the setting already set."""
    proof = check(Agent(FakeModel(), demo_registry(), max_tool_calls={"add": 1}))
    assert proof.bound is None
    (note,) = proof.notes
    assert "*" in note or "total" in note, note


def test_a_total_cap_closes_the_bound() -> None:
    """The same agent with a total cap ('*'): a bound in transitions, no note."""
    proof = check(Agent(FakeModel(), demo_registry(), max_tool_calls={"add": 1, "*": 3}))
    assert proof.bound is not None
    assert proof.notes == ()


def test_an_unknown_limit_override_is_named_with_the_limits_check_takes() -> None:
    """``check(agent, max_step=3)`` (a typo): the error names the keyword and the limits there are."""
    with pytest.raises((TypeError, ValueError)) as raised:
        check(Agent(FakeModel(reply("x")), demo_registry()), max_step=3)
    message = str(raised.value)
    assert "max_step" in message
    assert "max_steps" in message
    assert "Limits.__init__" not in message
