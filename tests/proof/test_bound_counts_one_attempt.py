"""``Proof.bound`` counts one attempt: a resumed run keeps its trace, and each attempt stays within the bound."""

from __future__ import annotations

from support.proof_audit import ByTurn

from fsm_agent import Agent, AgentLoopError, CancelToken
from fsm_agent.proof import check
from fsm_agent.records import RunResult
from fsm_agent.testing import demo_registry, edge_id, reply, tool_call, tool_turn


def _finished(run: object) -> RunResult:
    try:
        return run.finish()  # type: ignore[attr-defined,no-any-return]
    except AgentLoopError as stop:
        return stop.result


def test_each_attempt_of_a_run_cancelled_and_resumed_stays_within_the_bound() -> None:
    """A run whose token is cancelled before its first model call, resumed with a fresh token (no limit changes),
    again and again: each cancel and resume adds two edges and no call, so the whole trace passes ``bound``; each
    attempt (from the start, or after its ``resume`` edge) stays within it, and the calls within ``model_calls``."""
    model = ByTurn(lambda n: tool_turn(tool_call("echo", text="a")) if n < 1 else reply("done"))
    agent = Agent(model, demo_registry(), max_steps=2)
    proof = check(agent, calls_per_reply=1)
    assert proof.ok
    assert proof.bound is not None
    assert proof.model_calls is not None

    token = CancelToken()
    token.cancel("before the first call")
    result = _finished(agent.start("q", cancel=token))
    for _ in range(proof.bound):
        token = CancelToken()
        run = agent.resume(result, cancel=token)  # a fresh token lifts the cancel: the limits are the agent's own
        token.cancel("again, before the first call")
        result = _finished(run)
    result = _finished(agent.resume(result, cancel=CancelToken()))

    shown = [edge_id(edge) for edge in result.trace]
    assert result.reason == "done", shown
    assert model.calls <= proof.model_calls
    resumes = [i for i, edge in enumerate(result.trace) if edge.trigger == "resume"]
    starts, ends = [0, *(i + 1 for i in resumes)], [*resumes, len(result.trace)]
    attempts = [end - start for start, end in zip(starts, ends, strict=True)]
    assert len(attempts) == proof.bound + 2
    assert max(attempts) <= proof.bound, shown
    assert len(result.trace) > proof.bound  # the whole trace does not: bound counts one attempt
