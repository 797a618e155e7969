"""The evidence of each built-in stop: the facts a run hands over when it stops, and the limits they judge.

Each function reads the run at the moment of the stop and returns a small
JSON-serialisable dict; its docstring is what the README's reason list says
the evidence holds.  ``definition.stops`` pairs them with their stops.
"""

from __future__ import annotations

import json
from typing import Any

from fsm_agent.definition import guards as g
from fsm_agent.definition.run import Run, signature


def reply_of(run: Run) -> Any:
    return run.talk.last_response.message if run.talk.last_response is not None else None


def model_error(run: Run) -> dict[str, Any]:
    """`error`, `type`: what the model call raised (or why its reply was unusable); `streamed`: the text shown.

    ``streamed`` (only when there is some) is what a streaming model had shown
    of the reply before it broke: the reader saw it, so the stop keeps it.
    """
    exc = run.faults.model_exception
    out = {"error": str(exc), "type": type(exc).__name__}
    if run.faults.streamed:
        out["streamed"] = run.faults.streamed
    return out


def cancelled(run: Run) -> dict[str, Any]:
    """`why` (the text given to `cancel()`), `state` the run was leaving, the `unfinished` call cut off, `streamed`."""
    # No text given: said by what cancelled it, the token (``cancel()``) or the task running the run.
    told = "its cancel token was cancelled, with no reason given" if run.counts.cancelled else ""
    out: dict[str, Any] = {"why": run.counts.cancel_why or told or "the task running the run was cancelled"}
    out["state"] = str(run.at.trace[-1].source)
    return _cut(run, out)


def timeout(run: Run) -> dict[str, Any]:
    """`elapsed` against `timeout`, in seconds, and the `unfinished` call the deadline cut off, if any; `streamed`."""
    out: dict[str, Any] = {"elapsed": run.counts.seconds, "timeout": run.limits.timeout}
    return _cut(run, out)


def _cut(run: Run, out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with the call a stop cut off, if any, and the text a streaming model had shown of it."""
    if run.at.unfinished is not None:
        out["unfinished"] = run.at.unfinished
        if run.faults.streamed:
            out["streamed"] = run.faults.streamed
    return out


def hook_error(run: Run) -> dict[str, Any]:
    """`error`, `type`: the hook's exception (also the `AgentLoopError`'s `__cause__`)."""
    return {"error": str(run.faults.hook_error), "type": type(run.faults.hook_error).__name__}


def condition_error(run: Run) -> dict[str, Any]:
    """`condition`, `error`, `type`: which check raised and what (also the `AgentLoopError`'s `__cause__`)."""
    exc = run.faults.condition_error
    return {"condition": run.faults.condition_name, "error": str(exc), "type": type(exc).__name__}


def max_tokens(run: Run) -> dict[str, Any]:
    """`stop_reason` (`max_tokens`); `partial_chars`, `cut_tool_calls`: how much arrived; the text is `result.final`.

    ``stop_reason`` is the reply's ``ModelResponse.stop_reason``, the one
    that made it a stop (as in ``refusal``'s evidence).
    """
    message = reply_of(run)
    return {
        "stop_reason": "max_tokens",
        "partial_chars": len(message.content) if message else 0,
        "cut_tool_calls": len(message.tool_calls) if message else 0,
    }


def refusal(run: Run) -> dict[str, Any]:
    """`stop_reason` (`refusal`); `content`: what the provider said instead of answering (also `result.final`)."""
    message = reply_of(run)
    return {"stop_reason": "refusal", "content": message.content if message else ""}


def finalize_failed(run: Run) -> dict[str, Any]:
    """`tool_calls`: the tools the finalize reply asked for anyway."""
    return {"tool_calls": [call.name for call in run.calls.pending]}


def repeated_action(run: Run) -> dict[str, Any]:
    """`signature` (`name`, canonical `arguments`) and `tool_call_id` of the call not made."""
    call = run.calls.pending[0]
    name, arguments = signature(call)
    return {"signature": {"name": name, "arguments": arguments}, "tool_call_id": call.id}


def max_tool_calls(run: Run) -> dict[str, Any]:
    """`tool`, `scope` (the tool's own cap or `*`), `used` against `limit`."""
    name = run.calls.pending[0].name
    scope, used, cap = g.cap_reached(run, name) or ("*", run.counts.tool_calls, 0)
    return {"tool": name, "scope": scope, "used": used, "limit": cap}


def tool_failures(run: Run) -> dict[str, Any]:
    """`failures` against `limit`, and `last_error`."""
    return {
        "failures": run.counts.failures,
        "limit": run.limits.max_consecutive_failures,
        "last_error": run.talk.last_error,
    }


def _decoded(name: str, arguments: str) -> dict[str, Any]:
    try:
        decoded = json.loads(arguments)
    except ValueError:
        decoded = arguments
    return {"name": name, "arguments": decoded}


def cycle(run: Run) -> dict[str, Any]:
    """`period`, `calls` (one period of the cycle, name and arguments) and `window`."""
    period = g.find_cycle(run.counts.recent)
    calls = [_decoded(*sig) for sig, _ in list(run.counts.recent)[-period:]]
    return {"period": period, "calls": calls, "window": run.limits.cycle_window}


def token_budget(run: Run) -> dict[str, Any]:
    """`tokens` against `budget`, split into `input_tokens` and `output_tokens`."""
    return {
        "tokens": run.counts.tokens,
        "budget": run.limits.token_budget,
        "input_tokens": run.counts.input_tokens,
        "output_tokens": run.counts.output_tokens,
    }


def cost_budget(run: Run) -> dict[str, Any]:
    """`cost` against `budget`, in US dollars; `priced_calls`, and `unpriced_calls` (their cost unknown)."""
    return {
        "cost": run.counts.cost,
        "budget": run.limits.cost_budget,
        "priced_calls": run.counts.priced,
        "unpriced_calls": run.counts.unpriced,
    }


def max_steps(run: Run) -> dict[str, Any]:
    """`turns` against `limit`."""
    return {"turns": run.counts.turns, "limit": run.limits.max_steps}


def child_stopped(run: Run) -> dict[str, Any]:
    """`child_run_id`, and the child's `reason` and `evidence`."""
    return dict(run.calls.child_stop or {})
