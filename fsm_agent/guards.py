"""Guards: small named predicates over a run; their names are the edge labels of the machine.

Each stop guard has an evidence function of the same reason in ``EVIDENCE``,
called once when the run enters ``Failed`` to explain the stop with the
counters that made the guard true.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fsm_agent.run import Run, signature

Guard = Callable[[Run], bool]


def is_truncated(run: Run) -> bool:
    """The model's output hit its length limit (``stop_reason == "max_tokens"``), so the reply is incomplete."""
    return run.last_response is not None and run.last_response.stop_reason == "max_tokens"


def is_refusal(run: Run) -> bool:
    """The provider refused or filtered the reply (``stop_reason == "refusal"``), so it is not an answer."""
    return run.last_response is not None and run.last_response.stop_reason == "refusal"


def has_no_tool_calls(run: Run) -> bool:
    """The assistant message asks for no tool: its text is the final answer."""
    return run.last_response is not None and not run.last_response.message.tool_calls


def repeats_last_call(run: Run) -> bool:
    """The next tool call has the same name and arguments as the call executed just before it."""
    return run.last_signature is not None and signature(run.pending[0]) == run.last_signature


def failures_exhausted(run: Run) -> bool:
    """``max_consecutive_failures`` tool calls in a row failed."""
    return run.failures >= run.limits.max_consecutive_failures


def has_pending_calls(run: Run) -> bool:
    """More tool calls of the current model turn wait to be dispatched."""
    return bool(run.pending)


def steps_exhausted(run: Run) -> bool:
    """``max_steps`` model turns were taken, so the next model call must not be made."""
    return run.turns >= run.limits.max_steps


def _step(run: Run) -> int:
    return max(run.turns - 1, 0)


def model_error_evidence(run: Run) -> dict[str, Any]:
    """The model call's exception, by type and message."""
    exc = run.model_exception
    return {"error": str(exc), "type": type(exc).__name__}


def max_tokens_evidence(run: Run) -> dict[str, Any]:
    """How much of the cut-off reply arrived (the text itself is ``result.final``)."""
    message = run.last_response.message if run.last_response is not None else None
    return {
        "stop_reason": "max_tokens",
        "partial_chars": len(message.content) if message else 0,
        "cut_tool_calls": len(message.tool_calls) if message else 0,
    }


def refusal_evidence(run: Run) -> dict[str, Any]:
    """What the provider said instead of answering (also kept as ``result.final``)."""
    message = run.last_response.message if run.last_response is not None else None
    return {"stop_reason": "refusal", "content": message.content if message else ""}


def repeated_action_evidence(run: Run) -> dict[str, Any]:
    """The repeated call's signature and id."""
    call = run.pending[0]
    name, arguments = signature(call)
    return {"signature": {"name": name, "arguments": arguments}, "tool_call_id": call.id}


def tool_failures_evidence(run: Run) -> dict[str, Any]:
    """The failure count against its limit and the last error."""
    return {"failures": run.failures, "limit": run.limits.max_consecutive_failures, "last_error": run.last_error}


def max_steps_evidence(run: Run) -> dict[str, Any]:
    """Turns taken against the limit."""
    return {"turns": run.turns, "limit": run.limits.max_steps}


EVIDENCE: dict[str, Callable[[Run], dict[str, Any]]] = {
    "model_error": model_error_evidence,
    "max_tokens": max_tokens_evidence,
    "refusal": refusal_evidence,
    "repeated_action": repeated_action_evidence,
    "tool_failures": tool_failures_evidence,
    "max_steps": max_steps_evidence,
}


def evidence_for(run: Run, reason: str) -> dict[str, Any]:
    """The JSON-serialisable evidence of a stop: the reason's own facts plus the step index."""
    build = EVIDENCE.get(reason)
    facts = build(run) if build is not None else {}
    return {"step": _step(run), **facts}
