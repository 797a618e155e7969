"""A finalize call that asked for tools leaves them pending: a resume whose limits lift the stop runs each once.

The stop's guard is asked about the run as it stands: the finalize call
was the one model call made past ``max_steps``, so the same limits do not
lift the stop (a ``ValueError``, nothing run); a higher ``max_steps`` does,
and the resumed run makes the pending call before its next model call.
"""

from __future__ import annotations

import pytest

from fsm_agent import Agent, AgentLoopError
from fsm_agent.testing import FakeModel, demo_registry, edges, reply, tool_call, tool_turn


def _stopped() -> tuple[Agent, AgentLoopError, list[str], FakeModel]:
    ran: list[str] = []
    tools = demo_registry()

    @tools.register
    def note(text: str) -> str:
        """Note a text."""
        ran.append(text)
        return text

    model = FakeModel(
        tool_turn(tool_call("note", id="c1", text="one")),
        tool_turn(tool_call("note", id="c2", text="two")),  # the finalize call asks for a tool anyway
        reply("Two notes."),
    )
    agent = Agent(model, tools, max_steps=1, on_stop={"max_steps": "finalize"})
    with pytest.raises(AgentLoopError) as first:
        agent.run("Count.")
    return agent, first.value, ran, model


def test_the_same_limits_do_not_lift_a_stop_whose_finalize_call_asked_for_tools() -> None:
    """``max_steps`` stopped, ``c2`` pending: ``resume`` with the same limits refuses, nothing run."""
    agent, stop, ran, model = _stopped()
    assert (stop.reason, [call.id for call in stop.result.pending]) == ("max_steps", ["c2"])
    with pytest.raises(ValueError, match="which these limits do not lift"):
        agent.resume(stop.result)
    assert (ran, len(model.seen)) == (["one"], 2)


def test_Failed_to_Dispatch_resumes_before_tool_under_a_higher_max_steps_and_runs_the_pending_call_once() -> None:
    """``Failed->Dispatch[resumes_before_tool]``: ``c2`` runs once, then the model answers."""
    agent, stop, ran, model = _stopped()
    result = agent.resume(stop.result, max_steps=3).finish()
    assert (result.reason, result.final) == ("done", "Two notes.")
    assert ran == ["one", "two"]
    assert "Failed->Dispatch[resumes_before_tool]" in edges(result)
    assert len(model.seen) == 3
