"""How a run ends: its reason, evidence and final text on entering ``Done`` or ``Failed``, and its result.

A finalize call changes what a run's end means: a ``Done`` after one is the
stop that asked for it, answered; a ``Failed`` after one keeps that stop as
the reason and says in the evidence how the last call went.
"""

from __future__ import annotations

from typing import Any

from fsm_agent.core.approval import awaiting
from fsm_agent.core.ledger import held_back, record_leftovers
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import Done
from fsm_agent.definition.stops import CONDITION_ERROR
from fsm_agent.records import RunResult, Step, ToolCall


def evidence_for(run: Run, reason: str) -> dict[str, Any]:
    """The JSON-serialisable evidence of a stop: the step, the reason's own facts, the counters."""
    stop = run.table_stops.get(reason)
    facts = stop.evidence(run) if stop is not None else {}
    return {"step": max(run.counts.turns - 1, 0), **facts, "counters": run.counters()}


def conclude(run: Run) -> None:
    """Set the reason, evidence and final text of a run that just entered ``Done`` or ``Failed``."""
    if run.at.state is Done:
        run.at.final = run.talk.last_response.message.content if run.talk.last_response is not None else ""
        run.talk.steps.append(Step(run.counts.turns - 1, "final", run.at.final, run.counters(), 0, run.talk.sent))
        if run.at.finalizing is None:
            run.at.reason = "done"
        else:
            run.at.reason = run.at.finalizing
            run.at.evidence = {**run.at.finalize_evidence, "finalize": {"outcome": "answered"}}
        return
    edge_reason = run.at.trace[-1].reason or "unknown"
    evidence = evidence_for(run, edge_reason)
    also_ran = record_leftovers(run)
    if also_ran:
        evidence["also_ran"], evidence["counters"] = also_ran, run.counters()
    came_back = held_back(run)
    if came_back:
        evidence["came_back"] = came_back
    if _keeps_text(run, edge_reason):
        assert run.talk.last_response is not None  # _keeps_text checked it
        run.at.final = run.talk.last_response.message.content
    if run.at.finalizing is None:
        run.at.reason, run.at.evidence = edge_reason, evidence
    else:
        # The stop that forced the finalize stands; the evidence says why the finalize failed.
        evidence.pop("counters", None)
        run.at.reason = run.at.finalizing
        run.at.evidence = {**run.at.finalize_evidence, "finalize": {"outcome": edge_reason, **evidence}}


def _keeps_text(run: Run, reason: str) -> bool:
    """Whether the stop ``reason`` hands the caller the last reply's text as ``final``.

    A stop whose reply is the point (a cut-off or refused reply, an answer a
    guardrail tripped on) keeps it, as does a failed finalize call; so does a
    user's check of an answer that raised, since the answer arrived whole.
    """
    reply = run.talk.last_response
    if reply is None:
        return False
    stop = run.table_stops.get(reason)
    if (stop is not None and stop.keeps_text) or run.at.finalizing is not None:
        return True
    # In Dispatch, over a reply that asks for no tool, only the checks of the answer come before Done.
    return reason == CONDITION_ERROR.reason and run.at.trace[-1].source == "Dispatch" and not reply.message.tool_calls


def make_result(
    run: Run, reason: str, evidence: dict[str, Any], pending: tuple[ToolCall, ...], snapshot: dict[str, Any] | None
) -> RunResult:
    """The run as a frozen result; a stopped or paused run carries its ``snapshot``, enough to continue it."""
    # By position, in RunResult's field order: matching eleven keywords was a quarter of building it.
    output = run.talk.output if run.at.state is Done else None
    if run.calls.ran and pending:  # a call that came back (``held_back``) is not one never run
        pending = tuple(call for call in pending if call.id not in run.calls.ran)
    counts = run.counts
    usage = counts.usage()
    return RunResult(
        run.talk.messages,
        run.talk.steps,
        run.at.final,
        reason,
        run.at.trace,
        evidence,
        usage,
        pending,
        snapshot,
        run.talk.prior,
        output,
    )


def pause_of(run: Run) -> tuple[dict[str, Any], tuple[ToolCall, ...]]:
    """A run paused for a person's decision: the evidence its result gives, and the calls that await one."""
    waiting = tuple(awaiting(run))
    evidence = {"step": max(run.counts.turns - 1, 0), "awaiting": [c.id for c in waiting], "counters": run.counters()}
    return evidence, waiting
