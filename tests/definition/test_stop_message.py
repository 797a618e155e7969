"""What ``str(AgentLoopError)`` says: the reason, the model turn it stopped in, the evidence in one line.

"Step" means one model turn wherever a person reads it, as ``max_steps``
counts them; the message numbers the turn from 1, as the counters do.
"""

from __future__ import annotations

import pytest

import fsm_agent
from fsm_agent import AgentLoopError, ToolCall
from fsm_agent.testing import CounterModel, LoopingModel, demo_registry


def test_a_max_steps_stop_names_the_turn_it_counted_last() -> None:
    """Stopped after three turns by max_steps=3: "in model turn 3", beside turns=3, never "step 2"."""
    with pytest.raises(AgentLoopError) as info:
        fsm_agent.run(CounterModel(), demo_registry(), "count", max_steps=3)
    assert str(info.value) == "max_steps in model turn 3: turns=3, limit=3"
    assert info.value.evidence["step"] == 2  # the evidence keeps the turn's index, as Step.index does


def test_a_repeated_call_names_the_turn_that_repeated_it() -> None:
    """The second turn asks for the first turn's call again: the stop is in model turn 2."""
    same = ToolCall(id="c1", name="echo", arguments={"text": "ping"})
    with pytest.raises(AgentLoopError) as info:
        fsm_agent.run(LoopingModel(same), demo_registry(), "loop", max_steps=8)
    assert str(info.value).startswith("repeated_action in model turn 2: signature=")
