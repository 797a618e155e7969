"""The stop paths ``check`` proves for guardrail stop conditions (``at="input"``, ``at="answer"``), driven through
the engine by ``proof.driving.exercise`` (what ``python -m fsm_agent check`` prints and ``--write-tests`` writes)."""

from __future__ import annotations

import pytest
from support.proof_audit import ended, ending

from fsm_agent import Agent, StopCondition
from fsm_agent.cli.stop_tests import plans
from fsm_agent.definition.views import RunView
from fsm_agent.proof import check
from fsm_agent.proof.driving import exercise
from fsm_agent.testing import FakeModel, demo_registry, edge_id, reply


def refused_question(view: RunView) -> bool:
    """The question is refused."""
    return False


def refused_answer(view: RunView) -> bool:
    """The answer is refused."""
    return False


def _agent(at: str) -> Agent:
    check_of = refused_question if at == "input" else refused_answer
    return Agent(
        FakeModel(reply("fine")), demo_registry(), max_steps=2, stop_conditions=[StopCondition("bad", at, check_of)]
    )


@pytest.mark.parametrize("at", ["input", "answer"])
def test_the_proven_guardrail_path_is_one_a_real_run_takes(at: str) -> None:
    """The proof's shortest path to the guardrail's stop is the path a run whose check says yes really takes."""
    proof = check(_agent(at))
    path = [edge_id(edge) for edge in proof.paths["bad"].edges]

    def yes(view: RunView) -> bool:
        """Says yes."""
        return True

    tripped = Agent(
        FakeModel(reply("fine")), demo_registry(), max_steps=2, stop_conditions=[StopCondition("bad", at, yes)]
    )
    result = ended(tripped, "sync")
    assert ending(result) == "bad"
    assert [edge_id(edge) for edge in result.trace] == path


@pytest.mark.parametrize("at", ["input", "answer"])
def test_the_stop_path_driver_takes_a_guardrails_proven_path(at: str) -> None:
    """``exercise`` drives the guardrail's path as proven, and names no fault in it."""
    agent = _agent(at)
    driven = exercise(agent, plans(check(agent)))
    assert "bad" in driven.taken, driven.left_out.get("bad")
    assert "bad" not in driven.left_out
