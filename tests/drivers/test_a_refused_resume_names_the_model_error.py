"""A resume refused for a ``model_error`` says what the model call raised, besides how to lift the stop.

The stop's evidence holds it, but a caller resuming from a store or a
snapshot has not seen that stop: without it, "which these limits do not
lift" leaves them to load the evidence to learn what went wrong.
"""

from __future__ import annotations

import pytest

from fsm_agent import Agent, AgentLoopError
from fsm_agent.testing import FakeModel, demo_registry, reply


def test_a_resume_of_a_model_error_without_retry_names_the_error_and_retry() -> None:
    agent = Agent(FakeModel(ConnectionError("provider away"), reply("Back.")), demo_registry())
    with pytest.raises(AgentLoopError) as stop:
        agent.run("q")
    with pytest.raises(ValueError, match=r"'model_error' \(ConnectionError: provider away\)") as refused:
        agent.resume(stop.value.result)
    assert "model_error with retry=True" in str(refused.value)
    assert agent.resume(stop.value.result, retry=True).finish().final == "Back."
